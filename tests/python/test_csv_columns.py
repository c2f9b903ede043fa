#!/usr/bin/env python3
"""The Python tools read and write exactly fa-bench's CSV columns.

tools/plots.py holds the column list once (bench/sdpa_peers.py and bench/fa3_peer.py import it); this
checks it against the header bench/fa_bench.cpp writes, that a peer row has one cell per column with
its pass and its K/V bandwidth (gbps, decode only) last, and that a CSV recorded before the `pass` column
existed reads as the forward's, one recorded before `gbps` with gbps NaN.
Plain asserts, no pytest.
"""
import os
import re
import sys
import tempfile

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(REPO, "bench"))  # the peers
sys.path.insert(0, os.path.join(REPO, "tools"))  # plots.py
import fa3_peer  # noqa: E402
import plots  # noqa: E402
import sdpa_peers  # noqa: E402

with open(os.path.join(REPO, "bench", "fa_bench.cpp")) as f:
    source = f.read()
# The header is written as adjacent string literals after `csv << "step,...`.
match = re.search(r'csv << ((?:"[^"]*"\s*)+)', source)
assert match, "fa_bench.cpp: no `csv << \"step,...\"` header found"
header = "".join(re.findall(r'"([^"]*)"', match.group(1))).strip().replace("\\n", "")
assert header.split(",") == plots.COLUMNS, f"fa-bench writes {header}, plots.py reads {','.join(plots.COLUMNS)}"
assert sdpa_peers.COLUMNS is plots.COLUMNS
assert fa3_peer.COLUMNS is plots.COLUMNS
assert plots.COLUMNS[-2:] == ["pass", "gbps"], "pass and gbps come last: older CSVs are the same columns without them"

# A peer row: one cell per column, its pass in the pass column, the backward's TFLOPS 2.5 times the forward's.
shape = (4, 1024, 1024, 8, 8, 64)
rows = {p: dict(zip(plots.COLUMNS, sdpa_peers.peer_row("sdpa-flash", "f16", shape, False, "teaching", "GPU", 1.0, 1.0,
                                                        1.0, 15, 0, 1e-3, 1e-3, p)))
        for p in ("forward", "backward")}
for p, row in rows.items():
    assert len(row) == len(plots.COLUMNS) and row["pass"] == p and row["gbps"] == "nan", row
# A decode row: the bytes of K and V over the time. 8 x 8192 keys x 8 KV heads x 128 x 2 bytes, twice, in 1 ms.
decode = dict(zip(plots.COLUMNS, sdpa_peers.peer_row("sdpa-cudnn", "f16", (8, 1, 8192, 32, 8, 128), False, "decode",
                                                      "GPU", 1.0, 1.0, 1.0, 15, 0, 1e-3, 1e-3, "decode")))
assert decode["pass"] == "decode" and abs(float(decode["gbps"]) - 2 * 8 * 8192 * 8 * 128 * 2 / 1e6) < 1e-3, decode
assert abs(float(rows["backward"]["tflops"]) / float(rows["forward"]["tflops"]) - 2.5) < 1e-5
assert len(sdpa_peers.peer_row("fa3", "f16", shape, True, "custom", "GPU", 1, 1, 1, 7, 0, 0, 0)) == len(plots.COLUMNS)
assert sdpa_peers.peer_row("fa3", "f16", shape, True, "custom", "GPU", 1, 1, 1, 7, 0, 0, 0)[-2] == "forward"

# A CSV without the pass column (docs/results/ before the backward) loads as forward rows; with it, a forward and a
# backward row of one configuration are two rows.
with tempfile.TemporaryDirectory() as folder:
    old, new = os.path.join(folder, "old.csv"), os.path.join(folder, "new.csv")
    with open(old, "w") as f:
        f.write(",".join(plots.COLUMNS[:-2]) + "\n")
        f.write(",".join(str(c) for c in sdpa_peers.peer_row("sdpa-flash", "f16", shape, False, "teaching", "GPU", 1.0,
                                                             1.0, 1.0, 15, 0, 1e-3, 1e-3)[:-2]) + "\n")
    with open(new, "w") as f:
        f.write(",".join(plots.COLUMNS) + "\n")
        for p in ("forward", "backward"):
            f.write(",".join(str(rows[p][c]) for c in plots.COLUMNS) + "\n")
    assert [r["pass"] for r in plots.load([old])] == ["forward"]
    assert all(r["gbps"] != r["gbps"] for r in plots.load([old]))  # NaN
    assert sorted(r["pass"] for r in plots.load([new])) == ["backward", "forward"]
    assert [r["pass"] for r in plots.load([old, new])].count("forward") == 1  # the same measurement, later file wins
