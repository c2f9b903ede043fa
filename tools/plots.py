#!/usr/bin/env python3
"""Figures from fa-bench CSVs: every figure of the course can be rebuilt from recorded data.

    python3 tools/plots.py [CSV ...] [--out docs/figures] [--course] [--only NAME,...]

Without CSV arguments it reads docs/results/*.csv. Later files win where two
rows describe the same measurement (step, variant, dtype, shape, causal, suite).
Writes, as far as the data allows (a figure without rows is skipped, with the
reason printed):

  time_teaching.png   time per step, teaching shape, f32 and f16, causal off/on
  speedup_chain.png   speedup of each step over the one before and over step 01
  tflops.png          TFLOPS per step (headline shape, else teaching) against the
                      measured ceilings in bench/ceilings.csv
  memory_sweep.png    workspace beyond inputs and output (extra_bytes) against N
  accuracy.png        rel_err against kv_len, rows with suite "accuracy" or "accuracy-wide"

`--course` reads the course's one recorded run (bench/course_run.sh), whose forward rows are timed at
given shapes (suite "custom"): the teaching and headline shapes at d = 64 become those suites, so the
speedup chain and the TFLOPS figure draw from that run alone. `--only` writes the named figures and no others.

Rows whose step is not a two-digit course step (cublas, sdpa-*) are peers and
are drawn grey and labelled "(peer)". The figures are the forward's: rows whose
pass is backward are left out (tools/tables.py backward tabulates them). Only
numpy and matplotlib.
"""
from __future__ import annotations

import argparse
import csv
import re
import glob
import math
import os
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
#: The one table of measured ceilings (name, dtype, TFLOPS, source).
CEILINGS_CSV = os.path.join(REPO, "bench", "ceilings.csv")

#: fa-bench's CSV header (bench/fa_bench.cpp); missing columns read as empty, except `pass`: rows
#: recorded before the backward existed have none and read as "forward".
COLUMNS = ("step,variant,dtype,batch,q_len,kv_len,q_heads,kv_heads,head_dim,causal,ms,tflops,extra_bytes,"
           "rel_err,gpu,suite,ms_min,ms_max,reps,speedup_prev,speedup_01,vs_cublas,max_err,pass,gbps").split(",")
INT_COLUMNS = {"batch", "q_len", "kv_len", "q_heads", "kv_heads", "head_dim", "causal", "reps"}
FLOAT_COLUMNS = {"ms", "tflops", "extra_bytes", "rel_err", "ms_min", "ms_max", "speedup_prev", "speedup_01",
                 "vs_cublas", "max_err", "gbps"}
#: Human names of the peers fa-bench and bench/sdpa_peers.py write.
PEER_NAMES = {
    "cublas": "cuBLAS standard attention",
    "sdpa-math": "SDPA math",
    "sdpa-efficient": "SDPA efficient",
    "sdpa-flash": "SDPA flash (FA2)",
    "sdpa-cudnn": "SDPA cuDNN",
    "fa3": "FlashAttention-3",
    "fa4": "FlashAttention-4",
}


def _number(text: str, integer: bool):
    """Parse one CSV cell; empty or malformed cells become NaN (or None for integers)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None if integer else math.nan
    return int(value) if integer and math.isfinite(value) else value


#: The renumbering of 2026-11-28 (issue 54), so that every part of the course is contiguous: step 46 (the lean
#: backward consumer) became step 41, after the backward's step 40, and the decode steps 41-45 became 42-46. A CSV
#: recorded before it (a file whose name starts with a GPU and a date before RENUMBERED_ON, as every file in
#: docs/results/ does) keeps the ids of its day; load() reads its step ids through OLD_TO_NEW, so that every table
#: and figure speaks today's numbers. The runs files (docs/results/runs/*.txt) keep the numbers of their day.
RENUMBERED_ON = "2026-11-28"
OLD_TO_NEW = {"41": "42", "42": "43", "43": "44", "44": "45", "45": "46", "46": "41"}


def recorded_before_renumbering(path: str) -> bool:
    """True for a recorded CSV (named GPU-YYYY-MM-DD...) from before RENUMBERED_ON: its step ids are the old ones."""
    m = re.match(r"^[a-z0-9]+-(\d{4}-\d{2}-\d{2})", os.path.basename(path))
    return bool(m) and m.group(1) < RENUMBERED_ON


def step_id_of(path: str, step: str) -> str:
    """A row's step id as the course numbers it today (the id itself for a CSV recorded after the renumbering)."""
    return OLD_TO_NEW.get(step, step) if recorded_before_renumbering(path) else step


