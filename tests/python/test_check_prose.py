#!/usr/bin/env python3
"""tools/check_prose.py finds each kind of wrong claim it claims to, and the repository's prose has none.

    python3 tests/python/test_check_prose.py [build/bench/fa-run]

Plain asserts, no pytest. First the real repository must pass, its facts read from `fa-run --list` when a
built fa-run is given (ctest passes it) and from the step sources otherwise. Then, in a copy of what the
checker reads (the step sources, exercise specs, mutants, recorded CSVs and the prose), one wrong claim at a
time is written into the prose: a range of steps with the wrong GPU, a step table's wrong GPU cell, wrong
dtypes, a count one off, a step past the last, the wrong last step, an edited generated block, an agenda slot
that starts late, a mutant missing from its table, a step table that stops inside a part, a count of all the steps
that is no longer true ("48 steps"), a count of cases for "every step" that says not when, an index example
(`fa_course.steps()[10]`) that names another entry, a table of measured numbers that names no run (in the prose and
in a step's README), and a part that is not contiguous (a step folder renumbered out of its part). The checker must
name each one and exit 1, and pass again once it is undone (the generated block by --write); a count that says when
it was true passes. With fa-run, a step source that disagrees with the built registry must be reported too.
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
COPIED = ["README.md", "docs/*.md", "notebooks/README.md", "exercises/README.md", "steps/*/*.cu", "steps/*/README.md",
          "steps/*/CMakeLists.txt", "steps/python_steps.tsv",
          "common/fa/registry.cpp",
          "exercises/*/exercise.spec", "tests/mutants/*.mutant", "docs/results/*.csv"]


def run(root, *args, fa_run=FA_RUN):
    cmd = [sys.executable, CHECKER, "--root", root, *args] + (["--fa-run", fa_run] if fa_run else [])
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
    wrong("exercises/README.md", r"(Exercises 42-48 are decode\s+\()sm_80 or newer", r"\1sm_90 exactly",
          r'exercises/README\.md:\d+: "exercises 42-48 \.\.\. sm_90 exactly"')
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
    wrong("docs/mainpage.md", r"\n\| \[48 [^\n]*", "", r"docs/mainpage\.md:\d+: the table lists steps 42-47")
    wrong("README.md", r"\n\| \[41 [^\n]*", "", r"README\.md:\d+: the table lists steps 26-40; a part runs .*26-41")
    # Counts of all the steps, and of cases for every step: true today or dated.
    wrong("README.md", r"(## How to read a step\n)", r"\1\nThe Python module lists 62 steps.\n",
          r'README\.md:\d+: "62 steps": the registry has \d+ steps, \d+ entries with the variants')
    wrong("README.md", r"(## How to read a step\n)", r"\1\nThe shape matrix passed for every forward step (9,000 cases).\n",
          r'README\.md:\d+: "every forward step \.\.\. 9,000 cases": a count of cases for every step goes stale')
    # A range of ctest names that is not a part's; a claim that every step is one .cu file.
    wrong("README.md", r"`step26/…` to `step41/…`", "`step26/…` to `step40/…`",
          r'README\.md:\d+: "step26/… to step40/…" is not a part\'s steps')
    wrong("README.md", r"(## How to read a step\n)", r"\1\nEvery step is a single `.cu` file.\n",
          r'README\.md:\d+: "Every step is a single \.cu file": steps 02, 11 have more than one \.cu file')
    # An index example, in code too, names the registry's entry at that index.
    wrong("docs/python.md", r"(```python\n)", r"\1fa_course.steps()[10]   # what step 11 is\n",
          r"docs/python\.md:\d+: steps\(\)\[10\] is given as 11; the registry's entry 10 is 06-br32")
    # A table of measured numbers names its run, in the prose and in a step's README.
    wrong("README.md", r"(## How to read a step\n)", r"\1\n| step | ms |\n|---|---:|\n| 01 | 120.7 |\n",
          r"README\.md:\d+: a table of measured numbers that names no run")
    wrong("steps/01_naive/README.md", r"\A", "| step | TFLOPS |\n|---|---:|\n| 01 | 0.07 |\n\n" + "text\n" * 12,
          r"steps/01_naive/README\.md:1: a table of measured numbers that names no run")
    # A count that says when it was true is not a claim about today.
    with open(readme := os.path.join(tree, "README.md"), encoding="utf-8") as f:
        original = f.read()
    with open(readme, "w", encoding="utf-8") as f:
        f.write(original.replace("## How to read a step\n", "## How to read a step\n\nThe module then listed 48 steps, "
                                 "and on 2026-11-27 the matrix passed for every step (13,440 cases).\n", 1))
    code, out = run(tree)
    with open(readme, "w", encoding="utf-8") as f:
        f.write(original)
    assert code == 0, f"dated counts must pass:\n{out}"
    # Every part contiguous: the lean backward consumer numbered after the decode steps, as it was before 2026-11-28
    # (read from the sources: the built fa-run's registry is the real one).
    os.rename(os.path.join(tree, "steps", "41_lean_backward_consumer"), os.path.join(tree, "steps", "62_lean_backward_consumer"))
    code, out = run(tree, fa_run=None)
    os.rename(os.path.join(tree, "steps", "62_lean_backward_consumer"), os.path.join(tree, "steps", "41_lean_backward_consumer"))
    assert code == 1 and "the part 'The backward pass' is not contiguous (26-40, 62)" in out \
        and "step 62 (backward) comes after step 61 (features)" in out, out

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
