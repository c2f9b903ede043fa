#!/usr/bin/env python3
"""bench/features_run.sh without a GPU: issue 58's five runs of bench/hopper_rounds.sh dealt over the GPUs named, the
longest first, each with its own settings, and every run's rows in one CSV under one header; a GPU entry that is no
index refused by name before anything runs. fa-bench is a stub here (one row a call, the GPU and steps it was given
in its log); the peers find no GPU and leave no rows, as hopper_rounds.sh allows. Plain asserts, no pytest.
"""
import csv
import os
import stat
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools"))
import plots  # noqa: E402

STUB = """#!/usr/bin/env python3
import os, sys
args = sys.argv[1:]
out = args[args.index("--csv") + 1]
print("GPU", os.environ.get("CUDA_VISIBLE_DEVICES"), "steps", args[args.index("--steps") + 1],
      "shape", args[args.index("--shape") + 1], "features", " ".join(a for a in args if a.startswith("--") and
      a in ("--window", "--softcap", "--sinks", "--varlen")))
with open(out, "w") as f:
    f.write(",".join(COLUMNS) + "\\n")
    row = dict.fromkeys(COLUMNS, "nan")
    row.update({"step": "52", "variant": "", "dtype": "bf16", "batch": "1", "q_len": "1", "kv_len": "1",
                "q_heads": "16", "kv_heads": "16", "head_dim": "128", "causal": "1", "ms": "1.0", "gpu": "stub",
                "suite": "forward", "pass": "forward"})
    f.write(",".join(row[c] for c in COLUMNS) + "\\n")
"""


def run(folder, gpus, rounds="1"):
    env = dict(os.environ, OUT=os.path.join(folder, "out"), FA_FEATURES_GPUS=gpus, PATH=os.environ["PATH"])
    env.pop("FA_PEER_SITE", None)
    return subprocess.run(["bash", "bench/features_run.sh", rounds], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600)


with tempfile.TemporaryDirectory() as folder:
    os.symlink(os.path.join(REPO, "bench"), os.path.join(folder, "bench"))
    os.makedirs(os.path.join(folder, "build", "bench"))
    stub = os.path.join(folder, "build", "bench", "fa-bench")
    with open(stub, "w") as f:
        f.write(STUB.replace("COLUMNS", repr(list(plots.COLUMNS))))
    os.chmod(stub, os.stat(stub).st_mode | stat.S_IXUSR)

    done = run(folder, "0 1")
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    out = os.path.join(folder, "out")
    # Five runs, dealt in turn over GPUs 0 and 1: runs 0, 2, 4 on GPU 0, runs 1 and 3 on GPU 1.
    for k, gpu in enumerate([0, 1, 0, 1, 0]):
        logs = [f for f in os.listdir(os.path.join(out, f"run{k}", "rounds")) if f.startswith("ours-") and
                f.endswith(".txt")]
        assert logs, (k, os.listdir(os.path.join(out, f"run{k}", "rounds")))
        for name in logs:
            said = open(os.path.join(out, f"run{k}", "rounds", name)).read()
            assert said.startswith(f"GPU {gpu} "), (k, name, said)
    said = {k: open(os.path.join(out, f"run{k}", "rounds", sorted(f for f in os.listdir(os.path.join(
        out, f"run{k}", "rounds")) if f.startswith("ours-") and f.endswith(".txt"))[0])).read() for k in range(5)}
    assert "steps 25,49,50,51,52" in said[0] and "steps 53,54,55,61" in said[1], said
    assert "steps 52 " in said[2] and "steps 56 " in said[3] and "steps 57,58,60,61" in said[4], said
    assert "shape 4,4096,4096,16,16,256" in said[4], said
    # Each run's calls: run 0 two shapes x four features, run 1 one shape x four, runs 2 and 3 none and the pack,
    # run 4 one: 17 calls, one row each, under one header.
    with open(os.path.join(out, "features.csv"), newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(plots.COLUMNS) and len(rows) == 1 + 17, (rows[0], len(rows))
    assert sum(1 for r in rows if r == rows[0]) == 1, "the header once"
    kinds = sorted(os.listdir(os.path.join(out, "run2", "rounds")))
    assert any("feature1" in k for k in kinds), kinds  # the pack's run: its second feature, the varlen list

    refused = run(folder, "0 x")
    assert refused.returncode == 2 and "'x' is not a GPU's index" in refused.stdout, (refused.returncode,
                                                                                      refused.stdout)
print("features_run.sh: five runs dealt over the GPUs, one CSV, a bad GPU entry refused")
