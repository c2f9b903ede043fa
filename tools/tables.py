#!/usr/bin/env python3
"""Markdown tables from fa-bench CSVs, for the step READMEs and the top README.

Every number in a README table is pasted from this script's output, so it can be
checked against the recorded CSV (docs/results/) at any time:

    python3 tools/tables.py times --suite teaching [--steps 04,05] [--dtypes f32,f16] [--causal 0,1] [--head-dim 64]
                                               # without --steps: every step of the suite, then the peers
    python3 tools/tables.py accuracy --steps 06-br16,07-double,07-ff [--suite accuracy]
    python3 tools/tables.py course             # the top README's step table
    python3 tools/tables.py compare --old old.csv --new new.csv [--pair 13=09]   # an old tree against a new one
    python3 tools/tables.py rounds --csv docs/results/X.csv [--steps 20,21,24] [--head-dim 128]
                                               # medians over alternating rounds (bench/hopper_rounds.sh)
    python3 tools/tables.py backward --csv out/bwd.csv [--steps 26,27] [--head-dim 128] [--suite backward]
                                               # the backward's steps against SDPA's flash and cuDNN and FA3
    python3 tools/tables.py decode --csv docs/results/X.csv [--steps 42,43,44]
                                               # the decode steps' TB/s against SDPA's flash and cuDNN
    python3 tools/tables.py pages --csv docs/results/ablations/X.csv [--steps 45]
                                               # a paged cache (fa-bench --page-size N) against the contiguous one
    python3 tools/tables.py decode-bars --csv out/roofline.csv [--steps 47,48]
                                               # issue 57's bars (ceiling, pages, new tokens) from one roofline run
    python3 tools/tables.py parts --csv docs/results/X-course.csv [Y-course.csv] [--part hopper] [--dtype f32]
                                               # the top README's tables, one a part of the course, from the
                                               # one recorded run (bench/course_run.sh) of each GPU, side by side
    python3 tools/tables.py context --csv docs/results/context_parallel/X.csv
                                               # context parallelism (bench/cp_bench.py): each form's median over
                                               # its rounds, of one GPU's throughput, against PyTorch's
    python3 tools/tables.py parts --check README.md    # every generated table block in README.md, re-printed
    python3 tools/tables.py parts --write README.md    # from the CSV its marker names: compare, or rewrite

It reads docs/results/*.csv unless --csv is given (`context` reads cp_bench's CSV, which it names), through tools/plots.py's loader. Every table but
`backward` and `decode` reads the forward's rows (`--pass backward` makes times, accuracy, course, compare and rounds
read the backward's instead); a CSV recorded before the `pass` column holds forward rows only.
"""
from __future__ import annotations

import argparse
import statistics
import glob
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plots  # noqa: E402  the one CSV loader (plots.load) and row labels (plots.label)


def _fmt(value: float, digits: int = 3) -> str:
    """A number with `digits` significant digits, '–' for a missing one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if value >= 100:
        return f"{value:.0f}" if value >= 1000 else f"{value:.1f}"
    return f"{value:.{digits}g}"


def _sci(value: float) -> str:
    """Errors in scientific notation."""
    return "–" if value is None or math.isnan(value) else f"{value:.1e}"


def _label(row: dict) -> str:
    """A step's or peer's label in a table: its id, with its variant ("50-tanh", "48-bps2", "sdpa-cudnn")."""
    return row["step"] + (f"-{row['variant']}" if row["variant"] else "")


def _matches(row: dict, labels: list[str]) -> bool:
    """True when the row's step id or label ("05", "05-pad1", "cublas", "sdpa-flash") is listed."""
    return row["step"] in labels or _label(row) in labels


def _name(row: dict) -> str:
    """Short label for a table cell: '05-pad1', 'cuBLAS standard attention (peer)'."""
    return plots.label(row)


def times(rows, suite, steps, dtypes, causals, head_dim=None, baseline="cublas") -> str:
    """ms, TFLOPS, speedup over the fastest variant of the nearest earlier listed step, and over the baseline.

    A suite with several shapes (sweep, custom) gets a shape column, and each ratio compares rows of one shape."""
    def shape(r):
        return (r["batch"], r["q_heads"], r["kv_heads"], r["q_len"], r["kv_len"], r["head_dim"])

    picked = [r for r in plots.select(rows, suite=suite) if head_dim is None or r["head_dim"] == head_dim]
    shapes = sorted({shape(r) for r in picked})
    many = len(shapes) > 1
    lines = ["| " + ("shape (B, H/Hkv, Nq×Nkv, d) | " if many else "") +
             "step | dtype | causal | ms | TFLOPS | × previous step | × cuBLAS | rel. error |",
             "|" + ("---|" if many else "") + "---|---|---|---:|---:|---:|---:|---:|"]
    for dtype in dtypes:
        for causal in causals:
            for s in shapes:
                chosen = [r for r in plots.select(rows, suite=suite, dtype=dtype, causal=causal) if shape(r) == s]
                base = [r for r in chosen if r["step"] == baseline]
                base_ms = base[0]["ms"] if base else math.nan
                listed = [r for label in steps for r in chosen if _matches(r, [label])]
                listed = [r for i, r in enumerate(listed) if all(r is not q for q in listed[:i])]  # "11,11-f32": once
                if not [r for r in listed if r["step"] != baseline]:
                    continue  # nothing but the baseline at this shape
                best_ms: dict[str, float] = {}  # fastest variant of each course step listed
                for r in listed:
                    if not plots.is_peer(r):
                        best_ms[r["step"]] = min(best_ms.get(r["step"], math.inf), r["ms"])
                cell = f"| {s[0]}, {s[1]}/{s[2]}, {s[3]}×{s[4]}, {s[5]} " if many else ""
                for r in listed:
                    earlier = [k for k in best_ms if k < r["step"]] if not plots.is_peer(r) else []
                    prev = f"{_fmt(best_ms[max(earlier)] / r['ms'])}×" if earlier else "–"
                    vs_base = f"{_fmt(base_ms / r['ms'])}×" if not math.isnan(base_ms) else "–"  # no cuBLAS row
                    lines.append(f"{cell}| {_name(r)} | {dtype} | {'yes' if causal else 'no'} | {_fmt(r['ms'], 4)} | "
                                 f"{_fmt(r['tflops'])} | {prev} | {vs_base} | {_sci(r['rel_err'])} |")
    return "\n".join(lines)


