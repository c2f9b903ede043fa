#!/usr/bin/env python3
"""tools/check_prose.py finds each kind of wrong claim it claims to, and the repository's prose has none.

    python3 tests/python/test_check_prose.py [build/bench/fa-run]

Plain asserts, no pytest. First the real repository must pass, its facts read from `fa-run --list` when a
built fa-run is given (ctest passes it) and from the step sources otherwise. Then, in a copy of what the
checker reads (the step sources, exercise specs, mutants, recorded CSVs and the prose), one wrong claim at a
time is written into the prose: a range of steps with the wrong GPU, a step table's wrong GPU cell, wrong
dtypes, a count one off, a step past the last, the wrong last step, an edited generated block, an agenda slot
that starts late, a mutant missing from its table, a step table that stops inside a part (also one that stops
before the second run of a part in two runs: the backward's 46). The checker must name each one and exit 1, and
pass again once it is undone (the generated block by --write). With fa-run, a step source that disagrees with the
built registry must be reported too.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CHECKER = os.path.join(ROOT, "tools", "check_prose.py")
FA_RUN = sys.argv[1] if len(sys.argv) > 1 else None
COPIED = ["README.md", "docs/*.md", "notebooks/README.md", "exercises/README.md", "steps/*/*.cu",
          "exercises/*/exercise.spec", "tests/mutants/*.mutant", "docs/results/*.csv"]


def run(root, *args):
    cmd = [sys.executable, CHECKER, "--root", root, *args] + (["--fa-run", FA_RUN] if FA_RUN else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


code, out = run(ROOT)
assert code == 0, f"the repository's prose disagrees with the registry:\n{out}"
assert ("fa-run --list" if FA_RUN else "read from steps/") in out, out

with tempfile.TemporaryDirectory() as tree:
    for pattern in COPIED:
        for path in glob.glob(os.path.join(ROOT, pattern)):
            target = os.path.join(tree, os.path.relpath(path, ROOT))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy(path, target)
    code, out = run(tree)
    assert code == 0, f"the copy must pass as the repository does:\n{out}"

    def wrong(doc, pattern, replacement, expected, count=1):
        """Writes one wrong claim into doc (a regex replaced), requires the checker to report it, undoes it."""
        path = os.path.join(tree, doc)
        with open(path, encoding="utf-8") as f:
            original = f.read()
        changed, n = re.subn(pattern, replacement, original, count=count, flags=re.S)
        assert n, f"the fixture no longer has {pattern!r} in {doc}: update this test"
        with open(path, "w", encoding="utf-8") as f:
            f.write(changed)
        code, out = run(tree)
        with open(path, "w", encoding="utf-8") as f:
            f.write(original)
        assert code == 1, f"{doc}: {pattern!r} -> {replacement!r} must fail the check, got exit {code}:\n{out}"
        assert re.search(expected, out), f"{doc}: expected a report matching {expected!r}, got:\n{out}"
        return out

    wrong("README.md", r"(steps 20-25\s+)sm_90 exactly", r"\1sm_80 or newer",
          r'README\.md:\d+: "steps 20-25 \.\.\. sm_80", but the registry has 20: sm_90a')
    wrong("README.md", r"(steps 01-08 run on any GPU,\s+steps 09-18 need )sm_80", r"\1sm_90",
          r'"steps 09-18 \.\.\. sm_90", but the registry has 09: sm_80')
    wrong("exercises/README.md", r"(Exercises 42-46 are decode \()sm_80 or newer", r"\1sm_90 exactly",
          r'exercises/README\.md:\d+: "exercises 42-46 \.\.\. sm_90 exactly"')
    wrong("docs/instructors.md", r"(\| \[29 vector atomics\][^\n]*\| )sm_90 or newer \|", r"\1sm_80 or newer |",
          r"step 29's GPU is given as \"sm_80 or newer\"; the registry has sm_90")
    wrong("README.md", r"(steps 01-08, 19, 26 and 27 take )f32 and f16", r"\1f16 and bf16",
          r'"steps 01-08, 19, 26-27 \.\.\. f16 and bf16", but the registry has 01: f32, f16')
    wrong("README.md", r"(\d+)( plausible wrong kernels)", lambda m: f"{int(m.group(1)) + 1}{m.group(2)}",
          r'plausible wrong kernels": there are \d+ mutants the harness must reject')
    wrong("docs/instructors.md", r"add up to (\d+) minutes", lambda m: f"add up to {int(m.group(1)) - 5} minutes",
          r"minutes of the exercises' specs")
    past = max(int(os.path.basename(d)[:2]) for d in glob.glob(os.path.join(ROOT, "steps", "[0-9][0-9]_*"))) + 1
    wrong("README.md", r"(## Start here\n)", rf"\1\nStep {past} is where the course ends.\n",
          rf"step {past} does not exist: the last step is \d\d")
    wrong("README.md", r"(…\s+`)step(\d\d)(/…`)", r"\1step13\3", r'"… step13" names step 13 as the last')
    wrong("README.md", r"\| Hopper \(wgmma, TMA\) \|[^\n]*\n", "",
          r"README\.md:\d+: the generated block 'parts' differs from what the registry gives")
    wrong("docs/instructors.md", r"\| 10:40 \| 35 \| exercise \|", "| 10:45 | 35 | exercise |",
          r"starts at 10:45, but the slot before starts at 10:25 and takes 15 min")
    wrong("docs/instructors.md", r"\| 11:15 \| 30 \| lecture \| Step 21", "| 11:15 | 20 | lecture | Step 21",
          r"starts at 11:45, but the slot before starts at 11:15 and takes 20 min")
    wrong("docs/instructors.md", r"\n\| `gqa_modulo` \|[^\n]*", "",
          r"the table has no row for the mutant gqa_modulo")
    wrong("docs/mainpage.md", r"\n\| \[45 [^\n]*", "", r"docs/mainpage\.md:\d+: the table lists steps 42-45")
    # A part in two runs (the backward: 26-40, then 46): its table must reach the second.
    wrong("README.md", r"\n\| \[46 [^\n]*", "", r"README\.md:\d+: the table lists steps 26-40; a part runs .*26-40, 46")

    # --write puts an edited generated block back.
    readme = os.path.join(tree, "README.md")
    with open(readme, encoding="utf-8") as f:
        original = f.read()
    with open(readme, "w", encoding="utf-8") as f:
        f.write(re.sub(r"\| Hopper \(wgmma, TMA\) \|[^\n]*\n", "", original))
    code, out = run(tree, "--write")
    assert code == 0 and "generated blocks rewritten" in out, out
    with open(readme, encoding="utf-8") as f:
        assert f.read() == original, "--write did not give back the block it generates"

    if FA_RUN:  # a step source that says what the built registry does not
        source = os.path.join(tree, "steps", "09_tensor_cores", "tensor_cores.cu")
        with open(source, encoding="utf-8") as f:
            text = f.read()
        with open(source, "w", encoding="utf-8") as f:
            f.write(text.replace("min_arch = 80", "min_arch = 75", 1))
        code, out = run(tree)
        assert code == 1 and "reading the step sources gives Step(id='09'" in out, out

print("check_prose: every wrong claim found in the copy; the repository's prose matches the registry"
      + (" (fa-run --list)" if FA_RUN else " (step sources)"))
