#!/usr/bin/env python3
"""The grader of the Python steps (steps/python_steps.tsv: 62-64): the step's CPU test (the table's last column) run
with another copy of the step's lesson file in its place (FA_LESSON_DIR, read by context_parallel_numpy.py). The
copies come from fa-patch (tests/fa_patch.cpp), from the same specs as the CUDA steps': an exercise's skeleton and its
completed skeleton (exercises/NN_name/exercise.spec), or a mutant (tests/mutants/*.mutant whose step is a .py file,
caught-by: cpu-test). No GPU, no PyTorch: numpy only.

    python_step_check.py grade NN FILE               step NN's CPU test on FILE (a student's copy); exits as the test
    python_step_check.py exercises FA_PATCH [NN ...]  each exercise's untouched skeleton must fail its step's CPU test
                                                     and its completed skeleton must pass it (every Python step's
                                                     exercise when no NN is given)
    python_step_check.py mutants FA_PATCH [NAME ...]  every Python step's mutant (or those named) must fail its step's
                                                     CPU test; prints each with the test's first failing message

Exit status: 0 as required, 1 otherwise, 2 a wrong command line.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TIMEOUT_S = 300  # the ring's queues time out after 60 s: a copy that never sends fails well within this


def python_steps():
    """{id: (folder, lesson file, CPU test)} from steps/python_steps.tsv."""
    with open(os.path.join(ROOT, "steps", "python_steps.tsv"), encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line[:1].isdigit()]
    return {row[0]: (row[1], row[2], row[5]) for row in rows}


def run_test(step_id, lesson_copy):
    """Step step_id's CPU test with lesson_copy in place of its lesson file: (passed, the first failing message)."""
    folder, lesson, test = python_steps()[step_id]
    with tempfile.TemporaryDirectory(prefix=f"fa-lesson-{step_id}-") as tmp:
        shutil.copyfile(lesson_copy, os.path.join(tmp, lesson))
        env = dict(os.environ, FA_LESSON_DIR=tmp, PYTHONDONTWRITEBYTECODE="1")
        try:
            done = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "python", test)], env=env,
                                  capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return False, f"no answer in {TIMEOUT_S} s (a rank waits for a message that never comes)"
    if done.returncode == 0:
        return True, done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "passed"
    # The exception's last line ("AssertionError: world 2, ...: O off by 1.2"), else whatever came last.
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^\w+(Error|Exception|Warning)\b", line)]
    return False, (errors or lines or [f"exit {done.returncode}"])[-1][:300]


def fa_patch(binary, *args):
    done = subprocess.run([binary, *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"python_step_check: fa-patch {' '.join(args[:1])} failed: {done.stderr.strip()}")


def field(path, key):
    with open(path, encoding="utf-8") as f:
        m = re.search(rf"^{key}:\s*(.*)$", f.read(), re.M)
    return m.group(1).strip() if m else ""


def exercises(binary, ids):
    steps = python_steps()
    ids = ids or sorted(steps)
    bad = 0
    print(f"{'exercise':<20} {'untouched skeleton (must fail)':<60} completed skeleton (must pass)")
    for sid in ids:
        specs = glob.glob(os.path.join(ROOT, "exercises", f"{sid}_*", "exercise.spec"))
        if sid not in steps or not specs:
            sys.exit(f"python_step_check: no Python step's exercise {sid!r}; the Python steps are {', '.join(steps)}")
        name = os.path.basename(os.path.dirname(specs[0]))
        with tempfile.TemporaryDirectory(prefix=f"fa-exercise-{sid}-") as tmp:
            skeleton, solution = os.path.join(tmp, "skeleton.py"), os.path.join(tmp, "solution.py")
            fa_patch(binary, "skeleton", specs[0], os.path.join(ROOT, "steps"), skeleton)
            fa_patch(binary, "fill", specs[0], skeleton, solution, "--as-exercise")
            s_passed, s_message = run_test(sid, skeleton)
            c_passed, c_message = run_test(sid, solution)
        bad += s_passed or not c_passed
        print(f"{name:<20} {'fails: ' + ('no' if s_passed else 'yes') + ' (' + s_message[:48] + ')':<60} "
              f"passes: {'yes' if c_passed else 'no'} ({c_message[:60]})")
    print("SOME EXERCISES ARE WRONG" if bad else "every skeleton fails untouched and passes completed")
    return 1 if bad else 0


def mutants(binary, names):
    steps = python_steps()
    specs = [p for p in sorted(glob.glob(os.path.join(ROOT, "tests", "mutants", "*.mutant")))
             if field(p, "step").endswith(".py")]
    if names:
        unknown = set(names) - {os.path.basename(p)[:-len(".mutant")] for p in specs}
        if unknown:
            sys.exit(f"python_step_check: no Python step's mutant {', '.join(sorted(unknown))}")
        specs = [p for p in specs if os.path.basename(p)[:-len(".mutant")] in names]
    bad = 0
    print(f"{'mutant':<32} {'step':<5} first failing message of the step's CPU test")
    for spec in specs:
        name, sid = os.path.basename(spec)[:-len(".mutant")], field(spec, "step")[:2]
        if field(spec, "caught-by") != "cpu-test" or sid not in steps:
            print(f"{name:<32} {sid:<5} WRONG: a Python step's mutant is caught-by: cpu-test, of a step in "
                  "steps/python_steps.tsv")
            bad += 1
            continue
        with tempfile.TemporaryDirectory(prefix=f"fa-mutant-{name}-") as tmp:
            copy = os.path.join(tmp, steps[sid][1])
            fa_patch(binary, "mutant", spec, os.path.join(ROOT, "steps"), copy)
            passed, message = run_test(sid, copy)
        bad += passed
        print(f"{name:<32} {sid:<5} {'NOT CAUGHT: the test passed' if passed else message}")
    print(f"{len(specs) - bad} of {len(specs)} mutants of the Python steps rejected by their CPU tests")
    return 1 if bad or not specs else 0


def main(argv):
    if len(argv) == 3 and argv[0] == "grade":
        sid = argv[1].zfill(2)
        if sid not in python_steps():
            sys.exit(f"python_step_check: step {argv[1]} is not a Python step ({', '.join(python_steps())})")
        passed, message = run_test(sid, argv[2])
        print(("passed: " if passed else "failed: ") + message)
        return 0 if passed else 1
    if len(argv) >= 2 and argv[0] == "exercises":
        return exercises(argv[1], [a.zfill(2) for a in argv[2:]])
    if len(argv) >= 2 and argv[0] == "mutants":
        return mutants(argv[1], argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
