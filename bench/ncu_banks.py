#!/usr/bin/env python3
"""Count shared-memory bank conflicts (and achieved occupancy) of any step with Nsight Compute.

Runs `fa-run` once per step label under `ncu` and reads, for the attention
kernel only, the shared-memory load/store instructions, the wavefronts they
took and the bank conflicts (extra wavefronts) Nsight Compute counted. Needs a
GPU and ncu. Writes a CSV and prints a markdown table:

    python3 bench/ncu_banks.py --csv banks.csv [--steps 04,05-pad1] [--shape 4,1024,1024,8,8,64] [--dtype f32]
"""
import argparse
import csv
import io
import subprocess
import sys

METRICS = {
    "ld_instructions": "smsp__inst_executed_op_shared_ld.sum",
    "st_instructions": "smsp__inst_executed_op_shared_st.sum",
    "ld_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "st_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    "ld_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "st_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "duration_ns": "gpu__time_duration.sum",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
}
# Every step's attention kernel is named <step folder name>_kernel (tiled_online_softmax_kernel,
# bank_conflicts_kernel, sp_reuse_kernel, register_tiling_kernel, ...).
KERNELS = "regex:_kernel"


def profile(label, shape, dtype, fa_run, ncu):
    cmd = [ncu, "--clock-control", "none", "--csv", "--kernel-name", KERNELS,
           "--metrics", ",".join(METRICS.values()),
           fa_run, "--step", label, "--random", shape, "--dtype", dtype, "--dump", "/tmp/ncu-banks-" + label]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    # ncu prints its own log lines ("==PROF==") before the CSV.
    table = out[out.index('"ID"'):]
    values = {}
    for row in csv.DictReader(io.StringIO(table)):
        name = row["Metric Name"]
        values[name] = values.get(name, 0.0) + float(row["Metric Value"].replace(",", ""))
    missing = [m for m in METRICS.values() if m not in values]
    if missing:
        sys.exit(f"ncu reported no {missing} for {label}: did the kernel run?")
    return {key: values[metric] for key, metric in METRICS.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="04,05-pad1,05-pad4,05-pad4_vec4,05-transpose")
    parser.add_argument("--shape", default="4,1024,1024,8,8,64", help="B,Nq,Nkv,Hq,Hkv,d")
    parser.add_argument("--dtype", default="f32")
    parser.add_argument("--fa-run", default="build/bench/fa-run")
    parser.add_argument("--ncu", default="ncu")
    parser.add_argument("--csv", required=True)
    args = parser.parse_args()

    rows = []
    for label in args.steps.split(","):
        r = profile(label, args.shape, args.dtype, args.fa_run, args.ncu)
        r = {"step": label, "shape": args.shape, "dtype": args.dtype, **r}
        # Wavefronts per instruction: 1 is conflict-free for 4-byte accesses.
        r["ld_ways"] = r["ld_wavefronts"] / r["ld_instructions"]
        r["st_ways"] = r["st_wavefronts"] / r["st_instructions"]
        rows.append(r)
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    print(f"shape B,Nq,Nkv,Hq,Hkv,d = {args.shape}, {args.dtype}, one launch under ncu --clock-control none")
    print("| step | ld instr | ld conflicts | ld wavefronts/instr | st instr | st conflicts | st wavefronts/instr | kernel ms (ncu) | achieved occupancy |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['step']} | {r['ld_instructions']:.4g} | {r['ld_conflicts']:.4g} | {r['ld_ways']:.2f} | "
              f"{r['st_instructions']:.4g} | {r['st_conflicts']:.4g} | {r['st_ways']:.2f} | {r['duration_ns'] / 1e6:.3f} | "
              f"{r['occupancy_pct']:.1f} % |")


if __name__ == "__main__":
    main()
