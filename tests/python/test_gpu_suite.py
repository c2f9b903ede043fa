#!/usr/bin/env python3
"""bench/gpu_suite.py gives ctest's verdicts, one GPU a test, RUN_SERIAL alone, and resumes a cut run.

A small CMake project of shell-command tests (no compiler) is configured in a temporary folder; ctest runs it, then
gpu_suite.py with two GPUs made up (FA_SUITE_GPUS=2), and every verdict must be ctest's. No GPU is needed.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.join(HERE, "..", "..", "bench", "gpu_suite.py")

# name -> (shell command, properties): each property as CMake's set_tests_properties takes it.
TESTS = {
    "plain pass": ("exit 0", ""),
    "plain fail": ("exit 3", ""),
    "will fail, fails": ("exit 1", "WILL_FAIL TRUE"),
    "will fail, passes": ("exit 0", "WILL_FAIL TRUE"),
    "pass regex across lines": ("printf 'usage: one\\nto the end\\n'; exit 1", 'PASS_REGULAR_EXPRESSION "usage:.*end"'),
    "pass regex absent": ("echo something else", 'PASS_REGULAR_EXPRESSION "not printed"'),
    "fail regex": ("echo 'an ERROR here'", 'FAIL_REGULAR_EXPRESSION "ERROR"'),
    "skip code": ("exit 77", "SKIP_RETURN_CODE 77"),
    "skip code not returned": ("exit 1", "SKIP_RETURN_CODE 77"),
    "skip regex": ("echo 'no CUDA device'; exit 1", 'SKIP_REGULAR_EXPRESSION "no CUDA device"'),
    "environment": ('test "$FA_X" = "a b"', 'ENVIRONMENT "FA_X=a b"'),
    "own timeout": ("sleep 4", "TIMEOUT 1"),
    "working directory": ('test "$(basename "$PWD")" = wd', 'WORKING_DIRECTORY "${CMAKE_BINARY_DIR}/wd"'),
}
# Tests of the GPU handling (ctest itself sets no CUDA_VISIBLE_DEVICES, so these are not compared with it).
GPU_TESTS = {
    "one gpu visible": ('echo "gpu $CUDA_VISIBLE_DEVICES"; case "$CUDA_VISIBLE_DEVICES" in 0|1) exit 0;; esac; exit 1',
                        ""),
    "every gpu visible": ('test -z "${CUDA_VISIBLE_DEVICES+set}"', "LABELS all-gpus"),
    # RUN_SERIAL: alone on its GPU. Each busy test leaves a file named after its GPU while it runs.
    "serial": ('for i in 1 2 3 4 5 6 7 8 9 10 11 12; do ls "$MARKS" | grep -q "^busy-$CUDA_VISIBLE_DEVICES-" && exit 1; '
               'sleep 0.1; done', "RUN_SERIAL TRUE"),
    **{f"busy {i}": ('f="$MARKS/busy-$CUDA_VISIBLE_DEVICES-$$"; touch "$f"; sleep 1; rm -f "$f"', "")
       for i in range(12)},
    "slow": ("sleep 12", ""),
}


def project(folder: str, marks: str) -> str:
    lines = ["cmake_minimum_required(VERSION 3.20)", "project(suite_check NONE)", "enable_testing()",
             'file(MAKE_DIRECTORY "${CMAKE_BINARY_DIR}/wd")']
    for name, (command, props) in {**TESTS, **GPU_TESTS}.items():
        command = command.replace("$MARKS", marks)
        lines.append(f'add_test(NAME "{name}" COMMAND sh -c [=[{command}]=])')
        if props:
            lines.append(f'set_tests_properties("{name}" PROPERTIES {props})')
    src = os.path.join(folder, "src")
    os.makedirs(src)
    with open(os.path.join(src, "CMakeLists.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    build = os.path.join(folder, "build")
    subprocess.run(["cmake", "-S", src, "-B", build], check=True, stdout=subprocess.DEVNULL)
    return build


def ctest_verdicts(build: str) -> dict:
    names = "|".join(re.escape(n) for n in TESTS)
    p = subprocess.run(["ctest", "--test-dir", build, "-R", f"^({names})$", "-j4"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    out = p.stdout.decode()
    verdicts = {}
    for line in out.splitlines():
        m = re.search(r"Test +#\d+: (.+?) \.+ *\**(Passed|Failed|Skipped|Timeout|Not Run)", line)
        if m:
            verdicts[m.group(1)] = {"Passed": "passed", "Skipped": "skipped"}.get(m.group(2), "failed")
    assert len(verdicts) == len(TESTS), out
    return verdicts


def suite(build: str, state: str, *extra) -> tuple[int, str]:
    env = dict(os.environ, FA_SUITE_GPUS="2")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    p = subprocess.run([sys.executable, SUITE, "--build", build, "--state", state, "--per-gpu", "4", *extra],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    return p.returncode, p.stdout.decode()


def results(state: str) -> dict:
    final = {}
    for line in open(os.path.join(state, "results.tsv")):
        name, where, _, verdict = line.rstrip("\n").split("\t")
        final[name] = (verdict, where)
    return final


def main() -> int:
    if not shutil.which("cmake") or not shutil.which("ctest"):
        print("cmake and ctest are needed")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        marks = os.path.join(tmp, "marks")
        os.makedirs(marks)
        build = project(tmp, marks)
        expected = ctest_verdicts(build)
        # A first call stopped by its deadline: `slow` is cut, the rest judged.
        state = os.path.join(tmp, "state")
        rc, out = suite(build, state, "--deadline", "7")
        first = results(state)
        assert first.get("slow", ("",))[0] == "cut", out
        assert rc == 1, f"a failed test makes the exit status 1:\n{out}"
        for name, verdict in expected.items():
            assert first[name][0] == verdict, f"{name}: ctest {verdict}, gpu_suite {first[name][0]}\n{out}"
        assert first["one gpu visible"] == ("passed", first["one gpu visible"][1]), out
        assert first["one gpu visible"][1] in ("0", "1"), first["one gpu visible"]
        assert "every gpu visible" not in first, "the all-gpus test waits for the end, which the deadline cut"
        assert first["serial"][0] == "passed", f"a RUN_SERIAL test ran beside another on its GPU\n{out}"
        assert {first[f"busy {i}"][1] for i in range(12)} == {"0", "1"}, "the queue used both GPUs"
        # The second call runs only what is left: `slow`, then the all-gpus test alone, with every GPU visible.
        rc, out = suite(build, state)
        lines = open(os.path.join(state, "results.tsv")).read().splitlines()
        assert len(lines) == len(first) + 2, out
        assert lines[-2].startswith("slow\t") and lines[-2].endswith("\tpassed"), out
        assert lines[-1].startswith("every gpu visible\tall\t") and lines[-1].endswith("\tpassed"), out
        assert out.splitlines()[0].startswith("2 of "), out
        assert rc == 1, out  # the failures of the first call stand
        # --include: only the chosen tests count, and their exit status is theirs.
        rc, out = suite(build, os.path.join(tmp, "state2"), "--include", "^(plain pass|skip code)$",
                        "--keep-logs", "^plain")
        assert rc == 0 and "suite: 1 passed, 0 failed, 1 skipped, 0 left" in out, out
        # --keep-logs: a passed test's output is kept where its name matches, and only there.
        assert os.listdir(os.path.join(tmp, "state2", "logs")) == ["plain_pass.log"], out
        # Bad arguments: refused by name (exit 2, argparse's), no test run, no results written.
        for extra, named in ((["--build", os.path.join(tmp, "nowhere")], "no CTestTestfile.cmake"),
                             (["--per-gpu", "0"], "--per-gpu 0"), (["--deadline", "-1"], "--deadline -1"),
                             (["--costs", os.path.join(tmp, "none.tsv")], "--costs"),
                             (["--include", "("], "not a regular expression"),
                             (["--keep-logs", "["], "--keep-logs")):
            args = ["--build", build, *extra] if extra[0] != "--build" else extra
            env = dict(os.environ, FA_SUITE_GPUS="2")
            p = subprocess.run([sys.executable, SUITE, "--state", os.path.join(tmp, "state3"), *args],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
            out = p.stdout.decode()
            assert p.returncode == 2 and named in out and "Traceback" not in out, (extra, out)
            assert not os.path.exists(os.path.join(tmp, "state3", "results.tsv")), extra
    print(f"gpu_suite.py: ctest's verdict on {len(TESTS)} property cases, one GPU a test, RUN_SERIAL alone, "
          "a cut run resumed, passed tests' logs kept by name, bad arguments refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
