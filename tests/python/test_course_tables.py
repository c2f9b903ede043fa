#!/usr/bin/env python3
"""The top README's course tables are printed from the one recorded CSV, byte for byte.

Plain asserts, no pytest. `tools/tables.py parts --check FILE` re-prints every block of FILE between
`<!-- course-table PART DTYPE CSV -->` and `<!-- end course-table -->` from the CSV its marker names.
First the fixture (tests/data/course/: tables from a few rows, one of them two runs side by side, one a decode table
with a paged run and the read ceiling) must pass; then a copy with one number
changed, one with a row dropped and one naming an unknown part must each fail; `--write` must restore the
changed copy. Then the real README.md must pass, with a table for every part of the course, all from the same
recorded runs (one CSV a GPU).
Last, `tables.py times` must list a row once when both a step and its variant are named, and every step of the
suite when none is named; and `tables.py context` must print each context-parallel form's median over its rounds
from bench/cp_bench.py's CSV (a fixture of two rounds written here).
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TABLES = os.path.join(ROOT, "tools", "tables.py")
FIXTURE = os.path.join(ROOT, "tests", "data", "course", "README.md")


def run(*args):
    done = subprocess.run([sys.executable, TABLES, "parts", *args], capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def main() -> int:
    code, out = run("--check", FIXTURE)
    assert code == 0, f"the fixture should pass:\n{out}"
    with open(FIXTURE, encoding="utf-8") as f:
        good = f.read()
    assert "| 02 | 17.47 |" in good, "the fixture lost the row this test edits"
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "README.md")
        for name, text in (("a changed number", good.replace("| 02 | 17.47 |", "| 02 | 16.47 |")),
                           ("a dropped row", "\n".join(l for l in good.split("\n") if not l.startswith("| 03 "))),
                           ("an unknown part", good.replace("course-table cuda-cores", "course-table cuda-core"))):
            with open(copy, "w", encoding="utf-8") as f:
                f.write(text)
            code, out = run("--check", copy)
            assert code == 1, f"{name} should fail the check:\n{out}"
        with open(copy, "w", encoding="utf-8") as f:
            f.write(good.replace("| 02 | 17.47 |", "| 02 | 16.47 |"))
        code, out = run("--write", copy)
        assert code == 0, out
        with open(copy, encoding="utf-8") as f:
            assert f.read() == good, "--write should restore the table"
    readme = os.path.join(ROOT, "README.md")
    code, out = run("--check", readme)
    assert code == 0, f"README.md's course tables differ from their recorded CSV:\n{out}"
    # One table a part, every part, all from the one recorded CSV (the f32 chain may add a second CUDA-core table).
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import tables  # noqa: E402
    with open(readme, encoding="utf-8") as f:
        markers = tables._BLOCK.findall(f.read())
    parts = {m[1] for m in markers}
    missing = [k for k in tables.PART_SHAPES if k not in parts]
    assert not missing, f"README.md has no course table for the part(s) {missing}"
    csvs = {m[3] for m in markers}
    assert len(csvs) == 1, f"README.md's course tables come from different runs: {sorted(csvs)}"
    # `times` lists a row once when a step and its variant are both named ("11,11-f32": 11 already takes in 11-f32).
    rows_csv = os.path.join(ROOT, "docs", "results", "h200-2026-11-27i-hosted-teaching.csv")
    rows = tables.plots.load([rows_csv])
    variant = next(r for r in rows if r["variant"] and not tables.plots.is_peer(r))
    label = f"{variant['step']}-{variant['variant']}"
    text = tables.times(rows, variant["suite"], [variant["step"], label], [variant["dtype"]], [variant["causal"]])
    assert text.count(f"| {tables._name(variant)} |") == 1, f"{label} listed twice:\n{text}"
    # Without --steps, `times` lists every step of the suite and then the peers.
    done = subprocess.run([sys.executable, TABLES, "times", "--csv", rows_csv, "--suite", "teaching", "--dtypes", "f16",
                           "--causal", "0"], capture_output=True, text=True)
    listed = [line.split(" | ")[0].lstrip("| ") for line in done.stdout.splitlines()[2:]]
    assert done.returncode == 0 and listed[:3] == ["04", "06-br8", "06-br16"] and listed[-1].endswith("(peer)"), done.stdout
    # `context`: the median of a form's rounds, its share of one GPU's throughput (one / (ms x GPUs)), PyTorch's over it.
    header = "gpu,round,form,gpus,batch,tokens,heads,kv_heads,head_dim,causal,dtype,ms,tflops_per_gpu,of_one_gpu,torch_cp_time_over_this\n"
    fixture = "".join(f"H200,{rnd},{form},{gpus},1,4096,16,16,128,yes,bf16,{ms},,,\n" for rnd, form, gpus, ms in (
        (1, "one", 1, 100.0), (1, "ring", 2, 60.0), (1, "ulysses", 2, ""), (1, "torch_cp", 2, 90.0),
        (2, "one", 1, 100.0), (2, "ring", 2, 50.0), (2, "ulysses", 2, ""), (2, "torch_cp", 2, 110.0)))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cp.csv")
        with open(path, "w") as f:
            f.write(header + fixture)
        done = subprocess.run([sys.executable, TABLES, "context", "--csv", path], capture_output=True, text=True)
    expected = "| 4,096 | causal | 16/16, 128 | 100.0 | 55.0, 0.91 | – | 100.0, 0.50 | 1.82× | 2 |"
    assert done.returncode == 0 and expected in done.stdout, done.stdout + done.stderr
    print("course tables: the checker catches a changed number, a dropped row and an unknown part;", out.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