def accuracy(rows, steps, suite="accuracy", dtype="f32") -> str:
    """Relative L2 and max abs error against the float64 reference, one row per N, one column pair per step."""
    chosen = [r for r in plots.select(rows, suite=suite, dtype=dtype) if _matches(r, steps)]
    names = sorted({_name(r) for r in chosen}, key=plots.order_key)
    lengths = sorted({r["kv_len"] for r in chosen})
    header = "| N | " + " | ".join(f"{n} rel L2 | {n} max abs" for n in names) + " |"
    lines = [header, "|---:|" + "---:|" * (2 * len(names))]
    for n in lengths:
        cells = []
        for name in names:
            r = [r for r in chosen if _name(r) == name and r["kv_len"] == n]
            cells += [_sci(r[0]["rel_err"]), _sci(r[0].get("max_err", math.nan))] if r else ["–", "–"]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def course(rows, dtype="f32", causal=0) -> str:
    """The top README's table: each step's fastest variant at the teaching and headline shapes (d = 64)."""
    suites = ("teaching", "headline")
    best: dict[str, dict[str, dict]] = {}  # step id -> suite -> fastest row
    for suite in suites:
        for r in plots.select(rows, suite=suite, dtype=dtype, causal=causal, head_dim=64):
            if r["step"] not in best or suite not in best[r["step"]] or r["ms"] < best[r["step"]][suite]["ms"]:
                best.setdefault(r["step"], {})[suite] = r
    ids = sorted(k for k in best if not plots.is_peer({"step": k}))
    ids += sorted(k for k in best if plots.is_peer({"step": k}))
    lines = ["| step (fastest variant) | teaching ms | TFLOPS | × previous | headline ms | TFLOPS | × previous |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    previous: dict[str, float] = {}
    for step_id in ids:
        variants = sorted({best[step_id][s]["variant"] for s in best[step_id] if best[step_id][s]["variant"]})
        name = _name(next(iter(best[step_id].values())))
        name = name.split("-")[0] + (f" ({', '.join(variants)})" if variants else "") \
            if not plots.is_peer({"step": step_id}) else name
        cells = [name]
        for suite in suites:
            r = best[step_id].get(suite)
            if r is None:
                cells += ["–", "–", "–"]
                continue
            prev = previous.get(suite)
            cells += [_fmt(r["ms"], 4), _fmt(r["tflops"]),
                      f"{_fmt(prev / r['ms'])}×" if prev and not plots.is_peer(r) else "–"]
            if not plots.is_peer(r):
                previous[suite] = r["ms"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compare(old_rows, new_rows, pairs=(), limit=1.03) -> str:
    """New against old, config by config: every label measured in both, and each NEW=OLD pair (a bare
    step id stands for its fastest variant on that configuration). `limit` marks what got slower.
    Each side may be one list of rows or a list of lists, one per CSV (the rounds of an alternating
    A/B): then a time is the median over the CSVs of that CSV's time."""
    def rounds_of(rows):
        return rows if rows and isinstance(rows[0], list) else [rows]
    old_sets, new_sets = rounds_of(old_rows), rounds_of(new_rows)
    old_rows = [r for rows in old_sets for r in rows]
    new_rows = [r for rows in new_sets for r in rows]
    def key(r):
        return (r["suite"], r["dtype"], r["causal"], r["batch"], r["q_len"], r["kv_len"], r["q_heads"], r["head_dim"])

    def fastest_one(rows, name, k):
        here = [r for r in rows if key(r) == k]
        hits = [r for r in here if _name(r) == name] or [r for r in here if r["step"] == name]
        return min(hits, key=lambda r: r["ms"]) if hits else None

    def fastest(sets, name, k):
        found = [row for row in (fastest_one(rows, name, k) for rows in sets) if row]
        if not found:
            return None
        return {**found[0], "ms": statistics.median(r["ms"] for r in found)}

    names = sorted({_name(r) for r in new_rows} & {_name(r) for r in old_rows}, key=plots.order_key)
    wanted = [(n, n) for n in names] + [tuple(p.split("=", 1)) for p in pairs]
    lines = ["| new | old | suite | dtype | causal | d | old ms | new ms | new / old |",
             "|---|---|---|---|---|---:|---:|---:|---:|"]
    slower = 0
    for new_name, old_name in wanted:
        for k in sorted({key(r) for r in new_rows}):
            new, old = fastest(new_sets, new_name, k), fastest(old_sets, old_name, k)
            if not new or not old:
                continue
            ratio = new["ms"] / old["ms"]
            mark = " **slower**" if ratio > limit else ""
            slower += ratio > limit
            lines.append(f"| {new_name} | {old_name} | {k[0]} | {k[1]} | {'yes' if k[2] else 'no'} | {k[7]} | "
                         f"{_fmt(old['ms'], 4)} | {_fmt(new['ms'], 4)} | {ratio:.3f}{mark} |")
    lines.append(f"\n{len(lines) - 2} comparisons, {slower} more than {100 * (limit - 1):.0f} % slower")
    return "\n".join(lines)


def library_peers(rows) -> list:
    """The peers of the Hopper tables: SDPA's FlashAttention-2 and cuDNN and FlashAttention-3, and
    FlashAttention-4 where the rows hold it (files from before it was timed keep their tables)."""
    return ["sdpa-flash", "sdpa-cudnn", "fa3"] + (["fa4"] if any(r["step"] == "fa4" for r in rows) else [])


def _config(row: dict) -> tuple:
    """A rounds table's configuration: (d, B, Nq, Hq, dtype, causal)."""
    return (row["head_dim"], row["batch"], row["q_len"], row["q_heads"], row["dtype"], row["causal"])


def rounds(rows, steps, head_dim=None) -> str:
    """TFLOPS per configuration of the forward, the median over the rounds of bench/hopper_rounds.sh (rows
    whose suite is round1, round2, ...), for the listed steps and every peer; then the fastest listed step
    against cuDNN, FlashAttention-3 (and FlashAttention-4 where timed), each ratio from the two medians."""
    picked = [r for r in rows if re.fullmatch(r"round\d+", r["suite"]) and r.get("pass", "forward") == "forward"
              and (head_dim is None or r["head_dim"] == head_dim)]
    peers = library_peers(picked)
    versus = [p for p in peers if p != "sdpa-flash"]
    columns = [s for s in steps] + peers
    config, name = _config, _label

    samples: dict = {}
    for r in picked:
        samples.setdefault((config(r), name(r)), []).append(r["tflops"])
    med = {k: sorted(v)[len(v) // 2] if len(v) % 2 else sum(sorted(v)[len(v) // 2 - 1:len(v) // 2 + 1]) / 2
           for k, v in samples.items()}
    n_rounds = len({r["suite"] for r in picked})
    head = (["d", "B, N, H", "dtype", "causal"] + [PEER_COLUMN.get(c, c) for c in columns] + ["best step"]
            + [f"/ {PEER_COLUMN[p]}" for p in versus])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 4 + "---:|" * (len(columns) + 1 + len(versus))]
    for cfg in sorted({config(r) for r in picked}, key=lambda c: (-c[0], c[1], c[4], c[5])):
        d, b, n, h, dtype, causal = cfg
        cells = [med.get((cfg, c)) for c in columns]
        ours = [(med[(cfg, s)], s) for s in steps if (cfg, s) in med and "-" not in s]
        best, best_step = max(ours) if ours else (None, "–")
        ratio = lambda peer: _fmt(best / med[(cfg, peer)]) if best and (cfg, peer) in med else "–"  # noqa: E731
        lines.append(f"| {d} | {b}, {n}, {h} | {dtype} | {'yes' if causal else 'no'} | "
                     + " | ".join(_fmt(c) for c in cells) + f" | {best_step} | "
                     + " | ".join(ratio(p) for p in versus) + " |")
    lines.append(f"\nTFLOPS, medians of {n_rounds} alternating rounds (steps, then peers, per shape).")
    return "\n".join(lines)


def features(rows, steps=(), pass_="forward") -> str:
    """The model features' table (issue 58's bars), from bench/hopper_rounds.sh's rounds with FA_ROUND_FEATURES:
    per configuration and feature (the suite's suffix after round<k>: -window<L>_<R>, -softcap<C>, -sinks,
    -varlen<n>_<tokens>), the median ms over the rounds of each listed step (default every course step in the rows)
    with the feature, of the same step without it (suite round<k>), and of FlashAttention-4 with it; then with /
    without (> 1: the feature made it faster) and FA4 / step (> 1: the step is faster). One pass a table: the
    forward's rows, or the backward's (pass_)."""
    picked = [r for r in rows if re.fullmatch(r"round\d+(-.+)?", r["suite"]) and r.get("pass", "forward") == pass_]

    def feature(r):
        return r["suite"].split("-", 1)[1] if "-" in r["suite"] else ""

    config, name = _config, _label
    samples: dict = {}
    for r in picked:
        samples.setdefault((config(r), feature(r), name(r)), []).append(r["ms"])
    med = {k: _median(v) for k, v in samples.items()}
    names = list(steps) or sorted({k[2] for k in med if not plots.is_peer({"step": k[2]})}, key=plots.order_key)
    lines = ["| feature | d | B, N, H | dtype | causal | step | ms | without | with / without | FA4 ms | FA4 / step |",
             "|---|---|---|---|---|---|---:|---:|---:|---:|---:|"]
    for cfg, feat in sorted({(k[0], k[1]) for k in med if k[1]}, key=lambda c: (c[1], -c[0][0], c[0][1:])):
        d, b, n, h, dtype, causal = cfg
        fa4 = med.get((cfg, feat, "fa4"))
        for name in names:
            ms = med.get((cfg, feat, name))
            if ms is None:
                continue
            without = med.get((cfg, "", name))
            lines.append(f"| {feat} | {d} | {b}, {n}, {h} | {dtype} | {'yes' if causal else 'no'} | {name} | "
                         f"{_fmt(ms, 4)} | {_fmt(without, 4) if without else '–'} | "
                         f"{_fmt(without / ms) if without else '–'} | {_fmt(fa4, 4) if fa4 else '–'} | "
                         f"{_fmt(fa4 / ms) if fa4 else '–'} |")
    # The rounds a median is of; where a part of a run was cut short, its rows have fewer, and the table says so.
    counts = sorted({len(samples[k]) for k in samples})
    n_rounds = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    lines.append(f"\n{'The backward: ' if pass_ == 'backward' else ''}ms, medians of {n_rounds} alternating rounds "
                 "(steps, then peers, per shape and feature).")
    return "\n".join(lines)


def feature_bars(rows) -> str:
    """Issue 58's done-when read from one CSV of bench/features_run.sh (medians over its rounds), forward and
    backward: for a window, a cap and sinks, at each configuration timed with them, the step fastest with the feature
    against FlashAttention-4 with it (>= 0.95x) and against itself without it (a window: >= 6.5x faster than the full
    causal problem, at 16k tokens; a cap or sinks: within 5 %, >= 0.95x); for a pack (varlen), the step fastest on it against FA4 on
    it (>= 0.95x) and its TFLOPS against its own at the fixed-length shape of as many tokens (>= 0.95x); at head_dim
    256, the fastest step against the faster of FA4 and cuDNN (>= 0.95x; both timed). A bar without its rows is
    listed as not measured, never as met. Beside each bar against the step's own time, FlashAttention-4's reading of
    the same bar from its rows in the same CSV (its time without the feature over its time with it, its pack's TFLOPS
    over its fixed length's): what the library itself reaches there."""
    picked = [r for r in rows if re.fullmatch(r"round\d+(-.+)?", r["suite"])]

    def feature(r):
        return r["suite"].split("-", 1)[1] if "-" in r["suite"] else ""

    ms_of: dict = {}
    tflops_of: dict = {}
    for r in picked:
        key = (r.get("pass", "forward"), _config(r), feature(r), _label(r))
        ms_of.setdefault(key, []).append(r["ms"])
        tflops_of.setdefault(key, []).append(r["tflops"])
    med = {k: _median(v) for k, v in ms_of.items()}
    med_tflops = {k: _median(v) for k, v in tflops_of.items()}
    lines = ["| bar | pass | d | B, N, H | dtype | causal | step | measured | FA4 on the same bar | bar | met |",
             "|---|---|---|---|---|---|---|---:|---:|---:|---|"]
    met = total = 0

    def ratio(num, den):
        return _fmt(num / den) + "x" if num and den else "–"

    def bar(name, key, step, value, need, text, fa4_own="–"):
        nonlocal met, total
        total += 1
        ok = value is not None and value >= need
        met += ok
        pass_, (d, b, n, h, dtype, causal) = key[0], key[1]
        lines.append(f"| {name} | {pass_} | {d} | {b}, {n}, {h} | {dtype} | {'yes' if causal else 'no'} | {step} | "
                     f"{text} | {fa4_own} | {_fmt(need)} | "
                     f"{'yes' if ok else 'no' if value is not None else 'not measured'} |")

    def fastest(pass_, cfg, feat):
        ours = [(ms, label) for (p, c, f, label), ms in med.items()
                if (p, c, f) == (pass_, cfg, feat) and not plots.is_peer({"step": label.split("-")[0]})]
        return min(ours) if ours else (None, None)

    for pass_, cfg, feat in sorted({k[:3] for k in med if k[2]}, key=lambda k: (k[2], k[0], k[1])):
        ms, step = fastest(pass_, cfg, feat)
        if ms is None:
            continue
        fa4 = med.get((pass_, cfg, feat, "fa4"))
        bar(f"{feat} / FA4", (pass_, cfg), step, fa4 / ms if fa4 else None, 0.95,
            f"FA4 {_fmt(fa4, 4)} / {_fmt(ms, 4)} ms = {_fmt(fa4 / ms) if fa4 else '–'}x")
        if feat.startswith("varlen"):  # its own TFLOPS at the fixed-length shape of as many tokens, same step
            tokens = int(feat.rsplit("_", 1)[1])
            fixed = [(k, v) for k, v in med_tflops.items() if k[0] == pass_ and not k[2] and k[3] == step
                     and k[1][0] == cfg[0] and k[1][4:] == cfg[4:] and k[1][1] * k[1][2] == tokens]
            pack = med_tflops.get((pass_, cfg, feat, step))
            if fixed and pack:
                (_, fixed_cfg, _, _), fixed_tflops = fixed[0]
                _, fb, fn, *_ = fixed_cfg
                bar(f"{feat} / fixed length", (pass_, cfg), step, pack / fixed_tflops, 0.95,
                    f"{_fmt(pack)} / {_fmt(fixed_tflops)} TFLOPS ({fb} x {fn}) = {_fmt(pack / fixed_tflops)}x",
                    ratio(med_tflops.get((pass_, cfg, feat, "fa4")), med_tflops.get((pass_, fixed_cfg, "", "fa4"))))
            else:
                bar(f"{feat} / fixed length", (pass_, cfg), step, None, 0.95, "the fixed-length rows: not in the CSV")
            continue
        without = med.get((pass_, cfg, "", step))
        fa4_own = ratio(med.get((pass_, cfg, "", "fa4")), fa4)
        if feat.startswith("window"):
            if cfg[2] < 16384:  # the 6.5x is over 16k tokens (8x less work); a shorter problem saves less
                continue
            bar(f"full causal / {feat}", (pass_, cfg), step, without / ms if without else None, 6.5,
                f"{_fmt(without, 4)} / {_fmt(ms, 4)} ms = {_fmt(without / ms) if without else '–'}x", fa4_own)
        else:
            bar(f"{feat}: without / with", (pass_, cfg), step, without / ms if without else None, 0.95,
                f"{_fmt(without, 4)} / {_fmt(ms, 4)} ms = {_fmt(without / ms) if without else '–'}x", fa4_own)
    for pass_, cfg in sorted({k[:2] for k in med if not k[2] and k[1][0] == 256}):
        ms, step = fastest(pass_, cfg, "")
        peers = [(med[(pass_, cfg, "", p)], p) for p in ("fa4", "sdpa-cudnn") if (pass_, cfg, "", p) in med]
        if ms is None:
            continue
        peer_ms, peer = min(peers) if peers else (None, None)
        both = len(peers) == 2  # "the faster of the two" needs both: with one timed, the bar is not measured
        bar("head_dim 256 / the faster of FA4 and cuDNN", (pass_, cfg), step, peer_ms / ms if both else None, 0.95,
            f"{PEER_COLUMN.get(peer, peer)} {_fmt(peer_ms, 4)} / {_fmt(ms, 4)} ms = "
            f"{_fmt(peer_ms / ms) if peers else '–'}x" + ("" if both else f" ({len(peers)} of the 2 peers timed)"))
    lines.append(f"\n{met} of {total} bars met (medians of the rounds).")
    return "\n".join(lines)


#: Column titles of the peers in the rounds table.
PEER_COLUMN = {"sdpa-flash": "FA2", "sdpa-cudnn": "cuDNN", "fa3": "FA3", "fa4": "FA4"}


def _median(values: list[float]) -> float:
    """The median (the mean of the middle two of an even count)."""
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def backward(rows, steps=(), head_dim=None, suite=None) -> str:
    """The backward's table: per configuration (d, shape, dtype, causal), the ms and TFLOPS (2.5 x the forward's
    FLOPs / t) of each listed backward step (default: every one in the rows) and of each peer, medians over the
    rows of that configuration (the rounds of bench/hopper_rounds.sh, or repeated runs), then the fastest listed
    step and each peer's time over its time (> 1: the step is faster), from the medians."""
    # A feature's rounds (suite round<k>-<feature>) share their configuration with the rounds without it: they
    # are the features table's (features(..., pass_="backward")), not this one's.
    picked = [r for r in plots.select(rows, **{"pass": "backward"})
              if (head_dim is None or r["head_dim"] == head_dim) and (suite is None or r["suite"] == suite)
              and not re.fullmatch(r"round\d+-.+", r["suite"])]
    peers = library_peers(picked)

    name = _label
    steps = list(steps) or sorted({name(r) for r in picked if not plots.is_peer(r)}, key=plots.order_key)
    columns = steps + peers

    def config(r):
        return (r["head_dim"], r["batch"], r["q_len"], r["kv_len"], r["q_heads"], r["kv_heads"], r["dtype"],
                r["causal"])

    # A listed step id stands for its only variant; where the rows hold several (an ablation), for its plain rows.
    names_of: dict = {}
    for r in picked:
        names_of.setdefault(r["step"], set()).add(name(r))
    samples: dict = {}
    for r in picked:
        labels = {name(r)} | ({r["step"]} if len(names_of[r["step"]]) == 1 else set())
        for label in labels & set(columns):
            samples.setdefault((config(r), label), []).append(r)
    ms = {k: _median([r["ms"] for r in v]) for k, v in samples.items()}
    tflops = {k: _median([r["tflops"] for r in v]) for k, v in samples.items()}
    head = (["d", "B, N, H", "dtype", "causal"] + [f"{PEER_COLUMN.get(c, c)} {unit}" for c in columns
                                                   for unit in ("ms", "TFLOPS")]
            + ["best step"] + [f"/ {PEER_COLUMN[p]}" for p in peers])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 4 + "---:|" * (2 * len(columns) + 1 + len(peers))]

    def order(c):
        d, b, nq, nkv, hq, _, dtype, causal = c
        return (d, b * hq * nq * nkv, b, dtype, causal)

    for cfg in sorted({config(r) for r in picked}, key=order):
        d, b, nq, nkv, hq, hkv, dtype, causal = cfg
        ours = [(ms[(cfg, s)], s) for s in steps if (cfg, s) in ms and not s.endswith("old")]
        best_ms, best_step = min(ours) if ours else (None, "–")  # no step: the peers alone
        cells = []
        for c in columns:
            cells += [_fmt(ms.get((cfg, c)), 4), _fmt(tflops.get((cfg, c)))]
        ratios = [f"{_fmt(ms[(cfg, p)] / best_ms)}×" if best_ms and (cfg, p) in ms else "–" for p in peers]
        n = f"{nq}" if nq == nkv else f"{nq}×{nkv}"
        h = f"{hq}" if hq == hkv else f"{hq}/{hkv}"
        lines.append(f"| {d} | {b}, {n}, {h} | {dtype} | {'yes' if causal else 'no'} | " + " | ".join(cells)
                     + f" | {best_step} | " + " | ".join(ratios) + " |")
    rounds = sorted({r["suite"] for r in picked if r["suite"].startswith("round")})
    lines.append("\nThe backward: ms and TFLOPS (2.5 × the forward's FLOPs / t), "
                 + (f"medians of {len(rounds)} alternating rounds" if rounds else "medians over the rows of each shape")
                 + "; / peer: the peer's time over the fastest step's (> 1: the step is faster).")
    return "\n".join(lines)


def decode(rows, steps=(), suite=None) -> str:
    """The decode table: per shape (B, kv_len, heads, d, dtype), each listed decode-pass step's (default: every
    one in the rows) and each SDPA peer's effective bandwidth in TB/s (bytes of K and V read once over the time,
    the CSV's gbps), medians over the rows of the shape (the rounds); then the fastest step, and its bandwidth
    over cuDNN's (> 1: the step is faster)."""
    picked = [r for r in plots.select(rows, **{"pass": "decode"}) if suite is None or r["suite"] == suite]
    peers = ["sdpa-flash", "sdpa-cudnn"]
    steps = list(steps) or sorted({r["step"] for r in picked if not plots.is_peer(r) and r["step"] != "cublas"},
                                  key=plots.order_key)
    columns = steps + peers

    def config(r):
        return (r["batch"], r["kv_len"], r["q_heads"], r["kv_heads"], r["head_dim"], r["dtype"])

    tbps: dict = {}
    for r in picked:
        if r["step"] in columns:
            tbps.setdefault((config(r), r["step"]), []).append(r["gbps"] / 1000)
    med = {k: _median(v) for k, v in tbps.items()}
    head = ["B", "kv_len", "heads", "d", "dtype"] + [PEER_COLUMN.get(c, c) for c in columns] + ["best step", "/ cuDNN"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * 4 + "---|" + "---:|" * len(columns) + "---|---:|"]
    for cfg in sorted({config(r) for r in picked}, key=lambda c: (-c[4], c[0] * c[1] != 65536, c[0], c[5])):
        b, n, hq, hkv, d, dtype = cfg
        ours = [(med[(cfg, s)], s) for s in steps if (cfg, s) in med]
        best, best_step = max(ours) if ours else (None, "–")
        ratio = f"{_fmt(best / med[(cfg, 'sdpa-cudnn')])}×" if best and (cfg, "sdpa-cudnn") in med else "–"
        lines.append(f"| {b} | {n} | {hq}/{hkv} | {d} | {dtype} | "
                     + " | ".join(_fmt(med.get((cfg, c))) for c in columns) + f" | {best_step} | {ratio} |")
    rounds = sorted({r["suite"] for r in picked if r["suite"].startswith("round")})
    lines.append("\nDecode (q_len = 1): TB/s of K and V read once, "
                 + (f"medians of {len(rounds)} alternating rounds" if rounds else "medians over the rows of each shape")
                 + "; / cuDNN: the fastest step's bandwidth over cuDNN's.")
    return "\n".join(lines)


def _page_size(suite: str) -> int:
    """The page size a decode row's suite names (decode-pages<N>, round<k>-pages<N>); 0 for a contiguous cache."""
    return int(suite.split("-pages")[1]) if "-pages" in suite else 0


def _decode_rounds(rows):
    """The decode rows of alternating rounds (suites round<k>, round<k>-pages<N>: bench/decode_roofline.sh) and the
    median of the run's HBM read ceilings in TB/s (rows hbm-read, pass ceiling; None without them)."""
    picked = [r for r in plots.select(rows, **{"pass": "decode"}) if r["suite"].startswith("round")]
    ceiling = [r["gbps"] / 1000 for r in plots.select(rows, step="hbm-read", **{"pass": "ceiling"})]
    return picked, (_median(ceiling) if ceiling else None)


def pages(rows, steps=()) -> str:
    """The paged cache against the contiguous one: per step, variant (the step as it is first, then each ablation's)
    and shape (B, kv_len, heads, d, dtype), a decode step's TB/s over the contiguous cache (suite `decode`) and over each
    page size (suites `decode-pages<N>`, fa-bench --page-size N), medians over the rows of each (alternating rounds
    relabelled `round<k>` and `round<k>-pages<N>`); then the smallest page's bandwidth over the contiguous cache's."""
    picked = [r for r in plots.select(rows, **{"pass": "decode"})
              if r["suite"].startswith(("decode", "round")) and (not steps or r["step"] in steps)]

    def config(r):
        return (r["batch"], r["kv_len"], r["q_heads"], r["kv_heads"], r["head_dim"], r["dtype"])

    tbps: dict = {}
    for r in picked:
        tbps.setdefault(((r["step"], r["variant"]), config(r), _page_size(r["suite"])), []).append(r["gbps"] / 1000)
    med = {k: _median(v) for k, v in tbps.items()}
    sizes = sorted({k[2] for k in med})
    head = ["step", "variant", "B", "kv_len", "heads", "d", "dtype"] + [f"pages {ps}" if ps else "contiguous" for ps in sizes]
    lines = ["| " + " | ".join(head + ["paged / contiguous"]) + " |",
             "|---|---|" + "---:|" * 4 + "---|" + "---:|" * (len(sizes) + 1)]
    for variant, cfg in sorted({k[:2] for k in med},
                               key=lambda k: (plots.order_key(k[0][0]), k[0][1], -k[1][4], k[1][0] * k[1][1] != 65536, k[1][0], k[1][5])):
        b, n, hq, hkv, d, dtype = cfg
        smallest = min((ps for ps in sizes if ps > 0 and (variant, cfg, ps) in med), default=None)
        whole, paged = med.get((variant, cfg, 0)), med.get((variant, cfg, smallest))
        ratio = f"{_fmt(paged / whole)}×" if whole and paged else "–"
        lines.append(f"| {variant[0]} | {variant[1] or 'the step'} | {b} | {n} | {hq}/{hkv} | {d} | {dtype} | "
                     + " | ".join(_fmt(med.get((variant, cfg, ps))) for ps in sizes) + f" | {ratio} |")
    lines.append("\nDecode (q_len = 1): TB/s of K and V read once, medians over the rows of each cell; paged / "
                 "contiguous: the smallest page's bandwidth over the contiguous cache's, the same variant.")
    return "\n".join(lines)


def roofline(rows, steps=()) -> str:
    """The decode roofline (bench/decode_roofline.sh): per cache (B, kv_len), new tokens and mask, each listed decode
    step's (default: every one in the rows) and each peer's effective bandwidth in TB/s on the contiguous cache and on
    every page size, medians over the rounds (suites round<k> and round<k>-pages<N>); then the fastest step's
    contiguous bandwidth over the HBM read ceiling measured in the same run (the row hbm-read, pass ceiling), and its
    smallest page's over its contiguous cache's."""
    picked, read = _decode_rounds(rows)
    # A step's column is its label: an ablation's variant ("48-bps2") is a column of its own, never in the step's median.
    steps = list(steps) or sorted({_label(r) for r in picked if not plots.is_peer(r)}, key=plots.order_key)
    peers = [p for p in PEER_COLUMN if any(r["step"] == p for r in picked)]

    def config(r):
        return (r["batch"], r["kv_len"], r["q_len"], r["causal"], r["q_heads"], r["kv_heads"], r["head_dim"],
                r["dtype"])

    tbps: dict = {}
    for r in picked:
        name = _label(r)
        if name in steps or name in peers:
            tbps.setdefault((config(r), name, _page_size(r["suite"])), []).append(r["gbps"] / 1000)
    med = {k: _median(v) for k, v in tbps.items()}
    columns = [(name, ps) for name in steps + peers for ps in sorted({k[2] for k in med if k[1] == name})]
    head = (["B", "kv_len", "new tokens", "mask", "heads", "d", "dtype"]
            + [PEER_COLUMN.get(n, n) + (f" p{ps}" if ps else "") for n, ps in columns]
            + ["best step", "/ read ceiling", "paged / contiguous"])
    lines = ["| " + " | ".join(head) + " |",
             "|" + "---:|" * 3 + "---|---:|---:|---|" + "---:|" * len(columns) + "---|---:|---:|"]
    for cfg in sorted({config(r) for r in picked}):
        b, n, q_len, causal, hq, hkv, d, dtype = cfg
        ours = [(med[(cfg, s, 0)], s) for s in steps if (cfg, s, 0) in med]
        best, best_step = max(ours) if ours else (None, "–")
        sizes = sorted(ps for (c, s, ps) in med if c == cfg and s == best_step and ps > 0)
        paged = f"{_fmt(med[(cfg, best_step, sizes[0])] / best)}×" if best and sizes else "–"
        lines.append(f"| {b} | {n} | {q_len} | {'bottom-right' if causal else 'none'} | {hq}/{hkv} | {d} | {dtype} | "
                     + " | ".join(_fmt(med.get((cfg, name, ps))) for name, ps in columns)
                     + f" | {best_step} | {_fmt(best / read) + '×' if best and read else '–'} | {paged} |")
    rounds = sorted({r["suite"].split("-pages")[0] for r in picked})
    lines.append(f"\nDecode: TB/s of K and V read once, medians of {len(rounds)} alternating round(s); pN: pages of N "
                 f"tokens in a shuffled order; the read ceiling (a read-only sum over 2 GiB, same run): "
                 + (f"{_fmt(read)} TB/s" if read else "not in the rows") + "; paged / contiguous: the best step's "
                 "smallest page against its contiguous cache.")
    return "\n".join(lines)


def decode_bars(rows, steps=()) -> str:
    """Issue 57's done-when read from one decode roofline CSV (bench/decode_roofline.sh, medians over its rounds), per
    shape and dtype, for the step fastest on the contiguous cache with one new token (of `steps`, default every step
    in the rows; on a paged cache the one fastest on it): its bandwidth against 95 % of the run's read ceiling (or 0.98x cuDNN where cuDNN reads above the
    ceiling); each page size's against its own contiguous bandwidth (>= 0.95x); at the GQA shapes, 4 and 8 new tokens
    (no mask and bottom-right) against one, contiguous and on each page size (>= 0.9x). A bar without its rows in the
    CSV is listed as not measured, never as met."""
    picked, read = _decode_rounds(rows)
    steps = list(steps) or sorted({_label(r) for r in picked if not plots.is_peer(r)}, key=plots.order_key)

    tbps: dict = {}
    for r in picked:
        key = (r["batch"], r["kv_len"], r["q_heads"], r["kv_heads"], r["head_dim"], r["dtype"])
        tbps.setdefault((key, r["q_len"], r["causal"], _label(r), _page_size(r["suite"])), []).append(r["gbps"] / 1000)
    med = {k: _median(v) for k, v in tbps.items()}
    pages = sorted({k[4] for k in med if k[4] > 0})
    lines = ["| bar | B, kv_len, heads, d | dtype | step | measured | bar | met |", "|---|---|---|---|---:|---:|---|"]
    met = total = 0

    def bar(name, shape, dtype, step, value, need, text):
        nonlocal met, total
        total += 1
        ok = value is not None and need is not None and value >= need
        met += ok
        b, n, hq, hkv, d = shape
        lines.append(f"| {name} | {b}, {n}, {hq}/{hkv}, {d} | {dtype} | {step} | {text} | "
                     f"{_fmt(need) if need is not None else '–'} | {'yes' if ok else 'no' if value is not None else 'not measured'} |")

    for key in sorted({k[0] for k in med}):
        shape, dtype = key[:5], key[5]
        ours = [(med[(key, 1, 0, s, 0)], s) for s in steps if (key, 1, 0, s, 0) in med]
        if not ours:
            continue
        best, step = max(ours)
        cudnn = med.get((key, 1, 0, "sdpa-cudnn", 0))
        # Contiguous: 95 % of the ceiling, or 0.98x cuDNN where cuDNN reads above the ceiling.
        if read and cudnn and cudnn > read:
            bar("contiguous / read ceiling", shape, dtype, step, best / read, 0.95,
                f"{_fmt(best)} TB/s = {_fmt(best / read)}x of {_fmt(read)}; {_fmt(best / cudnn)}x cuDNN (above the ceiling)")
            if best / read < 0.95:  # the alternative bar, where cuDNN is above the ceiling
                lines.pop(); total -= 1
                bar("contiguous / cuDNN", shape, dtype, step, best / cudnn, 0.98,
                    f"{_fmt(best)} TB/s = {_fmt(best / cudnn)}x cuDNN's {_fmt(cudnn)} (above the ceiling {_fmt(read)})")
        else:
            bar("contiguous / read ceiling", shape, dtype, step, best / read if read else None, 0.95,
                f"{_fmt(best)} TB/s = {_fmt(best / read) if read else '–'}x of {_fmt(read)}")
        # The paged and several-token bars: the step fastest on that page size, against its own contiguous read (the
        # issue's "the same step's contiguous speed"; the step fastest contiguous may be another, slow on pages or
        # taking none, as 47 at d = 64).
        def step_for(ps):
            timed = [(med[(key, 1, 0, s, ps)], speed, s) for speed, s in ours if (key, 1, 0, s, ps) in med]
            return max(timed)[1:] if timed else (best, step)

        for ps in pages:
            base, paged_step = step_for(ps)
            paged = med.get((key, 1, 0, paged_step, ps))
            bar(f"pages of {ps} / contiguous", shape, dtype, paged_step, paged / base if paged else None, 0.95,
                f"{_fmt(paged)} / {_fmt(base)} = {_fmt(paged / base) if paged else '–'}x")
        if shape[2] == shape[3]:
            continue  # several new tokens: the GQA shapes
        for q_len in sorted({k[1] for k in med if k[0] == key and k[1] > 1}):
            for ps in [0] + pages:
                token_step = step if ps == 0 else step_for(ps)[1]
                one = med.get((key, 1, 0, token_step, ps))
                for causal in (0, 1):
                    many = med.get((key, q_len, causal, token_step, ps))
                    where = f"{'contiguous' if ps == 0 else f'pages of {ps}'}, {'bottom-right' if causal else 'no mask'}"
                    bar(f"{q_len} new tokens / one ({where})", shape, dtype, token_step,
                        many / one if many and one else None, 0.9,
                        f"{_fmt(many)} / {_fmt(one)} = {_fmt(many / one) if many and one else '–'}x")
    lines.append(f"\n{met} of {total} bars met (medians of the rounds; read ceiling "
                 + (f"{_fmt(read)} TB/s, same run" if read else "not in the rows") + ").")
    return "\n".join(lines)


#: Where each part of the course is timed (bench/course_run.sh records them all in one run): its pass, then its
#: columns, (title, (B, Nq, Nkv, Hq, Hkv, d)); the first is the shape where the part's lessons act, the others
#: are beside it (the other head_dim; the backward's CUDA-core steps at the teaching shape). The parts and
#: their steps are tools/check_prose.py's, which reads them from the steps' sources.
PART_SHAPES = {
    "cuda-cores": ("forward", [("teaching, d = 64", (4, 1024, 1024, 8, 8, 64)),
                               ("teaching, d = 128", (4, 1024, 1024, 8, 8, 128))]),
    "mma-sync": ("forward", [("headline, d = 64", (4, 4096, 4096, 16, 16, 64)),
                             ("headline, d = 128", (4, 4096, 4096, 16, 16, 128))]),
    "hopper": ("forward", [("headline, d = 128", (4, 4096, 4096, 16, 16, 128)),
                           ("headline, d = 64", (4, 4096, 4096, 16, 16, 64))]),
    "backward": ("backward", [("B=4 N=4096, d = 128", (4, 4096, 4096, 16, 16, 128)),
                              ("B=4 N=4096, d = 64", (4, 4096, 4096, 16, 16, 64)),
                              ("teaching, d = 64", (4, 1024, 1024, 8, 8, 64))]),
    "decode": ("decode", [("B=8 8192 32/8", (8, 1, 8192, 32, 8, 128)), ("B=1 131072 32/8", (1, 1, 131072, 32, 8, 128)),
                          ("B=64 2048 32/8", (64, 1, 2048, 32, 8, 128)), ("B=8 8192 16/16 d=64", (8, 1, 8192, 16, 16, 64))]),
}
#: The peers each part's table shows, after its steps.
PART_PEERS = {"cuda-cores": ["cublas"], "mma-sync": ["cublas", "sdpa-flash", "sdpa-cudnn"],
              "hopper": ["cublas", "sdpa-flash", "sdpa-cudnn", "fa3", "fa4"],
              "backward": ["sdpa-flash", "sdpa-cudnn", "fa3", "fa4"],
              "decode": ["sdpa-flash", "sdpa-cudnn"]}


def part_steps() -> dict:
    """part key -> the step ids in it, in order, read from the steps' sources (tools/check_prose.py)."""
    import check_prose  # noqa: E402  the one place that knows which part a step belongs to
    out: dict = {}
    for step in check_prose.steps_from_sources(plots.REPO):
        out.setdefault(step.part, []).append(step.id)
    return out


#: Page sizes whose decode rows (fa-bench --page-size N, suite decode-pagesN) a decode table shows, at its first
#: shape, where the CSV has them.
PART_PAGES = (16, 64, 256)


def gpu_name(rows) -> str:
    """The GPU of a run, short: 'H200' for 'NVIDIA H200', 'H100' for 'NVIDIA H100 80GB HBM3'."""
    names = sorted({r["gpu"] for r in rows if r.get("gpu")})
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", names[0]) if names else None
    return m.group(1) if m else (names[0] if names else "?")


def _part_best(rows, key: str, dtype: str, ids: list) -> dict:
    """(name, column) -> the fastest row of a step or peer at that column's shape; for a decode part also
    (name, 'pagesN') at its first shape, and ('read ceiling', 'ceiling') the run's HBM read."""
    pass_, columns = PART_SHAPES[key]
    best: dict = {}
    for r in rows:
        if r["pass"] == "ceiling" and r["step"] == "hbm-read" and pass_ == "decode":
            best[("read ceiling", "ceiling")] = r
        if r["pass"] != pass_ or r["dtype"] != dtype or r["causal"] != 0:
            continue
        shape = (r["batch"], r["q_len"], r["kv_len"], r["q_heads"], r["kv_heads"], r["head_dim"])
        name = r["step"] if r["step"] in ids or r["step"] in PART_PEERS[key] else None
        if not name:
            continue
        if pass_ == "decode" and "-pages" in r["suite"]:  # a paged run: its own columns, at the first shape
            where = [f"pages{r['suite'].split('-pages')[1]}"] if shape == columns[0][1] else []
        elif pass_ == "decode" and r["suite"] != "decode":
            where = []  # a decode row of another suite (alternating rounds): not the course run's
        else:
            where = [c for c in range(len(columns)) if shape == columns[c][1]]
        for c in where:
            if (name, c) not in best or r["ms"] < best[(name, c)]["ms"]:
                best[(name, c)] = r
    return best


def part(rows, key: str, dtype: str = "f16", more=()) -> str:
    """One part's table: its steps (each its fastest variant in each column) and its peers, non-causal, in `dtype`.
    One run (`rows`): ms and TFLOPS (decode: TB/s) in each column, and the first column's speedup over the step
    before; a decode table adds the paged runs (pages of 16, 64, 256 at its first shape) and the run's HBM read
    ceiling where the run has them. Several runs (`more`: the rows of other GPUs' runs): TFLOPS (TB/s) per column
    and GPU, the GPU named in each column, the speedup over the step before from the first run."""
    pass_, columns = PART_SHAPES[key]
    ids = part_steps().get(key, [])
    decode = pass_ == "decode"
    runs = [rows] + list(more)
    gpus = [gpu_name(r) for r in runs] if more else [""]
    bests = [_part_best(r, key, dtype, ids) for r in runs]
    extra = [f"pages{n}" for n in PART_PAGES if decode and any(k[1] == f"pages{n}" for b in bests for k in b)]
    cols = list(range(len(columns))) + extra
    title = {c: columns[c][0] for c in range(len(columns))}
    title.update({f"pages{n}": f"{columns[0][0]} pages of {n}" for n in PART_PAGES})
    names = [i for i in ids if any((i, c) in b for b in bests for c in cols)]
    names += [p for p in PART_PEERS[key] if any((p, c) in b for b in bests for c in cols)]
    ceiling = decode and any(("read ceiling", "ceiling") in b for b in bests)
    if more:
        unit = "TB/s" if decode else "TFLOPS"
        pairs = [(c, g) for c in cols for g in range(len(runs)) if any(k[1] == c for k in bests[g])]
        head = ["step"] + [f"{title[c]}, {gpus[g]} {unit}" for c, g in pairs] + [f"× prev ({gpus[0]})"]
    else:
        pairs = [(c, 0) for c in cols]
        unit = "TB/s" if decode else "ms | TFLOPS"
        head = ["step"] + [f"{title[c]} {u}" for c in cols for u in unit.split(" | ")] + ["× prev"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    previous = None
    for name in names:
        main = bests[0].get((name, 0))
        peer = name not in ids
        variant = main["variant"] if main is not None and main["variant"] else ""
        cells = [(PEER_COLUMN.get(name) or plots.PEER_NAMES.get(name, name)) if peer
                 else name + (f" ({variant})" if variant else "")]
        for c, g in pairs:
            r = bests[g].get((name, c))
            if decode:
                cells.append(_fmt(r["gbps"] / 1000) if r is not None else "–")
            elif more:
                cells.append(_fmt(r["tflops"]) if r is not None else "–")
            else:
                cells += [_fmt(r["ms"], 4), _fmt(r["tflops"])] if r is not None else ["–", "–"]
        value = (main["gbps"] if decode else 1 / main["ms"]) if main is not None else None
        cells.append(f"{_fmt(value / previous)}×" if value and previous and not peer else "–")
        if value and not peer:
            previous = value
        lines.append("| " + " | ".join(cells) + " |")
    if ceiling:
        cells = ["HBM read ceiling (a sum over 2 GiB, same run)"]
        for c, g in pairs:
            r = bests[g].get(("read ceiling", "ceiling"))
            cells.append(_fmt(r["gbps"] / 1000) if r is not None else "–")
        lines.append("| " + " | ".join(cells + ["–"]) + " |")
    return "\n".join(lines)


_BLOCK = re.compile(r"(<!-- course-table (\S+) (\S+) (\S+) -->\n)(.*?)(<!-- end course-table -->)", re.S)


def part_blocks(path: str, write: bool) -> int:
    """The generated table blocks of a Markdown file, `<!-- course-table PART DTYPE CSV[,CSV...] -->` ... `<!-- end
    course-table -->` (CSVs relative to the repository, one a GPU's run, the first the one whose speedups the table
    gives): each re-printed from its CSVs; with `write` the file is
    rewritten, else every block that differs is reported. The exit status: 0 all equal (or written), 1 not."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    problems = []

    def regenerate(m):
        key, dtype, csv_path = m.group(2), m.group(3), m.group(4)
        if key not in PART_SHAPES:
            problems.append(f"{path}: unknown part '{key}' (known: {', '.join(PART_SHAPES)})")
            return m.group(0)
        runs = [plots.load([os.path.join(plots.REPO, p)]) for p in csv_path.split(",")]
        table = part(runs[0], key, dtype, runs[1:])
        if m.group(5).rstrip("\n") != table:
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"{path}:{line}: the {key} table ({dtype}) is not what {csv_path} prints "
                            f"(python3 tools/tables.py parts --write {os.path.relpath(path, plots.REPO)})")
        return m.group(1) + table + "\n" + m.group(6)

    new = _BLOCK.sub(regenerate, text)
    blocks = len(_BLOCK.findall(text))
    if write:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
        print(f"{path}: {blocks} course table(s) written")
        return 0 if not any("unknown part" in p for p in problems) else 1
    for p in problems:
        print(p)
    print(f"{path}: {blocks} course table(s), {len(problems)} differ(s)")
    return 1 if problems else 0


def context(paths) -> str:
    """bench/cp_bench.py's rows: per problem (tokens, mask, heads), each form's median ms over its rounds; per GPU
    the fraction of one GPU's throughput (one's time / (forms's time x GPUs)), and PyTorch's time over the form's."""
    import csv
    times = {}
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r["ms"]:
                    key = (int(r["tokens"]), r["causal"], int(r["heads"]), int(r["kv_heads"]), int(r["head_dim"]))
                    times.setdefault(key, {}).setdefault(r["form"], (int(r["gpus"]), []))[1].append(float(r["ms"]))
    lines = ["| tokens | mask | Hq/Hkv, d | one GPU ms | ring: ms, of one GPU | all-to-all: ms, of one GPU | "
             "PyTorch context_parallel: ms, of one GPU | ring's speed over PyTorch's | rounds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(times):
        forms = {form: (gpus, statistics.median(ms), len(ms)) for form, (gpus, ms) in times[key].items()}
        one = forms.get("one")

        def cell(form):
            if form not in forms:
                return "–"
            gpus, ms, _ = forms[form]
            return f"{ms:.1f}" + ("" if one is None else f", {one[1] / (ms * gpus):.2f}")
        ring, theirs = forms.get("ring"), forms.get("torch_cp")
        over = "–" if ring is None or theirs is None else f"{theirs[1] / ring[1]:.2f}×"
        tokens, causal, hq, hkv, d = key
        lines.append(f"| {tokens:,} | {'causal' if causal == 'yes' else 'none'} | {hq}/{hkv}, {d} | "
                     f"{'–' if one is None else f'{one[1]:.1f}'} | {cell('ring')} | {cell('ulysses')} | "
                     f"{cell('torch_cp')} | {over} | {max(n for _, _, n in forms.values())} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Command line: which table, from which CSVs."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", choices=["times", "accuracy", "course", "compare", "rounds", "backward", "decode",
                                          "pages", "roofline", "decode-bars", "features", "feature-bars", "parts",
                                          "context"])
    parser.add_argument("--dtype", default="f16", help="parts: the dtype of the tables (default f16; f32 for the "
                        "CUDA-core steps' chain)")
    parser.add_argument("--part", default=None, help="parts: one part (" + ", ".join(PART_SHAPES) + "; default all)")
    parser.add_argument("--check", metavar="MD", help="parts: re-print MD's course-table blocks and compare")
    parser.add_argument("--write", metavar="MD", help="parts: re-print MD's course-table blocks into it")
    parser.add_argument("--old", nargs="*", default=[], help="compare: the old tree's CSVs")
    parser.add_argument("--new", nargs="*", default=[], help="compare: the new tree's CSVs")
    parser.add_argument("--pair", nargs="*", default=[], help="compare: NEW=OLD labels to set side by side")
    parser.add_argument("--csv", nargs="*", help="fa-bench CSVs (default: docs/results/*.csv)")
    parser.add_argument("--suite", default=None, help="teaching, headline, sweep, custom, accuracy, accuracy-wide")
    parser.add_argument("--steps", default="", help="comma-separated ids or labels, in table order")
    parser.add_argument("--dtypes", default="f32,f16")
    parser.add_argument("--causal", default="0,1", help="0, 1 or both (0,1)")
    parser.add_argument("--head-dim", type=int, default=None)
    parser.add_argument("--pass", dest="pass_", default="forward", choices=["forward", "backward"],
                        help="the rows every table but backward's, decode's, pages' and roofline's reads (default "
                        "forward)")
    args = parser.parse_args(argv)
    paths = args.csv or sorted(glob.glob(os.path.join(plots.REPO, "docs", "results", "*.csv")))

    def load(paths):
        return plots.select(plots.load(paths), **{"pass": args.pass_})

    steps = [s for s in args.steps.split(",") if s]
    if args.table == "parts":
        if args.check or args.write:
            return part_blocks(args.check or args.write, write=bool(args.write))
        if args.part and args.part not in PART_SHAPES:
            parser.error(f"--part: unknown part '{args.part}', expected one of {', '.join(PART_SHAPES)}")
        keys = [args.part] if args.part else list(PART_SHAPES)
        runs = [plots.load([p]) for p in paths]  # one course run a CSV, a GPU's; the first gives the speedups
        print("\n\n".join(f"{k}:\n{part(runs[0], k, args.dtype, runs[1:])}" for k in keys))
        return 0
    if args.table == "context":
        if not args.csv:
            parser.error("context: --csv names bench/cp_bench.py's CSV")
        print(context(args.csv))
        return 0
    if args.table == "backward":
        print(backward(plots.load(paths), steps, args.head_dim, args.suite))
        return 0
    if args.table == "decode":
        print(decode(plots.load(paths), steps, args.suite))
        return 0
    if args.table == "pages":
        print(pages(plots.load(paths), steps))
        return 0
    if args.table == "roofline":
        print(roofline(plots.load(paths), steps))
        return 0
    if args.table == "decode-bars":
        print(decode_bars(plots.load(paths), steps))
        return 0
    if args.table == "features":
        print(features(plots.load(paths), steps, args.pass_))
        return 0
    if args.table == "feature-bars":
        print(feature_bars(plots.load(paths)))
        return 0
    rows = load(paths)
    if args.table == "times":
        if not steps:  # every step id of the suite, in order; the peers after them
            ids = sorted({r["step"] for r in rows if r["suite"] == (args.suite or "teaching")})
            steps = [i for i in ids if not plots.is_peer({"step": i})] + [i for i in ids if plots.is_peer({"step": i})]
        print(times(rows, args.suite or "teaching", steps + ["cublas"] if "cublas" not in steps else steps,
                    args.dtypes.split(","), [int(c) for c in args.causal.split(",")], args.head_dim))
    elif args.table == "compare":
        # One list of rows per CSV: a configuration timed in several rounds gets its median.
        print(compare([load([p]) for p in args.old], [load([p]) for p in args.new], args.pair))
    elif args.table == "rounds":
        print(rounds(rows, steps, args.head_dim))
    elif args.table == "accuracy":
        print(accuracy(rows, steps, args.suite or "accuracy"))
    else:
        print(course(rows, args.dtypes.split(",")[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
