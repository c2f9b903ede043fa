#!/usr/bin/env python3
"""Every step has its notebook, named by the step's number, and the notebooks are committed clean.

Plain asserts, no pytest, Python 3 only. For a repository root, `problems(root)` lists:
* a step (steps/NN_name/) with no notebooks/NN_*.ipynb, or with more than one;
* a numbered notebook whose number no step has;
* a notebook in notebooks/ that notebooks/README.md's table does not list, or a numbered one whose
  "goes with" column is not "step NN";
* a notebook committed with outputs or execution counts (CI executes them; outputs go to build/).
First a small tree with one fault of each kind must be caught, fault by fault, and the same tree
repaired must pass; then the real repository must pass.
"""
import json
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))


def problems(root):
    found = []
    steps = sorted(d for d in os.listdir(os.path.join(root, "steps"))
                   if re.fullmatch(r"\d\d_\w+", d) and os.path.isdir(os.path.join(root, "steps", d)))
    books = sorted(f for f in os.listdir(os.path.join(root, "notebooks")) if f.endswith(".ipynb"))
    numbered = [f for f in books if re.match(r"\d\d_", f)]
    for step in steps:
        mine = [f for f in numbered if f[:2] == step[:2]]
        if len(mine) != 1:
            found.append(f"step {step}: {len(mine)} notebooks numbered {step[:2]} ({', '.join(mine) or 'none'}), "
                         f"expected notebooks/{step}.ipynb")
    for f in numbered:
        if not any(step[:2] == f[:2] for step in steps):
            found.append(f"notebooks/{f}: no step numbered {f[:2]}")
    with open(os.path.join(root, "notebooks", "README.md"), encoding="utf-8") as readme:
        rows = {m.group(1): m.group(2).strip() for m in re.finditer(r"^\| `([^`]+\.ipynb)` \|([^|]*)\|", readme.read(), re.M)}
    for f in books:
        if f not in rows:
            found.append(f"notebooks/{f}: not in notebooks/README.md's table")
        elif f in numbered and rows[f] != f"step {f[:2]}":
            found.append(f"notebooks/{f}: notebooks/README.md says it goes with '{rows[f]}', expected 'step {f[:2]}'")
    for f in books:
        with open(os.path.join(root, "notebooks", f), encoding="utf-8") as nb:
            cells = json.load(nb)["cells"]
        dirty = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))]
        if dirty:
            found.append(f"notebooks/{f}: outputs or execution counts in cells {dirty}")
    return found


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
        f.write(text)


def notebook(executed=False):
    cell = {"cell_type": "code", "execution_count": 1 if executed else None, "metadata": {}, "source": ["1 + 1"],
            "outputs": [{"output_type": "execute_result", "data": {"text/plain": ["2"]}}] if executed else []}
    return json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


with tempfile.TemporaryDirectory() as root:
    for step in ("01_naive", "02_reductions", "03_minimal_fa1"):
        os.makedirs(os.path.join(root, "steps", step))
    write(root, "steps/CMakeLists.txt", "")
    write(root, "notebooks/01_naive.ipynb", notebook())
    write(root, "notebooks/03_minimal_fa1.ipynb", notebook(executed=True))     # committed with its outputs
    write(root, "notebooks/03_tiled_attention.ipynb", notebook())              # a second notebook 03
    write(root, "notebooks/04_orphan.ipynb", notebook())                       # no step 04
    write(root, "notebooks/results.ipynb", notebook())                         # unnumbered: allowed, if listed
    write(root, "notebooks/README.md",
          "| notebook | goes with | what |\n|---|---|---|\n"
          "| `01_naive.ipynb` | steps 01-04 | x |\n"                           # the wrong step
          "| `03_minimal_fa1.ipynb` | step 03 | x |\n| `03_tiled_attention.ipynb` | step 03 | x |\n"
          "| `04_orphan.ipynb` | step 04 | x |\n")                              # results.ipynb not listed
    got = problems(root)
    expected = [
        "step 02_reductions: 0 notebooks numbered 02 (none), expected notebooks/02_reductions.ipynb",
        "step 03_minimal_fa1: 2 notebooks numbered 03 (03_minimal_fa1.ipynb, 03_tiled_attention.ipynb)",
        "notebooks/04_orphan.ipynb: no step numbered 04",
        "notebooks/results.ipynb: not in notebooks/README.md's table",
        "notebooks/01_naive.ipynb: notebooks/README.md says it goes with 'steps 01-04', expected 'step 01'",
        "notebooks/03_minimal_fa1.ipynb: outputs or execution counts in cells [0]",
    ]
    for want in expected:
        assert any(line.startswith(want) for line in got), f"not caught: {want}\ngot:\n" + "\n".join(got)
    assert len(got) == len(expected), "unexpected problems:\n" + "\n".join(got)

    # Repaired, the same tree passes.
    os.remove(os.path.join(root, "notebooks", "03_tiled_attention.ipynb"))
    os.remove(os.path.join(root, "notebooks", "04_orphan.ipynb"))
    write(root, "notebooks/02_reductions.ipynb", notebook())
    write(root, "notebooks/03_minimal_fa1.ipynb", notebook())
    write(root, "notebooks/README.md",
          "| notebook | goes with | what |\n|---|---|---|\n| `01_naive.ipynb` | step 01 | x |\n"
          "| `02_reductions.ipynb` | step 02 | x |\n| `03_minimal_fa1.ipynb` | step 03 | x |\n"
          "| `results.ipynb` | every step | x |\n")
    assert problems(root) == [], "a repaired tree must pass:\n" + "\n".join(problems(root))

real = problems(REPO)
if real:
    print("\n".join(real))
    sys.exit(1)
steps = [d for d in os.listdir(os.path.join(REPO, "steps")) if re.fullmatch(r"\d\d_\w+", d)]
print(f"{len(steps)} steps, each with its notebook; every notebook listed and committed without outputs")
