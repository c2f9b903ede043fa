#!/usr/bin/env python3
"""The decode roofline's CPU parts (bench/decode_roofline.sh): the peers' plan of decode shapes with several new tokens
and paged caches, the merge of alternating rounds into one CSV, and the roofline table's medians and ratios.
Plain asserts, no pytest, no torch.
"""
import contextlib
import csv
import io
import os
import sys
import tempfile

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, os.path.join(REPO, "tools"))
import ceilings  # noqa: E402
import merge_rounds  # noqa: E402
import plots  # noqa: E402
import sdpa_peers  # noqa: E402
import tables  # noqa: E402

# The plan: a decode shape's causal mask is bottom-right, so one new token is timed without it alone; several new
# tokens with both; pages rename the suite and leave SDPA out with a reason, FA4 in; shapes may come in one argument.
args = sdpa_peers.parse_args(["--dry-run", "--pass", "decode", "--shape", "8,1,8192,32,8,128 8,4,8192,32,8,128",
                              "--dtypes", "f16", "--backends", "cudnn,fa4", "--page-size", "16"])
plan = sdpa_peers.plan(args)
assert {(s[1][1], s[3]) for s in plan} == {(1, False), (4, False), (4, True)}, plan
assert {s[0] for s in plan} == {"decode-pages16"}, plan
assert sdpa_peers.refusal("cudnn", (8, 4, 8192, 32, 8, 128), "f16", True, "decode", 16) == "SDPA takes no paged cache"
assert sdpa_peers.refusal("fa4", (8, 4, 8192, 32, 8, 128), "f16", True, "decode", 16) is None
assert sdpa_peers.refusal("cudnn", (8, 4, 8192, 32, 8, 128), "f16", True, "decode", 0) is None
# Outside decode FA4's bottom-right mask is not the course's top-left one: refused where they differ.
assert sdpa_peers.refusal("fa4", (1, 4, 8192, 4, 4, 64), "f16", True, "forward") is not None
# A page size that does not divide a shape's Nkv is refused before anything runs, for --shape and for a suite.
for bad in (["--shape", "1,1,100,4,4,64"], ["--suites", "decode"]):
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            sdpa_peers.plan(sdpa_peers.parse_args(["--dry-run", "--pass", "decode", "--page-size", "48", *bad]))
    except SystemExit as refused:
        assert "does not divide Nkv" in str(refused), refused
    else:
        raise AssertionError(f"sdpa_peers.py planned pages of 48 for {bad}")
for bad in (["--pass", "forward", "--page-size", "16"], ["--pass", "decode", "--page-size", "-1"]):
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            sdpa_peers.parse_args(["--dry-run", *bad])
    except SystemExit:
        pass
    else:
        raise AssertionError(f"sdpa_peers.py accepted {bad}")

# Two rounds of a step and a peer, contiguous and on pages of 16, merged: suites round<k> and round<k>-pages16; the
# table's medians, the best step over the read ceiling, and its paged bandwidth over its contiguous one.
shape = (8, 4, 8192, 32, 8, 128)
kv_bytes = 2 * 8 * 8192 * 8 * 128 * 2


def row(step, ms, suite, causal=True):
    return sdpa_peers.peer_row(step, "f16", shape, causal, suite, "GPU", ms, ms, ms, 15, 0, 1e-3, 1e-3, "decode")


