#!/usr/bin/env python3
"""Every step has its notebook, named by the step's number, and the notebooks are committed clean.

Plain asserts, no pytest, Python 3 only. For a repository root, `problems(root)` lists:
* a step (steps/NN_name/) with no notebooks/NN_*.ipynb, or with more than one;
* a numbered notebook whose number no step has;
* a notebook in notebooks/ that notebooks/README.md's table does not list, or a numbered one whose
  "goes with" column is not "step NN";
* a notebook committed with outputs or execution counts (CI executes them; outputs go to build/);
* a notebook that declares nbformat 4.5 or later with a cell that has no id (or one that is not 1 to 64 letters,
  digits, '-' or '_'), or with two cells of the same id: from 4.5 on every cell must have one, unique in its notebook.
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
    steps = sorted(d for d in os.listdir(os.path.join(root, "steps"))  # a step's folder holds its CMakeLists.txt
                   if re.fullmatch(r"\d\d_\w+", d) and os.path.isfile(os.path.join(root, "steps", d, "CMakeLists.txt")))
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
            book = json.load(nb)
        cells = book["cells"]
        dirty = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count"))]
        if dirty:
            found.append(f"notebooks/{f}: outputs or execution counts in cells {dirty}")
        version = (book.get("nbformat", 0), book.get("nbformat_minor", 0))
        if version >= (4, 5):
            no_id = [i for i, c in enumerate(cells)
                     if not (isinstance(c.get("id"), str) and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", c["id"]))]
            if no_id:
                found.append(f"notebooks/{f}: nbformat {version[0]}.{version[1]} needs a cell id, cells {no_id} have none "
                             "(or not one of 1 to 64 letters, digits, '-', '_')")
            ids = [c.get("id") for c in cells if c.get("id") is not None]
            twice = sorted({i for i in ids if ids.count(i) > 1})
            if twice:
                found.append(f"notebooks/{f}: cell ids used more than once: {twice}")
    return found


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as f:
        f.write(text)


def notebook(executed=False, ids=("0a1b2c3d", "4e5f6a7b"), minor=5):
    """A notebook of two cells, a markdown one and a code one, with these ids (None: the cell has no id)."""
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# x"]},
             {"cell_type": "code", "execution_count": 1 if executed else None, "metadata": {}, "source": ["1 + 1"],
              "outputs": [{"output_type": "execute_result", "data": {"text/plain": ["2"]}}] if executed else []}]
    for cell, cell_id in zip(cells, ids):
        if cell_id is not None:
            cell["id"] = cell_id
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": minor})


with tempfile.TemporaryDirectory() as root:
    for step in ("01_naive", "02_reductions", "03_minimal_fa1"):
        write(root, f"steps/{step}/CMakeLists.txt", f"add_step({step})")
    os.makedirs(os.path.join(root, "steps", "04_emptied"))  # a folder a renumbering emptied: no step, no notebook
    write(root, "steps/CMakeLists.txt", "")
    write(root, "notebooks/01_naive.ipynb", notebook())
    write(root, "notebooks/03_minimal_fa1.ipynb", notebook(executed=True))     # committed with its outputs
    write(root, "notebooks/03_tiled_attention.ipynb", notebook())              # a second notebook 03
    write(root, "notebooks/04_orphan.ipynb", notebook())                       # no step 04
    write(root, "notebooks/results.ipynb", notebook(ids=(None, None), minor=4))  # unnumbered: allowed, if listed;
                                                                                  # nbformat 4.4: no ids needed
    write(root, "notebooks/hosted.ipynb", notebook(ids=("0a1b2c3d", None)))    # 4.5, a cell without an id
    write(root, "notebooks/tour.ipynb", notebook(ids=("0a1b2c3d", "0a1b2c3d")))  # 4.5, one id twice
    write(root, "notebooks/README.md",
          "| notebook | goes with | what |\n|---|---|---|\n"
          "| `01_naive.ipynb` | steps 01-04 | x |\n"                           # the wrong step
          "| `03_minimal_fa1.ipynb` | step 03 | x |\n| `03_tiled_attention.ipynb` | step 03 | x |\n"
          "| `04_orphan.ipynb` | step 04 | x |\n"                               # results.ipynb not listed
          "| `hosted.ipynb` | x | x |\n| `tour.ipynb` | x | x |\n")
    got = problems(root)
    expected = [
        "step 02_reductions: 0 notebooks numbered 02 (none), expected notebooks/02_reductions.ipynb",
        "step 03_minimal_fa1: 2 notebooks numbered 03 (03_minimal_fa1.ipynb, 03_tiled_attention.ipynb)",
        "notebooks/04_orphan.ipynb: no step numbered 04",
        "notebooks/results.ipynb: not in notebooks/README.md's table",
        "notebooks/01_naive.ipynb: notebooks/README.md says it goes with 'steps 01-04', expected 'step 01'",
        "notebooks/03_minimal_fa1.ipynb: outputs or execution counts in cells [1]",
        "notebooks/hosted.ipynb: nbformat 4.5 needs a cell id, cells [1] have none",
        "notebooks/tour.ipynb: cell ids used more than once: ['0a1b2c3d']",
    ]
    for want in expected:
        assert any(line.startswith(want) for line in got), f"not caught: {want}\ngot:\n" + "\n".join(got)
    assert len(got) == len(expected), "unexpected problems:\n" + "\n".join(got)

    # Repaired, the same tree passes.
    os.remove(os.path.join(root, "notebooks", "03_tiled_attention.ipynb"))
    os.remove(os.path.join(root, "notebooks", "04_orphan.ipynb"))
    write(root, "notebooks/02_reductions.ipynb", notebook())
    write(root, "notebooks/03_minimal_fa1.ipynb", notebook())
    write(root, "notebooks/hosted.ipynb", notebook())
    write(root, "notebooks/tour.ipynb", notebook(ids=("0a1b2c3d", "tour-2")))
    write(root, "notebooks/README.md",
          "| notebook | goes with | what |\n|---|---|---|\n| `01_naive.ipynb` | step 01 | x |\n"
          "| `02_reductions.ipynb` | step 02 | x |\n| `03_minimal_fa1.ipynb` | step 03 | x |\n"
          "| `results.ipynb` | every step | x |\n| `hosted.ipynb` | x | x |\n| `tour.ipynb` | x | x |\n")
    assert problems(root) == [], "a repaired tree must pass:\n" + "\n".join(problems(root))

real = problems(REPO)
if real:
    print("\n".join(real))
    sys.exit(1)
steps = [d for d in os.listdir(os.path.join(REPO, "steps"))
         if re.fullmatch(r"\d\d_\w+", d) and os.path.isfile(os.path.join(REPO, "steps", d, "CMakeLists.txt"))]
print(f"{len(steps)} steps, each with its notebook; every notebook listed, committed without outputs, and with a "
      "unique id on every cell where its nbformat asks for one")
