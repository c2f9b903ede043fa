#!/usr/bin/env python3
"""tools/doctor says of every step the GPU the registry says, and checks every optional piece the README names;
tools/exercise list keeps its columns.

    python3 tests/python/test_doctor.py build/bench/fa-run

Plain asserts, no pytest. The doctor's "needs" column must give each step the GPU that `fa-run --list` gives its
first entry (sm_90a for the steps built for sm_90a alone, not sm_90), a Python step its count of GPUs (steps/
python_steps.tsv), every step once, in one column whatever the
length of the step's folder name; and the doctor must check the pieces a newcomer needs beyond the build: nanobind
(the Python module), torch (fa_course.torch, the PyTorch peers) and cuobjdump (the CPU check of the Hopper steps'
machine code). Without a GPU the doctor exits 1 (a GPU is required to run kernels); that is not what is tested here.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
FA_RUN = sys.argv[1]

listed = {}
for line in subprocess.run([FA_RUN, "--list"], capture_output=True, text=True, check=True).stdout.splitlines():
    label = line[:14].strip()
    if re.match(r"^\d\d(-|$)", label) and label[:2] not in listed:
        listed[label[:2]] = line[41:49].strip()  # the GPU column (tools/check_prose.py reads it the same way)
assert len(listed) >= 46, listed
# The Python steps (steps/python_steps.tsv: schedules over the kernels, not in fa-run --list) with their GPUs' count.
with open(os.path.join(ROOT, "steps", "python_steps.tsv"), encoding="utf-8") as tsv:
    for row in (line.rstrip("\n").split("\t") for line in tsv if line[:1].isdigit()):
        listed[row[0]] = row[3]  # "needs 2 GPUs": the column's first word

out = subprocess.run(["bash", os.path.join(ROOT, "tools", "doctor")], capture_output=True, text=True).stdout
rows = re.findall(r"^  (\d\d_\w+)( +)needs (\S+)", out, re.M)
said = {name[:2]: need for name, _, need in rows}
assert set(said) == set(listed), f"the doctor lists steps {sorted(said)}, fa-run --list {sorted(listed)}"
wrong = {sid: (said[sid], listed[sid]) for sid in listed if said[sid] != listed[sid]}
assert not wrong, f"the doctor's 'needs' differ from fa-run --list's GPU (doctor, fa-run): {wrong}"
columns = {len(name) + len(pad) for name, pad, _ in rows}
assert len(columns) == 1, f"the doctor's 'needs' column moves with the step's name: at {sorted(columns)}"
for piece in ("nanobind", "torch", "cuobjdump", "Catch2", "compute-sanitizer"):
    assert re.search(rf"^  (ok|optional|MISSING) +{piece}\b", out, re.M), f"the doctor does not check {piece}:\n{out}"
# tools/exercise list: one column for the minutes, whatever the length of the exercise's folder name.
listing = subprocess.run(["bash", os.path.join(ROOT, "tools", "exercise"), "list"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
ends = {len(m.group(1)) for m in (re.match(r"^(\S+ +\d+)  ", line) for line in listing[1:]) if m}
assert len(listing) > 40 and len(ends) == 1, f"tools/exercise list's minutes column moves: ends at {sorted(ends)}"
print(f"tools/doctor: {len(rows)} steps, each with fa-run --list's GPU, in one column; nanobind, torch, cuobjdump checked")