def load(paths) -> list[dict]:
    """Read one or several fa-bench CSVs into dicts with typed values, later files overriding earlier rows; the step
    ids of a CSV recorded before the renumbering of RENUMBERED_ON are read as today's."""
    rows: "OrderedDict[tuple, dict]" = OrderedDict()
    for path in paths:
        with open(path, newline="") as f:
            for raw in csv.DictReader(f):
                row = {}
                for column in COLUMNS:
                    text = (raw.get(column) or "").strip()
                    if column in INT_COLUMNS:
                        row[column] = _number(text, integer=True)
                    elif column in FLOAT_COLUMNS:
                        row[column] = _number(text, integer=False)
                    else:
                        row[column] = text
                row["step"] = step_id_of(path, row["step"])
                if row["causal"] is None:  # an older CSV without the column: non-causal
                    row["causal"] = 0
                if not row["pass"]:  # an older CSV without the column: the forward
                    row["pass"] = "forward"
                key = tuple(row[c] for c in ("step", "variant", "dtype", "batch", "q_len", "kv_len", "q_heads",
                                             "kv_heads", "head_dim", "causal", "suite", "gpu", "pass"))
                rows.pop(key, None)
                rows[key] = row
    return list(rows.values())


def load_ceilings(path: str = CEILINGS_CSV) -> list[dict]:
    """The measured ceilings: dicts with ceiling, dtype, tflops (float) and source."""
    with open(path, newline="") as f:
        return [{**r, "tflops": float(r["tflops"])} for r in csv.DictReader(f)]


def is_peer(row: dict) -> bool:
    """True for rows that are not a course step (step is not two digits): cublas, sdpa-*."""
    step = row["step"]
    return not (len(step) == 2 and step.isdigit())


def label(row: dict) -> str:
    """Short name of a row's implementation: '04', '05-pad1', 'cuBLAS standard attention (peer)'."""
    if is_peer(row):
        return f"{PEER_NAMES.get(row['step'], row['step'])} (peer)"
    return row["step"] + (f"-{row['variant']}" if row["variant"] else "")


def order_key(name: str):
    """Course steps first in course order (variants in natural order: br8 before br16), then peers."""
    natural = tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))
    return (1, natural) if name.endswith("(peer)") else (0, natural)


def fastest_variants(rows) -> list[dict]:
    """Per configuration, the fastest variant of each course step (peers kept as they are), shown by
    its step id alone (which variant it is can differ between dtypes: the READMEs give them)."""
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["suite"], r["dtype"], r["causal"], r["batch"], r["q_len"], r["kv_len"], r["q_heads"], r["head_dim"],
               label(r) if is_peer(r) else r["step"])
        if key not in best or r["ms"] < best[key]["ms"]:
            best[key] = r
    out = []
    for r in best.values():
        r = dict(r)
        if not is_peer(r):
            r["shown"] = r["step"]
        out.append(r)
    return out


def shown(row: dict) -> str:
    """The name a figure shows: fastest_variants' step id, else label()."""
    return row.get("shown", label(row))


def select(rows, **conditions) -> list[dict]:
    """Rows whose columns equal every given value (e.g. suite='teaching', dtype='f32')."""
    return [r for r in rows if all(r.get(k) == v for k, v in conditions.items())]


def _colour(name: str, names: list[str]):
    """One colour per course step along a colour map; grey for peers."""
    import matplotlib

    if name.endswith("(peer)"):
        return "0.55"
    steps = [n for n in names if not n.endswith("(peer)")]
    return matplotlib.colormaps["viridis"](steps.index(name) / max(1, len(steps) - 1) * 0.85)


def _gpus(rows) -> str:
    """The GPU name(s) of a set of rows, for titles."""
    return ", ".join(sorted({r["gpu"] for r in rows if r["gpu"]})) or "unknown GPU"


def _shape(row) -> str:
    """B, H, N, d of a row, compactly."""
    heads = f"{row['q_heads']}" if row["q_heads"] == row["kv_heads"] else f"{row['q_heads']}/{row['kv_heads']}"
    n = f"{row['q_len']}" if row["q_len"] == row["kv_len"] else f"{row['q_len']}x{row['kv_len']}"
    return f"B={row['batch']}, H={heads}, N={n}, d={row['head_dim']}"


