#!/usr/bin/env python3
"""The GPU's ceilings, measured in the same run as the steps they bound, as rows of fa-bench's CSV.

Run on the GPU machine, where torch is installed:

    python3 bench/ceilings.py --csv OUT.csv      # appends three rows (pass = ceiling)
    python3 bench/ceilings.py --dry-run          # what it would time, without torch

* `hbm-read`: a read-only sum over 2 GiB of bf16 (torch.sum): the bytes read over the time, in the `gbps` column.
  Decode reads K and V once, so this is its roofline (the decode tables' "read ceiling" row).
* `hbm-copy`: a device-to-device copy of 1 GiB (copy_): bytes read plus bytes written over the time, `gbps`.
* `gemm-bf16`: an 8192 x 8192 x 8192 bf16 matrix product (torch.mm, cuBLAS): 2·8192³ / t in the `tflops` column.
Each is the median of --reps calls timed as bench/sdpa_peers.py times the peers (CUDA events, the calls queued behind
a hold kernel). Rows: step = the name above, pass = ceiling, suite = ceiling, the shape columns 0 (a ceiling has no
attention shape).
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sdpa_peers  # noqa: E402  event_times, open_csv, fmt: the peers' timing and CSV, written once

#: name -> (dtype, what it times)
CEILINGS = {"hbm-read": ("bf16", "torch.sum over 2 GiB"), "hbm-copy": ("bf16", "copy_ of 1 GiB (read + write)"),
            "gemm-bf16": ("bf16", "torch.mm 8192 x 8192 x 8192")}


def row(name, gpu, ms, ms_min, ms_max, reps, tflops="nan", gbps="nan") -> list:
    """A ceiling as a row of fa-bench's CSV (tools/plots.py's COLUMNS), in their order."""
    values = {"step": name, "variant": "", "dtype": CEILINGS[name][0], "batch": 0, "q_len": 0, "kv_len": 0,
              "q_heads": 0, "kv_heads": 0, "head_dim": 0, "causal": 0, "ms": sdpa_peers.fmt(ms), "tflops": tflops,
              "extra_bytes": 0, "rel_err": "nan", "gpu": gpu, "suite": "ceiling", "ms_min": sdpa_peers.fmt(ms_min),
              "ms_max": sdpa_peers.fmt(ms_max), "reps": reps, "speedup_prev": "nan", "speedup_01": "nan",
              "vs_cublas": "nan", "max_err": "nan", "pass": "ceiling", "gbps": gbps}
    return [values[c] for c in sdpa_peers.COLUMNS]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", help="CSV to append to (header written if the file is new or empty)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    parser.add_argument("--reps", type=int, default=20, help="timed calls, median reported (default 20)")
    parser.add_argument("--dry-run", action="store_true", help="print what would be timed; needs no torch")
    args = parser.parse_args(argv)
    if args.dry_run:
        for name, (dtype, what) in CEILINGS.items():
            print(f"would time {name}: {what}, {dtype}, {args.warmup} warm-ups, median of {args.reps}")
        return 0
    if not args.csv:
        parser.error("--csv is required (or --dry-run)")
    try:
        import torch
    except ImportError as error:
        sys.exit(f"ceilings.py needs PyTorch: {error}")
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: ceilings.py times the GPU")
    gpu = torch.cuda.get_device_name()
    rows = []
    x = torch.ones(2**30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    ms, lo, hi, n = sdpa_peers.event_times(torch, lambda _: x.sum(), args)
    rows.append(row("hbm-read", gpu, ms, lo, hi, n, gbps=sdpa_peers.fmt(x.numel() * 2 / (ms * 1e6))))
    del x
    a = torch.ones(2**29, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    b = torch.empty_like(a)
    ms, lo, hi, n = sdpa_peers.event_times(torch, lambda _: b.copy_(a), args)
    rows.append(row("hbm-copy", gpu, ms, lo, hi, n, gbps=sdpa_peers.fmt(2 * a.numel() * 2 / (ms * 1e6))))
    del a, b
    m = 8192
    p = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    ms, lo, hi, n = sdpa_peers.event_times(torch, lambda _: torch.mm(p, q), args)
    rows.append(row("gemm-bf16", gpu, ms, lo, hi, n, tflops=sdpa_peers.fmt(2 * m**3 / (ms * 1e9))))
    with sdpa_peers.open_csv(args.csv) as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    for r in rows:
        values = dict(zip(sdpa_peers.COLUMNS, r))
        print(f"{values['step']:<10} {values['ms']} ms, " + (f"{float(values['gbps']) / 1000:.3g} TB/s"
              if values["gbps"] != "nan" else f"{values['tflops']} TFLOPS") + f" ({gpu})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