# The course run's rows (suite "custom"): the forward's at the teaching and headline shapes (d = 64) stand for those
# suites in the figures (plots.py --course); the same shape's backward rows and the d = 128 rows stay as they are.
course = []
for pass_, sh in (("forward", shape), ("backward", shape), ("forward", (4, 4096, 4096, 16, 16, 64)),
                  ("forward", (4, 4096, 4096, 16, 16, 128))):
    course.append(dict(zip(plots.COLUMNS, sdpa_peers.peer_row("sdpa-flash", "f16", sh, False, "custom", "GPU", 1.0,
                                                              1.0, 1.0, 15, 0, 1e-3, 1e-3, pass_))))
    course[-1].update({k: int(course[-1][k]) for k in ("batch", "q_len", "kv_len", "q_heads", "kv_heads", "head_dim")})
assert [r["suite"] for r in plots.course_suites(course)] == ["teaching", "custom", "headline", "custom"]

# FlashAttention-4, a library peer: its rows are step fa4; it is refused, before any call, where it would compute
# another problem (f32; a causal mask with Nq != Nkv, which it aligns bottom-right); its backward is planned.
assert sdpa_peers.step_name("fa4") == "fa4" and sdpa_peers.step_name("cudnn") == "sdpa-cudnn"
assert "f16 and bf16" in sdpa_peers.refusal("fa4", shape, "f32", False)
assert "bottom-right" in sdpa_peers.refusal("fa4", (2, 100, 300, 8, 2, 64), "f16", True)
assert sdpa_peers.refusal("fa4", (2, 100, 300, 8, 2, 64), "f16", False) is None
assert sdpa_peers.refusal("cudnn", shape, "f32", True) is None
planned = sdpa_peers.plan(sdpa_peers.parse_args(["--dry-run", "--backends", "fa4", "--pass", "both", "--shape",
                                                 "4,4096,4096,16,16,128", "--dtypes", "bf16", "--causal", "no"]))
assert [m[-2:] for m in planned] == [("fa4", "forward"), ("fa4", "backward")], planned
# The model features (issue 58): the window's rule is keys_range_in's (problem.hpp), written again here and checked
# against a direct count; a window's FLOPs count its pairs; the suite column ends as fa-bench's does; SDPA refuses
# them by name, FA4 a window where it would align it otherwise (Nq != Nkv).
def seen(i, q_len, kv_len, causal, left, right):
    keys = [j for j in range(kv_len) if (not causal or j <= i) and (left < 0 or j >= i - left)
            and (causal or right < 0 or j <= i + right)]
    return (keys[0], keys[-1] + 1) if keys else None
for q_len, kv_len, causal, left, right in ((7, 7, False, 2, 1), (7, 7, True, 2, 5), (9, 4, False, 1, -1),
                                           (5, 12, False, -1, 0), (6, 6, True, -1, -1), (300, 100, False, 50, -1)):
    for i in range(q_len):
        first, last = sdpa_peers.key_range(i, q_len, kv_len, causal, (left, right))
        want = seen(i, q_len, kv_len, causal, left, right)
        assert (want is None and first == last) or (first, last) == want, (q_len, kv_len, causal, left, right, i)
window = sdpa_peers.Features((2, 1), 0.0, "", False)
assert sdpa_peers.flops((2, 7, 7, 4, 2, 64), False, "forward", window) == 4.0 * 2 * 4 * 64 * sum(
    sdpa_peers.key_range(i, 7, 7, False, (2, 1))[1] - sdpa_peers.key_range(i, 7, 7, False, (2, 1))[0] for i in range(7))
assert sdpa_peers.Features((1024, 0), 50.0, "50", True).suffix() == "-window1024_0-softcap50-sinks"
assert "SDPA takes no" in sdpa_peers.refusal("cudnn", shape, "f16", False, features=window)
assert "window bottom-right" in sdpa_peers.refusal("fa4", (1, 100, 300, 4, 4, 64), "f16", False, features=window)
assert sdpa_peers.refusal("fa4", (1, 300, 300, 4, 4, 64), "f16", True, features=window) is None
features_plan = sdpa_peers.plan(sdpa_peers.parse_args(["--dry-run", "--backends", "fa4", "--shape",
                                                       "1,4096,4096,16,16,128", "--dtypes", "bf16", "--causal", "yes",
                                                       "--window", "1024,0"]))
assert [m[0] for m in features_plan] == ["custom-window1024_0"], features_plan
with open(os.path.join(REPO, "bench", "fa_bench.cpp")) as f:
    bench_source = f.read()