def fig_time_teaching(rows):
    """Grouped bars: median ms per implementation, f32 and f16, one panel per causal setting (log scale)."""
    import matplotlib.pyplot as plt
    import numpy as np

    rows = fastest_variants([r for r in select(rows, suite="teaching") if math.isfinite(r["ms"])])
    if not rows:
        return None, "no teaching-suite rows"
    causals = sorted({r["causal"] for r in rows})
    dtypes = [d for d in ("f32", "f16") if select(rows, dtype=d)]
    names = sorted({shown(r) for r in rows}, key=order_key)
    # One row of panels per causal setting, so the figure stays readable as steps are added.
    fig, axes = plt.subplots(len(causals), 1, figsize=(max(8, 0.6 * len(names)), 4.4 * len(causals)),
                             squeeze=False, constrained_layout=True)
    width = 0.8 / len(dtypes)
    for ax, causal in zip(axes[:, 0], causals):
        for k, dtype in enumerate(dtypes):
            ms = {shown(r): r["ms"] for r in select(rows, causal=causal, dtype=dtype)}
            x = np.arange(len(names)) + (k - (len(dtypes) - 1) / 2) * width
            heights = [ms.get(n, np.nan) for n in names]
            bars = ax.bar(x, heights, width, label=dtype, color=f"C{k}",
                          hatch=["//" if n.endswith("(peer)") else "" for n in names], edgecolor="white")
            ax.bar_label(bars, labels=[f"{h:.3g}" if math.isfinite(h) else "" for h in heights], fontsize=7,
                         rotation=90, padding=2)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.margins(y=0.25)
        ax.set_yscale("log")
        ax.set_ylabel("median time per call, ms (log)")
        ax.set_title(f"causal = {'yes' if causal else 'no'}")
        ax.legend(title="dtype")
    fig.suptitle(f"Teaching shape ({_shape(rows[0])}), {_gpus(rows)}; each step's fastest variant; "
                 "hatched bars are peers")
    return fig, None


def fig_speedup_chain(rows, suite="teaching", dtype="f32", causal=0):
    """Bars: speedup of each course step over step 01 (log), annotated with the factor over the previous step.

    Computed from ms (the best variant of each step id), so it needs no speedup columns.
    """
    import matplotlib.pyplot as plt

    all_ids = sorted({r["step"] for r in select(rows, suite=suite) if not is_peer(r)})
    rows = [r for r in select(rows, suite=suite, dtype=dtype, causal=causal) if math.isfinite(r["ms"])]
    steps = [r for r in rows if not is_peer(r)]
    if not steps:
        return None, f"no course-step rows for suite={suite}, dtype={dtype}, causal={causal}"
    best = {}
    for r in steps:
        best[r["step"]] = min(best.get(r["step"], math.inf), r["ms"])
    ids = sorted(best)
    base = best[ids[0]]
    fig, ax = plt.subplots(figsize=(max(6, 1.0 * len(ids) + 2), 4.4), constrained_layout=True)
    speedups = [base / best[i] for i in ids]
    bars = ax.bar(ids, speedups, color=[_colour(i, ids) for i in ids])
    notes = ["1x"] + [f"{best[prev] / best[cur]:.3g}x over {prev}" for prev, cur in zip(ids, ids[1:])]
    ax.bar_label(bars, labels=notes, fontsize=8)
    peers = sorted((r for r in rows if is_peer(r)), key=lambda r: r["ms"])
    for k, r in enumerate(peers):
        ax.axhline(base / r["ms"], color=f"C{k}", ls=(0, (4, 2 + k)), lw=1, label=f"{label(r)}, {dtype}")
    if peers:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="peers, same run")
    missing = [i for i in all_ids if i not in best]
    if missing:  # say why the chain skips steps (the tensor-core steps take 16-bit inputs only)
        ax.text(0.01, 0.98, f"not in {dtype}: steps {', '.join(missing)} (their inputs are f16/bf16 only)",
                transform=ax.transAxes, va="top", fontsize=8)
    ax.set_yscale("log")
    ax.margins(y=0.15)
    ax.set_xlabel("step (best variant)")
    ax.set_ylabel(f"speedup over step {ids[0]} (log)")
    ax.set_title(f"The speedup chain: {suite} shape ({_shape(steps[0])}),\n{dtype}, causal = "
                 f"{'yes' if causal else 'no'}, {_gpus(rows)}", fontsize=10)
    return fig, None


