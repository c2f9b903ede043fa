#!/usr/bin/env python3
"""Static SASS instruction counts per kernel: what each step's idea turned into in the binary.

    python3 bench/sass_counts.py [--build build] [--steps 08,...,17] [--csv FILE]

Runs `cuobjdump -sass` on each step's library (build/steps/NN_*/libfa_step_*.a; no GPU needed), and
counts, per kernel, the instructions the course's steps are about: HMMA (tensor-core mma), HGMMA (wgmma),
LDSM and LDSM.T (ldmatrix, ldmatrix.trans), LDGSTS (cp.async), MUFU.EX2 (ex2.approx), FMUL/FFMA/FADD, BAR
(__syncthreads), LDL/STL (local memory: register spills), and R2UR (a value moved from a thread's registers to
the warp's uniform ones: what a wgmma descriptor built from a value the compiler cannot prove warp-uniform
costs). Static counts in the binary, not executed counts: a loop body counts once. Each kernel has a row for the whole kernel (part "kernel") and one per loop
body (part "loop 1", "loop 2", ... in address order: the instructions from a backward branch's target to the
branch), which is where the READMEs' "instructions per warp and tile" come from. Kernel names are demangled
with cu++filt or c++filt when found.

cuobjdump, and the nvdisasm it runs, come with the CUDA toolkit. A machine with nvcc alone (or none) can fetch them
from NVIDIA's wheels: `pip download --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`, unzip both, then pass
`--cuobjdump <dir>/nvidia/cu13/bin/cuobjdump` and put nvdisasm's `bin` folder on PATH.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

COUNTED = {  # column -> what in an instruction's opcode counts for it
    "HMMA": r"^HMMA\b",
    "HGMMA": r"^HGMMA\b",
    "LDSM": r"^LDSM\.16\.M88",
    "LDSM.T": r"^LDSM\.16\.MT88",
    "LDGSTS": r"^LDGSTS\b",
    "MUFU.EX2": r"^MUFU\.EX2\b",
    "FMUL": r"^FMUL\b",
    "FFMA": r"^FFMA\b",
    "FADD": r"^FADD\b",
    "BAR": r"^BAR\.SYNC",
    "LDL/STL": r"^(LDL|STL)\b",
    "R2UR": r"^R2UR\b",
}
OPCODE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*)")
BACKWARD_TARGET = re.compile(r"(0x[0-9a-f]+)")


def demangle(names: list[str]) -> list[str]:
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool or not names:
        return names
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return [re.sub(r"^fa::step\d+::\(anonymous namespace\)::", "", o) for o in out] if len(out) == len(names) else names


def tally(opcodes: list[str]) -> dict[str, int]:
    """The COUNTED columns over a list of opcodes, plus "instructions": how many there are."""
    out = {c: sum(1 for op in opcodes if re.match(pattern, op)) for c, pattern in COUNTED.items()}
    out["instructions"] = len(opcodes)
    return out


def parts(code: list[tuple[int, str, str]]) -> list[tuple[str, dict[str, int]]]:
    """The whole kernel, then each loop body: from a backward BRA's target to the BRA itself."""
    index = {address: i for i, (address, _, _) in enumerate(code)}
    found = [("kernel", tally([op for _, op, _ in code]))]
    for i, (address, op, operands) in enumerate(code):
        if op.startswith("BRA") and (m := BACKWARD_TARGET.search(operands)):
            target = int(m.group(1), 16)
            if target < address and target in index:
                body = [o for _, o, _ in code[index[target]:i + 1]]
                found.append((f"loop {len(found)}", tally(body)))
    return found


def counts(library: str, cuobjdump: str) -> list[tuple[str, str, str, dict[str, int]]]:
    sass = subprocess.run([cuobjdump, "-sass", library], capture_output=True, text=True, check=True).stdout
    kernels, arch, kernel, code = [], "?", None, []
    for line in sass.splitlines():
        if m := re.search(r"arch = (sm_\d+)", line):
            arch = m.group(1)
        elif m := re.search(r"Function : (\S+)", line):
            if kernel:
                kernels.append((kernel, arch, code))
            kernel, code = m.group(1), []
        elif kernel and (m := OPCODE.search(line)):
            code.append((int(m.group(1), 16), m.group(2), m.group(3)))
    if kernel:
        kernels.append((kernel, arch, code))
    names = demangle([k for k, _, _ in kernels])
    return [(n, a, part, t) for n, (_, a, code) in zip(names, kernels) for part, t in parts(code)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build")
    parser.add_argument("--steps", default="08,09,10,11,12,13,14,15,16,17")
    parser.add_argument("--csv", help="write here as well as to stdout")
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    args = parser.parse_args(argv)
    if not (shutil.which(args.cuobjdump) or os.access(args.cuobjdump, os.X_OK)):
        print(f"sass_counts: no cuobjdump at '{args.cuobjdump}': it comes with the CUDA toolkit, or from the wheels "
              "named at the top of this script (--cuobjdump PATH)", file=sys.stderr)
        return 1
    if not shutil.which("nvdisasm"):
        print("sass_counts: no nvdisasm on PATH: cuobjdump -sass runs it (the CUDA toolkit's bin folder, or the "
              "nvidia-cuda-nvdisasm wheel's)", file=sys.stderr)
        return 1
    columns = [*COUNTED, "instructions"]
    rows = ["step,kernel,arch,part," + ",".join(columns)]
    for step in args.steps.split(","):
        libraries = sorted(glob.glob(os.path.join(args.build, "steps", f"{step}_*", "libfa_step_*.a")))
        if not libraries:
            print(f"sass_counts: no library for step {step} under {args.build}/steps (build it first)", file=sys.stderr)
            return 1
        for library in libraries:
            for kernel, arch, part, numbers in counts(library, args.cuobjdump):
                rows.append(f'{step},"{kernel}",{arch},{part},' + ",".join(str(numbers[c]) for c in columns))
    text = "\n".join(rows) + "\n"
    sys.stdout.write(text)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