assert '"-window" + std::to_string(window_left) + "_" + std::to_string(window_right)' in bench_source
assert '"-softcap" + args.get("softcap", "")' in bench_source and '"-sinks"' in bench_source
# A pack (--varlen): its count and longest length replace B, Nq and Nkv; the suite ends as fa-bench's; the FLOPs are
# each sequence's alone (causal: n^2 / 2 pairs, as AttentionProblem::flops), not the padded batch's.
pack = sdpa_peers.parse_args(["--dry-run", "--backends", "fa4,cudnn", "--shape", "1,1,1,16,16,128", "--dtypes", "bf16",
                              "--causal", "yes", "--varlen", "3,100,5"])
pack_plan = sdpa_peers.plan(pack)
assert {(m[0], m[1]) for m in pack_plan} == {("custom-varlen3_108", (3, 100, 100, 16, 16, 128))}, pack_plan
assert sdpa_peers.flops((3, 100, 100, 16, 16, 128), True, "forward", pack.features) == \
    4.0 * 16 * 128 * (9 + 10000 + 25) / 2
assert "packed lengths" in sdpa_peers.refusal("cudnn", (3, 100, 100, 16, 16, 128), "bf16", True, features=pack.features)
# The backward of a pack (step 56's peer): FlashAttention-4's flash_attn_varlen_func through autograd, planned with the
# same suite as fa-bench --suite backward --varlen, 2.5 times the forward's FLOPs; SDPA's backends refuse the pack.
pack_bwd = sdpa_peers.parse_args(["--dry-run", "--pass", "backward", "--backends", "fa4,flash", "--shape",
                                  "1,1,1,16,16,128", "--dtypes", "bf16", "--causal", "yes,no", "--varlen", "3,100,5"])
assert {(m[0], m[1], m[4], m[5]) for m in sdpa_peers.plan(pack_bwd)} == {
    ("custom-varlen3_108", (3, 100, 100, 16, 16, 128), backend, "backward") for backend in ("fa4", "flash")}
assert sdpa_peers.refusal("fa4", (3, 100, 100, 16, 16, 128), "bf16", True, "backward", features=pack_bwd.features) is None
assert "packed lengths" in sdpa_peers.refusal("flash", (3, 100, 100, 16, 16, 128), "bf16", True, "backward",
                                              features=pack_bwd.features)
assert sdpa_peers.flops((3, 100, 100, 16, 16, 128), True, "backward", pack_bwd.features) == \
    2.5 * sdpa_peers.flops((3, 100, 100, 16, 16, 128), True, "forward", pack_bwd.features)
assert '"-varlen" + std::to_string(shape.batch) + "_" + std::to_string(cu_seqlens.back())' in bench_source
import pack_lengths  # noqa: E402
mixed = pack_lengths.pack_lengths(100, 131072, 4096)
assert len(mixed) == 100 and sum(mixed) == 131072 and min(mixed) == 1 and max(mixed) == 4096, mixed
assert mixed == pack_lengths.pack_lengths(100, 131072, 4096), "the same arguments give the same pack"
# The Hopper tables: a rounds file's forward rows only, with an FA4 column and ratio where fa4 rows are present.
import tables  # noqa: E402
timed = []
for step, pass_, ms in (("24", "forward", 1.0), ("fa4", "forward", 0.9), ("sdpa-cudnn", "forward", 1.1),
                        ("sdpa-cudnn", "backward", 2.0), ("41", "backward", 2.5), ("fa4", "backward", 2.0)):
    row = dict(zip(plots.COLUMNS, sdpa_peers.peer_row(step, "f16", shape, False, "round1", "GPU", ms, ms, ms, 15, 0,
                                                      1e-3, 1e-3, pass_)))
    row.update({k: int(row[k]) for k in plots.INT_COLUMNS}, tflops=float(row["tflops"]), ms=ms)
    timed.append(row)
forward_table = tables.rounds(timed, ["24"]).splitlines()
assert forward_table[0].endswith("| best step | / cuDNN | / FA3 | / FA4 |"), forward_table[0]
assert forward_table[2].endswith("| 24 | 1.1 | – | 0.9 |"), forward_table[2]  # cuDNN's backward row left out
assert "FA4" not in tables.rounds([r for r in timed if r["step"] != "fa4"], ["24"])  # older files keep their tables
assert "| / FA4 |" in tables.backward(timed, ["41"]).splitlines()[0] + "|"
print("CSV columns: tools/plots.py, bench/sdpa_peers.py and bench/fa3_peer.py match fa-bench's header; "
      "the course run's shapes map to the teaching and headline suites; fa4 rows, refusals and table columns; the "
      "features' window rule, FLOPs and suite names; a pack's shape, FLOPs and lengths")