def fig_tflops(rows, ceilings=None):
    """TFLOPS per implementation (headline suite if present, else teaching), f32 and f16 panels, with ceilings."""
    import matplotlib.pyplot as plt

    ceilings = load_ceilings() if ceilings is None else ceilings
    suite = "headline" if select(rows, suite="headline") else "teaching"
    rows = [r for r in select(rows, suite=suite, causal=0) if math.isfinite(r["tflops"])]
    if not rows:
        return None, "no headline or teaching rows with tflops"
    dtypes = [d for d in ("f32", "f16") if select(rows, dtype=d)]
    fig, axes = plt.subplots(1, len(dtypes), figsize=(7 * len(dtypes), 4.8), squeeze=False, constrained_layout=True)
    for ax, dtype in zip(axes[0], dtypes):
        subset = fastest_variants(select(rows, dtype=dtype))
        names = sorted({shown(r) for r in subset}, key=order_key)
        tflops = {shown(r): r["tflops"] for r in subset}
        bars = ax.bar(range(len(names)), [tflops[n] for n in names], color=[_colour(n, names) for n in names])
        ax.bar_label(bars, labels=[f"{tflops[n]:.3g}" for n in names], fontsize=7, padding=2)
        # f32 inputs compute in f32 (FFMA); the FP64 line shows what double accumulation would cap at.
        relevant = ("f32", "f64") if dtype == "f32" else ("f16",)
        for k, c in enumerate(x for x in ceilings if x["dtype"] in relevant):
            # Ceilings go into the legend: close values (53.3 and 50.9) would overprint as labels.
            ax.axhline(c["tflops"], color=f"C{k + 3}", ls=(0, (4, 1 + k)), lw=1,
                       label=f"{c['ceiling']}: {c['tflops']:g}")
        # Room above the bars and the ceilings for the legend and the value labels.
        top = max([tflops[n] for n in names] + [c["tflops"] for c in ceilings if c["dtype"] in relevant])
        ax.legend(fontsize=7, loc="upper left", ncol=1)
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylim(min(tflops.values()) / 2, top * 8)
        ax.set_ylabel("TFLOPS, 4·B·H·N²·d / t (log)")
        ax.set_title(f"{dtype} inputs")
    fig.suptitle(f"{suite} shape ({_shape(rows[0])}), non-causal, each step's fastest variant, against measured "
                 f"ceilings (bench/ceilings.csv), {_gpus(rows)}", fontsize=10)
    return fig, None


