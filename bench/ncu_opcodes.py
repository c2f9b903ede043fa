#!/usr/bin/env python3
"""Executed instructions per SASS opcode, from Nsight Compute's source page, for kernels set side by side.

Nsight Compute's SourceCounters section counts, for every SASS instruction of a kernel, how many times a warp
executed it and how often a sampled warp sat stalled on it. This script sums both per opcode (HMMA, LDSM, IMAD,
...; predicates and modifiers dropped) so that two kernels doing the same mathematics can be compared: what one
issues that the other does not. On the device:

    ncu --section SourceCounters --kernel-name regex:lean_loop --launch-count 1 -o rep32 build/bench/fa-bench ...
    ncu -i rep32.ncu-rep --page source --csv --print-source sass > rep32-sass.csv

then, anywhere (no GPU needed):

    python3 bench/ncu_opcodes.py step32=rep32-sass.csv step31=rep31-sass.csv fa2=repfa2-sass.csv [--top 30]

prints, per opcode, millions of warp-level instructions executed and the share of stall samples of each kernel.
"""
import argparse
import collections
import csv
import re


def load(path):
    """Returns (instructions per opcode, stall samples per opcode, total instructions, total samples)."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    header_at = next(i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r)
    header = rows[header_at]
    i_src, i_ex = header.index("Source"), header.index("Instructions Executed")
    i_st = header.index("Warp Stall Sampling (All Samples)")
    executed, stalls = collections.Counter(), collections.Counter()
    for r in rows[header_at + 1:]:
        if len(r) <= max(i_src, i_ex, i_st) or not r[i_src].strip():
            continue
        try:
            n, samples = int(r[i_ex].replace(",", "")), int(r[i_st].replace(",", ""))
        except ValueError:
            continue
        opcode = re.sub(r"^@!?U?P\w+\s+", "", r[i_src].strip()).split()[0].split(".")[0]
        executed[opcode] += n
        stalls[opcode] += samples
    return executed, stalls, sum(executed.values()), sum(stalls.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernels", nargs="+", help="label=source-page.csv")
    ap.add_argument("--top", type=int, default=30, help="opcodes to print, most executed first")
    args = ap.parse_args()
    labels, data = [], []
    for spec in args.kernels:
        label, _, path = spec.partition("=")
        labels.append(label)
        data.append(load(path))
    print("kernel: " + ", ".join(f"{l} {d[2] / 1e6:.1f} M instructions" for l, d in zip(labels, data)))
    opcodes = sorted(set().union(*(d[0] for d in data)), key=lambda k: -sum(d[0][k] for d in data))
    print(f"{'opcode':10s}" + "".join(f" {l + ' M':>12s}" for l in labels) + "".join(f" {l + ' stall%':>13s}" for l in labels))
    for op in opcodes[: args.top]:
        line = f"{op:10s}" + "".join(f" {d[0][op] / 1e6:12.2f}" for d in data)
        line += "".join(f" {100 * d[1][op] / max(d[3], 1):13.1f}" for d in data)
        print(line)


if __name__ == "__main__":
    main()
