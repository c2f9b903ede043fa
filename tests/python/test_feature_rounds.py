#!/usr/bin/env python3
"""The model features' rounds (bench/hopper_rounds.sh with FA_ROUND_FEATURES): merged into one CSV with each row's
feature kept in its suite (round<k>-window<L>_<R>, -softcap<C>, -sinks), the features' table (tools/tables.py
features) against the same step without the feature and FlashAttention-4 with it, and the rounds table left to the
rows without a feature. Plain asserts, no pytest, no torch.
"""
import csv
import os
import sys
import tempfile

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, os.path.join(REPO, "tools"))
import merge_rounds  # noqa: E402
import plots  # noqa: E402
import sdpa_peers  # noqa: E402
import tables  # noqa: E402

shape = (1, 16384, 16384, 16, 16, 128)


def row(step, ms, suite):
    return sdpa_peers.peer_row(step, "bf16", shape, True, suite, "GPU", ms, ms, ms, 30, 0, 1e-3, 1e-3, "forward")


# (side, round, feature tag) -> [(step, ms, suite as fa-bench or sdpa_peers.py writes it)]
timings = {
    ("ours", 1, "none"): [("49", 1.80, "custom"), ("51", 1.81, "custom")],
    ("ours", 2, "none"): [("49", 1.78, "custom"), ("51", 1.79, "custom")],
    ("ours", 1, "window"): [("49", 0.270, "custom-window1024_0")],
    ("ours", 2, "window"): [("49", 0.274, "custom-window1024_0")],
    ("ours", 1, "sinks"): [("51", 1.80, "custom-sinks")],
    ("ours", 2, "sinks"): [("51", 1.82, "custom-sinks")],
    ("peers", 1, "none"): [("fa4", 1.50, "custom")],
    ("peers", 2, "none"): [("fa4", 1.50, "custom")],
    ("peers", 1, "window"): [("fa4", 0.250, "custom-window1024_0")],
    ("peers", 2, "window"): [("fa4", 0.252, "custom-window1024_0")],
    ("peers", 1, "sinks"): [("fa4", 1.47, "custom-sinks")],
    ("peers", 2, "sinks"): [("fa4", 1.47, "custom-sinks")],
}
with tempfile.TemporaryDirectory() as folder:
    work = os.path.join(folder, "rounds")
    os.makedirs(work)
    for (side, round_, tag), rows in timings.items():
        with open(os.path.join(work, f"{side}-{round_}-1x16384_{tag}.csv"), "w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(plots.COLUMNS)
            writer.writerows(row(*r) for r in rows)
    out = os.path.join(folder, "rounds.csv")
    assert merge_rounds.merge(work, out) == 14
    with open(out, newline="") as f:
        suites = sorted({r["suite"] for r in csv.DictReader(f)})
    assert suites == ["round1", "round1-sinks", "round1-window1024_0", "round2", "round2-sinks",
                      "round2-window1024_0"], suites
    rows = plots.load([out])
    table = tables.features(rows)
    cells = {}
    for line in table.splitlines():
        parts = [c.strip() for c in line.strip("|").split("|")]
        if len(parts) == 11 and parts[0] in ("window1024_0", "sinks"):
            cells[(parts[0], parts[5])] = parts
    assert set(cells) == {("window1024_0", "49"), ("sinks", "51")}, table
    window = cells[("window1024_0", "49")]
    assert abs(float(window[6]) - 0.272) < 1e-6 and abs(float(window[7]) - 1.79) < 1e-6, window   # medians of 2
    assert abs(float(window[8]) - 1.79 / 0.272) < 0.01, window                                     # without / with
    assert abs(float(window[9]) - 0.251) < 1e-6 and abs(float(window[10]) - 0.251 / 0.272) < 0.01, window
    sinks = cells[("sinks", "51")]
    assert abs(float(sinks[8]) - 1.80 / 1.81) < 0.01 and abs(float(sinks[10]) - 1.47 / 1.81) < 0.01, sinks
    assert "medians of 2 alternating rounds" in table, table
    # The rounds table takes the rows without a feature only: step 49's TFLOPS there are its full causal ones.
    plain = tables.rounds(rows, ["49"])
    line = next(t for t in plain.splitlines() if t.startswith("| 128 |"))
    tflops = [r["tflops"] for r in rows if r["suite"] in ("round1", "round2") and r["step"] == "49"]
    assert f"{tables._median(tflops):.1f}"[:3] in line, (plain, tflops)

    # The backward's rounds: its features table (pass_="backward") reads only the backward's rows, and the backward
    # table leaves a feature's rounds out (they share its configuration) and counts rounds, not suites.
    def backward_row(step, ms, suite):
        return sdpa_peers.peer_row(step, "bf16", shape, True, suite, "GPU", ms, ms, ms, 30, 0, 1e-3, 1e-3, "backward")
    with open(out, "a", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerows(backward_row(*r) for r in
                         [("53", 5.3, "round1"), ("53", 5.4, "round2"), ("53", 0.90, "round1-window1024_0"),
                          ("53", 0.92, "round2-window1024_0"), ("fa4", 0.80, "round1-window1024_0"),
                          ("fa4", 0.82, "round2-window1024_0")])
    rows = plots.load([out])
    assert "| 49 |" in tables.features(rows) and "| 53 |" not in tables.features(rows)
    table = tables.features(rows, pass_="backward")
    line = next(t for t in table.splitlines() if "| 53 |" in t)
    parts = [c.strip() for c in line.strip("|").split("|")]
    assert parts[0] == "window1024_0" and abs(float(parts[6]) - 0.91) < 1e-6 and abs(float(parts[7]) - 5.35) < 1e-6
    assert abs(float(parts[10]) - 0.81 / 0.91) < 0.01 and "| 49 |" not in table, table
    assert table.rstrip().endswith("(steps, then peers, per shape and feature).") and "medians of 2" in table, table
    plain = tables.backward(rows, ["53"])
    line = next(t for t in plain.splitlines() if t.startswith("| 128 |"))
    assert "| 5.35 |" in line and "medians of 2 alternating rounds" in plain, plain

# Issue 58's bars (tables.py feature-bars) from one CSV of bench/features_run.sh: a window, a cap and sinks against
# FA4 and against the step without them, a pack against FA4 and its own fixed-length TFLOPS, head_dim 256 against
# the faster of FA4 and cuDNN; the fastest step with the feature is the one read; a bar without rows is never met.
def bar_row(step, ms, suite, shape=shape, pass_="forward", causal=True, tflops=None):
    r = sdpa_peers.peer_row(step, "bf16", shape, causal, suite, "GPU", ms, ms, ms, 30, 0, 1e-3, 1e-3, pass_)
    if tflops is not None:
        r[11] = str(tflops)
    return r


d256 = (4, 4096, 4096, 16, 16, 256)
fixed = (32, 4096, 4096, 16, 16, 128)
pack = (100, 4096, 4096, 16, 16, 128)  # as fa-bench writes a pack's row: its count of sequences, the longest
entries = []
for k in (1, 2):
    entries += [bar_row("49", 1.80, f"round{k}"), bar_row("49", 0.26, f"round{k}-window1024_0"),   # 6.9x: met
                bar_row("fa4", 0.25, f"round{k}-window1024_0"),                                      # 0.96x: met
                bar_row("49", 0.6, f"round{k}", (4, 4096, 4096, 16, 16, 128)),      # at 4k: no 6.5x bar, FA4's not met
                bar_row("49", 0.2, f"round{k}-window1024_0", (4, 4096, 4096, 16, 16, 128)),
                bar_row("50", 1.80, f"round{k}"), bar_row("50", 2.00, f"round{k}-softcap50"),         # 0.90x: no
                bar_row("fa4", 2.10, f"round{k}-softcap50"),
                bar_row("51", 1.80, f"round{k}"), bar_row("25", 1.70, f"round{k}"),
                bar_row("51", 1.82, f"round{k}-sinks"),                               # 0.989x: met; no FA4 row
                bar_row("52", 10.0, f"round{k}", fixed, tflops=600), bar_row("52", 5.0, f"round{k}-varlen100_131072",
                                                                           pack, tflops=580),        # 0.967x: met
                bar_row("fa4", 4.5, f"round{k}-varlen100_131072", pack, tflops=620),                 # 0.9x: no
                bar_row("fa4", 1.5, f"round{k}"), bar_row("fa4", 9.0, f"round{k}", fixed, tflops=650),  # FA4's own
                bar_row("58", 6.7, f"round{k}", d256, "backward", False), bar_row("61", 6.8, f"round{k}", d256,
                                                                                  "backward", False),
                bar_row("fa4", 7.4, f"round{k}", d256, "backward", False),
                bar_row("sdpa-cudnn", 7.1, f"round{k}", d256, "backward", False)]                  # 7.1 / 6.7: met
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "features.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(plots.COLUMNS)
        w.writerows(entries)
    table = tables.feature_bars(plots.load([path]))
got = {}  # each bar's first line (the 16k configuration's, where a bar has two)
for line in table.splitlines():
    if line.startswith("| "):
        got.setdefault(tuple(c.strip() for c in line.strip("|").split("|"))[0], line)
assert got["full causal / window1024_0"].endswith("| 6.5 | yes |") and "| 49 |" in got["full causal / window1024_0"], table
assert got["window1024_0 / FA4"].endswith("| 0.95 | yes |"), table
assert got["softcap50: without / with"].endswith("| 0.95 | no |"), table
assert got["softcap50 / FA4"].endswith("| 0.95 | yes |"), table
assert got["sinks / FA4"].endswith("| not measured |") and got["sinks: without / with"].endswith("| yes |"), table
assert "580.0 / 600.0 TFLOPS (32 x 4096)" in got["varlen100_131072 / fixed length"], table
assert got["varlen100_131072 / fixed length"].endswith("| yes |") and got["varlen100_131072 / FA4"].endswith("| no |")
d256_bar = got["head_dim 256 / the faster of FA4 and cuDNN"]
assert "| backward | 256 |" in d256_bar and "| 58 |" in d256_bar and "cuDNN 7.1 / 6.7 ms" in d256_bar, d256_bar
assert d256_bar.endswith("| yes |") and "6 of 10 bars met" in table, table
assert sum(1 for line in table.splitlines() if line.startswith("| full causal /")) == 1, table  # 16k only
# With one of the two head_dim 256 peers timed, "the faster of the two" is not measured, whatever the one says.
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "features.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(plots.COLUMNS)
        w.writerows(r for r in entries if r[0] != "fa4")
    one_peer = tables.feature_bars(plots.load([path]))
assert "(1 of the 2 peers timed) | – | 0.95 | not measured |" in one_peer, one_peer
assert "| window1024_0 / FA4 | forward | 128 | 4, 4096, 16 | bf16 | yes | 49 | FA4 – / 0.2 ms = –x | – | 0.95 | not measured |" \
    in table, table
# Beside each bar against the step's own time, FA4's reading of the same bar from its rows: 1.5 / 0.25 ms with the
# window, 1.5 / 2.1 with the cap, 620 / 650 TFLOPS for its pack; none where its rows are missing (sinks) or the bar
# is against FA4 itself.
assert "= 6.92x | 6x | 6.5 | yes |" in got["full causal / window1024_0"], table
assert "| 0.714x | 0.95 | no |" in got["softcap50: without / with"], table
assert "| 0.954x | 0.95 | yes |" in got["varlen100_131072 / fixed length"], table
assert got["sinks: without / with"].endswith("| – | 0.95 | yes |") and "| – | 0.95 |" in got["softcap50 / FA4"], table

print("features' rounds: merged by feature, table against none and FA4, rounds table without features; the "
      "backward's features apart from its plain rounds; issue 58's bars from one run")