def fig_memory_sweep(rows, dtype="f32", causal=0):
    """Workspace beyond inputs and output (extra_bytes) against N for every implementation of the sweep."""
    import matplotlib.pyplot as plt

    rows = [r for r in select(rows, suite="sweep", dtype=dtype, causal=causal) if math.isfinite(r["extra_bytes"])]
    if not rows:
        return None, f"no sweep rows for dtype={dtype}, causal={causal}"
    names = sorted({label(r) for r in rows}, key=order_key)
    lengths = sorted({r["kv_len"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4.6), constrained_layout=True)
    # The steps that need no memory beyond Q, K, V and O share one line, named once.
    zero = [n for n in names if all(r["extra_bytes"] == 0 for r in rows if label(r) == n)]
    if zero:
        ax.plot(lengths, [0] * len(lengths), marker="o", color="C2",
                label=f"no extra memory: {len(zero)} steps and variants\n({', '.join(sorted({z.split('-')[0] for z in zero}, key=order_key))})")
    for k, n in enumerate(x for x in names if x not in zero):
        points = sorted((r["kv_len"], r["extra_bytes"] / 2**20) for r in rows if label(r) == n)
        ax.plot(*zip(*points), marker="o", label=n, color="0.45" if n.endswith("(peer)") else f"C{k}",
                ls="--" if n.endswith("(peer)") else "-")
        if points[-1][0] < lengths[-1]:  # a series that stops: fa-bench skipped the longer ones
            ax.annotate(f"{n}: not timed past N = {points[-1][0]}\n(predicted over --max-ms)", points[-1],
                        textcoords="offset points", xytext=(8, -4), fontsize=7, va="top")
    # 0 bytes must be visible: symlog is linear below 1 MiB and logarithmic above.
    ax.set_xscale("log", base=2)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylim(bottom=-0.3)
    ax.set_xlabel("N = q_len = kv_len (log2)")
    ax.set_ylabel("extra memory, MiB (0, then log)")
    ax.legend(fontsize=8)
    ax.set_title(f"Memory beyond Q, K, V, O: sweep ({_shape(rows[0]).split(', N=')[0]}, d={rows[0]['head_dim']}),\n"
                 f"{dtype}, causal = {'yes' if causal else 'no'}, {_gpus(rows)}", fontsize=10)
    return fig, None


#: fa-bench's accuracy suites and how their panels are titled.
ACCURACY_SUITES = {"accuracy": "inputs in [-1, 1)", "accuracy-wide": "wide logits: Q in [-30, 30)"}


def fig_accuracy(rows):
    """rel_err against kv_len per implementation, one panel per accuracy suite and dtype."""
    import matplotlib
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["suite"] in ACCURACY_SUITES and math.isfinite(r["rel_err"])]
    if not rows:
        return None, "no rows with suite == accuracy or accuracy-wide"
    panels = [(suite, dtype) for suite in ACCURACY_SUITES for dtype in sorted({r["dtype"] for r in rows})
              if select(rows, suite=suite, dtype=dtype)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False,
                             constrained_layout=True, sharey=True)
    for ax, (suite, dtype) in zip(axes[0], panels):
        subset = select(rows, suite=suite, dtype=dtype)
        names = sorted({label(r) for r in subset}, key=order_key)
        for n in names:
            for causal in sorted({r["causal"] for r in subset if label(r) == n}):
                # One point per kv_len: the worst error measured there.
                worst = {}
                for r in subset:
                    if label(r) == n and r["causal"] == causal:
                        worst[r["kv_len"]] = max(worst.get(r["kv_len"], 0.0), r["rel_err"])
                ax.plot(*zip(*sorted(worst.items())), marker="o", color=_colour(n, names),
                        ls="--" if causal else "-", label=n + (", causal" if causal else ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, numticks=12))
        ax.yaxis.set_minor_locator(matplotlib.ticker.LogLocator(base=10, subs=(2, 5), numticks=12))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.LogFormatterSciNotation(labelOnlyBase=False,
                                                                               minor_thresholds=(3, 1)))
        ax.tick_params(labelleft=True)
        ax.set_xlabel("kv_len (log2)")
        ax.set_ylabel("relative error vs float64 reference (log)")
        ax.set_title(f"{dtype}, {ACCURACY_SUITES[suite]}")
        ax.legend(fontsize=8)
    fig.suptitle(f"Error against the float64 reference as N grows, {_gpus(rows)}")
    return fig, None