with tempfile.TemporaryDirectory() as folder:
    work = os.path.join(folder, "roofline")
    os.makedirs(work)
    timings = {("steps", 1, 0): ("46", 0.100, "decode"), ("steps", 2, 0): ("46", 0.110, "decode"),
               ("steps", 1, 16): ("46", 0.125, "decode-pages16"), ("steps", 2, 16): ("46", 0.125, "decode-pages16"),
               ("peers", 1, 0): ("fa4", 0.200, "decode"), ("peers", 2, 0): ("fa4", 0.200, "decode")}
    for (side, round_, page), (step, ms, suite) in timings.items():
        with open(os.path.join(work, f"{side}-{round_}-{page}.csv"), "w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(plots.COLUMNS)
            writer.writerow(row(step, ms, suite))
    out = os.path.join(folder, "roofline.csv")
    assert merge_rounds.merge(work, out) == 6
    with open(out, newline="") as f:
        suites = sorted(r["suite"] for r in csv.DictReader(f))
    assert suites == ["round1", "round1", "round1-pages16", "round2", "round2", "round2-pages16"], suites
    with open(out, "a", newline="") as f:  # the read ceiling of the same run: 4 TB/s
        csv.writer(f, lineterminator="\n").writerow(ceilings.row("hbm-read", "GPU", 1.0, 1.0, 1.0, 15, gbps="4000"))
    table = tables.roofline(plots.load([out]))
    line = next(t for t in table.splitlines() if t.startswith("| 8 | 8192 | 4 | bottom-right"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    median = kv_bytes / (0.105 * 1e6) / 1000  # TB/s at the median time of the two rounds
    assert abs(float(cells[7]) - median) < 0.01, (cells, median)               # 46, contiguous
    assert abs(float(cells[8]) - kv_bytes / (0.125 * 1e6) / 1000) < 0.01, cells      # 46 on pages of 16
    assert abs(float(cells[9]) - kv_bytes / (0.2 * 1e6) / 1000) < 0.01, cells        # FA4
    assert cells[10] == "46" and abs(float(cells[11].rstrip("×")) - median / 4) < 0.005, cells
    assert abs(float(cells[12].rstrip("×")) - 0.105 / 0.125) < 0.005, cells
    assert "2 alternating round(s)" in table and "4 TB/s" in table, table
    # An ablation's variant of the step in the same rounds (twice as fast) is a column of its own: the step's
    # medians stay its own, and the variant's are the variant's.
    with open(out, "a", newline="") as f:
        for suite in ("round1", "round2"):
            variant = row("46", 0.050, suite)
            variant[plots.COLUMNS.index("variant")] = "bps2"
            csv.writer(f, lineterminator="\n").writerow(variant)
    rows = plots.load([out])
    for steps, value in ((["46"], median), (["46-bps2"], kv_bytes / (0.050 * 1e6) / 1000)):
        line = next(t for t in tables.roofline(rows, steps).splitlines() if t.startswith("| 8 | 8192 | 4 | bottom-right"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert abs(float(cells[7]) - value) < 0.01 and cells[-3] == steps[0], (steps, cells, value)
    assert "46-bps2" in tables.roofline(rows), tables.roofline(rows)

# Issue 57's bars from one run (tables.py decode-bars): at a GQA cache, 1 and 4 new tokens, contiguous and pages of
# 16, and cuDNN; the fastest step at one token is the one read; a configuration missing from the rows is "not
# measured", never met; where cuDNN reads above the ceiling the contiguous bar is 0.98x cuDNN instead.
def gqa_row(step, ms, suite, q_len, causal, page=0):
    s = (8, q_len, 8192, 32, 8, 128)
    return sdpa_peers.peer_row(step, "f16", s, causal, suite + (f"-pages{page}" if page else ""), "GPU", ms, ms, ms,
                               15, 0, 1e-3, 1e-3, "decode")


def bars(entries, ceiling_gbps):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "bars.csv")
        with open(path, "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(plots.COLUMNS)
            w.writerow(ceilings.row("hbm-read", "GPU", 1.0, 1.0, 1.0, 15, gbps=str(ceiling_gbps)))
            for suite in ("round1", "round2"):
                for e in entries:
                    w.writerow(gqa_row(e[0], e[1], suite, *e[2:]))
        return tables.decode_bars(plots.load([path]))


one_ms = kv_bytes / 4.0e12 * 1e3  # ms of 4 TB/s over the cache's K and V (kv_bytes above: B = 8, 8192 keys)
entries = [("48", one_ms, 1, False), ("47", one_ms * 1.1, 1, False),       # 48 the fastest: 4 TB/s
           ("48", one_ms / 0.96, 1, False, 16),                             # pages of 16: 0.96x
           ("48", one_ms / 0.85, 4, False), ("48", one_ms / 0.95, 4, True),  # 4 tokens: 0.85x, 0.95x
           ("48", one_ms / 0.875, 4, False, 16),  # paged, no mask: 3.5 TB/s, 0.91x paged one (0.875x contiguous)
           ("sdpa-cudnn", one_ms, 1, False)]
table = bars(entries, 4100)  # 4 TB/s is 0.976x of 4.1: met
got = {tuple(c.strip() for c in l.strip("|").split("|"))[0]: l for l in table.splitlines() if l.startswith("| ")}
assert "| 48 | 4 TB/s = 0.976x of 4.1 | 0.95 | yes |" in got["contiguous / read ceiling"], table
assert got["pages of 16 / contiguous"].endswith("| 0.95 | yes |"), table
assert got["4 new tokens / one (contiguous, no mask)"].endswith("| 0.9 | no |"), table
assert got["4 new tokens / one (contiguous, bottom-right)"].endswith("| 0.9 | yes |"), table
assert got["4 new tokens / one (pages of 16, no mask)"].endswith("| 0.9 | yes |"), table  # against paged one
assert got["4 new tokens / one (pages of 16, bottom-right)"].endswith("| not measured |"), table
assert "4 of 6 bars met" in table, table
table = bars(entries, 4300)  # 4 TB/s is 0.93x of 4.3, and cuDNN (4 TB/s) is not above the ceiling: not met
assert "0.93x of 4.3 | 0.95 | no |" in table, table
cudnn_fast = entries[:-1] + [("sdpa-cudnn", one_ms / 1.1, 1, False)]  # cuDNN 4.4 TB/s, above a ceiling of 4.3
table = bars(cudnn_fast, 4300)
assert "| contiguous / cuDNN |" in table and "0.909x cuDNN" in table and "| 0.98 | no |" in table, table
# A step timed on no pages (47) fastest on the contiguous cache: the contiguous bar is its, the paged bar the next
# step's against that step's own contiguous read.
no_pages = [("47", one_ms / 1.05, 1, False), entries[0], entries[2]]  # 47 at 4.2 TB/s; 48 at 4, 3.84 paged
table = bars(no_pages, 4300)
assert "| contiguous / read ceiling | 8, 8192, 32/8, 128 | f16 | 47 | 4.2 TB/s" in table, table
assert "| pages of 16 / contiguous | 8, 8192, 32/8, 128 | f16 | 48 | 3.84 / 4 = 0.96x | 0.95 | yes |" in table, table
# 47 fastest contiguous and timed on pages too, but slow there (as at d = 64): the paged bar is still the step fastest
# on pages (48) against its own contiguous read, not 47's pages against 47.
slow_pages = no_pages + [("47", one_ms / 0.6, 1, False, 16)]  # 47 at 2.4 TB/s on pages of 16
table = bars(slow_pages, 4300)
assert "| pages of 16 / contiguous | 8, 8192, 32/8, 128 | f16 | 48 | 3.84 / 4 = 0.96x | 0.95 | yes |" in table, table

# FA_ROOFLINE_GPUS deals (cache, dtype) pairs, so that one long cache is two GPUs' work: over four GPUs, caches listed
# longest first, each GPU runs one dtype of two caches (run here with a stub fa-bench that logs its arguments; the
# peers and the ceiling find no GPU and fail, which the script reports in its exit status and goes on).
import stat  # noqa: E402
import subprocess  # noqa: E402
with tempfile.TemporaryDirectory() as folder:
    os.symlink(os.path.abspath(os.path.join(REPO, "bench")), os.path.join(folder, "bench"))
    os.makedirs(os.path.join(folder, "build", "bench"))
    stub = os.path.join(folder, "build", "bench", "fa-bench")
    with open(stub, "w") as f:
        f.write("#!/bin/sh\necho \"GPU=$CUDA_VISIBLE_DEVICES $*\"\n")
    os.chmod(stub, os.stat(stub).st_mode | stat.S_IXUSR)
    env = dict(os.environ, OUT=os.path.join(folder, "out"), FA_ROOFLINE_GPUS="0 1 2 3", FA_ROOFLINE_STEPS="48",
               FA_ROOFLINE_CACHES="1,131072 8,8192 8,8192,16,16,64:1 64,2048", FA_ROOFLINE_TOKENS="1 8",
               FA_ROOFLINE_PAGES="0", FA_ROOFLINE_DTYPES="f16,bf16")
    env.pop("FA_PEER_SITE", None)
    subprocess.run(["bash", "bench/decode_roofline.sh", "1"], cwd=folder, env=env, capture_output=True, timeout=600)
    runs = sorted(d for d in os.listdir(os.path.join(folder, "out")) if os.path.isdir(os.path.join(folder, "out", d)))
    assert runs == ["gpu0-f16", "gpu1-bf16", "gpu2-f16", "gpu3-bf16"], runs
    said = {r: open(os.path.join(folder, "out", r, "roofline", "steps-1-0.txt")).read() for r in runs}
    for r in ("gpu0-f16", "gpu1-bf16"):  # B = 1's cache and d = 64's (one new token), one dtype each
        assert "--shape 1,1,131072,32,8,128 1,8,131072,32,8,128 8,1,8192,16,16,64 " in said[r], said[r]
    for r in ("gpu2-f16", "gpu3-bf16"):
        assert "--shape 8,1,8192,32,8,128 8,8,8192,32,8,128 64,1,2048,32,8,128 64,8,2048,32,8,128 " in said[r], said[r]
    assert all(f"--dtypes {r.split('-')[1]} " in said[r] and said[r].startswith(f"GPU={r[3]} ") for r in runs), said
    env["FA_ROOFLINE_GPUS"] = "0 one"
    refused = subprocess.run(["bash", "bench/decode_roofline.sh", "1"], cwd=folder, env=env, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "'one' is not a GPU's index" in refused.stdout, refused
print("decode roofline: plan, merge, table and issue 57's bars as expected; (cache, dtype) pairs dealt over the GPUs")