def fig_decode_roofline(rows):
    """The decode roofline (bench/decode_roofline.sh): effective bandwidth against the bytes of K and V a call reads,
    one panel per page size, a line per number of new tokens (dashed: the bottom-right causal mask), for the fastest
    course step of each configuration (of caches of equal bytes, B x kv_len alike, the faster); medians over the
    rounds; the HBM read ceiling of the same run as a line."""
    import matplotlib.pyplot as plt

    decode = [r for r in rows if r["pass"] == "decode" and r["suite"].startswith("round") and not is_peer(r)]
    if not decode:
        return None, "no decode rows of alternating rounds (suite round<k>, bench/decode_roofline.sh)"
    read = [r["gbps"] / 1000 for r in select(rows, step="hbm-read", **{"pass": "ceiling"})]

    def pages(r):
        return int(r["suite"].split("-pages")[1]) if "-pages" in r["suite"] else 0

    times: dict = {}
    for r in decode:
        key = (pages(r), r["q_len"], r["causal"], 2 * r["batch"] * r["kv_len"] * r["kv_heads"] * r["head_dim"] * 2,
               r["step"])
        times.setdefault(key, []).append(r["gbps"] / 1000)
    best: dict = {}
    for (ps, q_len, causal, size, _), values in times.items():
        v = sorted(values)[len(values) // 2]
        best[(ps, q_len, causal, size)] = max(best.get((ps, q_len, causal, size), 0.0), v)
    panels = sorted({k[0] for k in best})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4.2), squeeze=False, sharey=True,
                             constrained_layout=True)
    tokens = sorted({k[1] for k in best})
    for ax, ps in zip(axes[0], panels):
        for n, q_len in enumerate(tokens):
            for causal in (0, 1):
                points = sorted((size / 2**20, v) for (p, q, c, size), v in best.items()
                                if p == ps and q == q_len and c == causal)
                if points:
                    colour = plt.cm.viridis(0.85 * n / max(1, len(tokens) - 1))
                    ax.plot(*zip(*points), marker="o", ls="--" if causal else "-", color=colour,
                            label=f"{q_len} new token{'s' if q_len > 1 else ''}" + (", causal" if causal else ""))
        if read:
            ax.axhline(sorted(read)[len(read) // 2], color="black", lw=1, ls=":", label="HBM read ceiling")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K and V read per call (MiB, log2)")
        ax.set_title(f"pages of {ps} tokens" if ps else "contiguous cache")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("TB/s (K and V read once / time)")
    axes[0][-1].legend(fontsize=7)
    heads = sorted({(r["q_heads"], r["kv_heads"], r["head_dim"]) for r in decode})
    fig.suptitle(f"Decode roofline, the fastest step, heads {', '.join(f'{a}/{b} d={c}' for a, b, c in heads)}, "
                 f"{_gpus(decode)}")
    return fig, None


#: The course run's shapes that stand for the teaching and headline suites (B, Nq, Nkv, Hq, Hkv, d).
COURSE_SUITES = {(4, 1024, 1024, 8, 8, 64): "teaching", (4, 4096, 4096, 16, 16, 64): "headline"}


def course_suites(rows: list[dict]) -> list[dict]:
    """The course run's forward rows at the teaching and headline shapes (d = 64) relabelled with those suites;
    the other rows as they are."""
    out = []
    for r in rows:
        shape = (r["batch"], r["q_len"], r["kv_len"], r["q_heads"], r["kv_heads"], r["head_dim"])
        if r["suite"] == "custom" and r["pass"] == "forward" and shape in COURSE_SUITES:
            r = dict(r, suite=COURSE_SUITES[shape])
        out.append(r)
    return out


#: Output file name -> figure function.
FIGURES = OrderedDict([
    ("time_teaching.png", fig_time_teaching),
    ("speedup_chain.png", fig_speedup_chain),
    ("tflops.png", fig_tflops),
    ("memory_sweep.png", fig_memory_sweep),
    ("accuracy.png", fig_accuracy),
])
#: Figures drawn from every row (decode and ceilings), not only the forward's.
ALL_ROWS_FIGURES = OrderedDict([
    ("decode_roofline.png", fig_decode_roofline),
])


def render(paths, out_dir: str, dpi: int = 110, course: bool = False, only=None) -> list[str]:
    """Write every figure the rows of `paths` allow into out_dir (those in `only`, if given); returns the files
    written. The figures are the forward's: backward rows are left out. `course`: see course_suites."""
    import matplotlib.pyplot as plt

    every = load(paths)
    if course:
        every = course_suites(every)
    rows = select(every, **{"pass": "forward"})
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for name, make in [*FIGURES.items(), *ALL_ROWS_FIGURES.items()]:
        if only and name not in only:
            continue
        fig, why_not = make(every if name in ALL_ROWS_FIGURES else rows)
        if fig is None:
            print(f"skipped {name}: {why_not}")
            continue
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
        written.append(path)
        print(f"wrote {path}")
    return written


def main(argv=None) -> int:
    """Command line: CSVs in, PNGs out."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="*", help="fa-bench CSVs (default: docs/results/*.csv)")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "figures"), help="output folder")
    parser.add_argument("--course", action="store_true", help="the CSV is the course's one run (course_run.sh): "
                        "its teaching and headline shapes at d = 64 stand for those suites")
    parser.add_argument("--only", default="", help="comma-separated figure names to write (default: all), one of "
                        + ", ".join([*FIGURES, *ALL_ROWS_FIGURES]))
    args = parser.parse_args(argv)
    only = [n for n in args.only.split(",") if n]
    unknown = [n for n in only if n not in FIGURES and n not in ALL_ROWS_FIGURES]
    if unknown:
        parser.error(f"--only: unknown figure(s) {', '.join(unknown)}; expected some of {', '.join([*FIGURES, *ALL_ROWS_FIGURES])}")
    paths = args.csv or sorted(glob.glob(os.path.join(REPO, "docs", "results", "*.csv")))
    if not paths:
        parser.error("no CSV given and none in docs/results/")
    import matplotlib

    matplotlib.use("Agg")
    render(paths, args.out, course=args.course, only=only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
