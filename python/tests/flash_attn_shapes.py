#!/usr/bin/env python3
"""FlashAttention's shape matrix, run against the course's steps through fa_course (issue 33). Needs a GPU and PyTorch.

The matrix of FlashAttention-2's tests/test_flash_attn.py (test_flash_attn_output), written here from its
parameters: (seqlen_q, seqlen_k) pairs from (113, 203) to (2048, 2048), batch 4, 9 query heads over 9, 3 or 1 KV
heads (MHA, GQA, MQA), causal and not, for each head_dim and dtype a step takes. Compared as FlashAttention compares:
against a reference computed in float32 from the same inputs (float64 for float32 inputs), the step's largest
error must be at most twice that of PyTorch's own attention in the input dtype (with the scale applied to Q first),
for O and, for the backward steps, for dQ, dK and dV. FlashAttention's tests have no float32 case; here float32
steps get the same rule plus a floor that scales with the reference's size, 1e-5 x max(1, its largest magnitude),
about 84 float32 rounding units (FlashAttention-3's tests add a floor of the same kind: twice the reference dtype's
rounding at the reference's size). A float32 sum's rounding grows with its terms and their size: at MQA a dV
element sums 9 heads' keys, and PyTorch's cuBLAS sums in a different order from the course's kernels.

The causal mask is the course's: top-left (query i sees keys 0 .. i), as every forward step takes it; FlashAttention
2.1 and later align it bottom-right when seqlen_q != seqlen_k. The reference uses the same alignment.

    PYTHONPATH=build/python python3 python/tests/flash_attn_shapes.py [--steps 11,27] [--pairs 113x203,1024x1023]
        [--quick]

--quick: the first three pairs only (for the CUDA-core steps 01-08, which take minutes on the larger ones).
Prints one line per (step, case) that fails and a summary; exits 1 if any failed.
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
import time

import torch

import fa_course
import fa_course.torch as fat

PAIRS = [(113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256), (1024, 1024), (1023, 1024),
         (1024, 1023), (2048, 2048)]
BATCH, HEADS = 4, 9
KV_HEADS = {"mha": 9, "gqa": 3, "mqa": 1}
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def attention_ref(q, k, v, causal, upcast=True, reorder_ops=False, align="top-left"):
    """O of q [B, Nq, H, d], k and v [B, Nkv, Hkv, d]: in float32 (float64 for float32 inputs) when upcast, else in
    the inputs' dtype with the scale applied to q first (PyTorch's own attention, the error the rule measures).
    The causal mask top-left (query i sees keys 0 .. i) or bottom-right (keys 0 .. i + Nkv - Nq, a KV cache's)."""
    dtype = q.dtype
    if upcast:
        wide = torch.float64 if dtype == torch.float32 else torch.float32
        q, k, v = q.to(wide), k.to(wide), v.to(wide)
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scale = 1 / math.sqrt(q.shape[-1])
    if reorder_ops:
        scores = torch.einsum("bthd,bshd->bhts", q * scale, k)
    else:
        scores = torch.einsum("bthd,bshd->bhts", q, k * scale)
    if causal:
        n_q, n_k = q.shape[1], k.shape[1]
        shift = n_k - n_q if align == "bottom-right" else 0
        masked = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(1 + shift)
        scores = scores.masked_fill(masked, float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row that sees no key: O = 0
    return torch.einsum("bhts,bshd->bthd", p, v).to(dtype)


def forward_for(problem_dtype: str, head_dim: int, arch: int, steps: list[dict]) -> str:
    """The course's last forward step that takes the dtype and head_dim and runs here: the backward's O and LSE."""
    for s in reversed(steps):
        if (s["pass"] == "forward" and s["max_q_len"] == 0 and problem_dtype in s["dtypes"]
                and head_dim in s["head_dims"] and runs_here(s, arch)):
            return s["label"]
    raise RuntimeError(f"no forward step takes {problem_dtype} at head_dim {head_dim} on this GPU")


def runs_here(step: dict, arch: int) -> bool:
    """Whether the step's min_gpu ('any', 'sm_80', 'sm_90a') admits compute capability `arch` (90 for an H100)."""
    need = step["min_gpu"]
    if need == "any":
        return True
    number = int(need[3:5])
    return arch == number if need.endswith("a") else arch >= number


def check(label, step, pair, mha, causal, dtype_name, d, arch, steps):
    """Runs one case; returns a failure line or None."""
    n_q, n_k = pair
    dtype = DTYPES[dtype_name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(BATCH, n_q, HEADS, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(BATCH, n_k, KV_HEADS[mha], d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(BATCH, n_k, KV_HEADS[mha], d, device="cuda", dtype=dtype, generator=gen)
    floor = (lambda ref: 1e-5 * max(1.0, ref.abs().max().item())) if dtype == torch.float32 else (lambda ref: 0.0)
    where = f"{label} {dtype_name} d={d} {n_q}x{n_k} {mha} causal={int(causal)}"
    if step["pass"] == "forward":
        out, _ = fat.forward(label, q, k, v, causal=causal)
        ref, pt = attention_ref(q, k, v, causal), attention_ref(q, k, v, causal, upcast=False, reorder_ops=True)
        ours, theirs = (out - ref).abs().max().item(), (pt - ref).abs().max().item()
        if not ours <= 2 * theirs + floor(ref):
            return f"FAIL {where}: O max error {ours:.3g} > 2 x PyTorch's {theirs:.3g} + {floor(ref):.3g}"
        return None
    # A backward step: O and LSE from the course's forward, the reference gradients through autograd.
    out, lse = fat.forward(forward_for(dtype_name, d, arch, steps), q, k, v, causal=causal)
    g = torch.randn(out.shape, device="cuda", dtype=dtype, generator=gen)
    grads = fat.backward(label, q, k, v, out, lse, g, causal=causal)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(attention_ref(*leaves, causal), leaves, g)
    pt = torch.autograd.grad(attention_ref(*leaves, causal, upcast=False, reorder_ops=True), leaves, g)
    for name, ours_t, ref_t, pt_t in zip(("dQ", "dK", "dV"), grads, ref, pt):
        ours, theirs = (ours_t - ref_t).abs().max().item(), (pt_t - ref_t).abs().max().item()
        if not ours <= 2 * theirs + floor(ref_t):
            return (f"FAIL {where}: {name} max error {ours:.3g} > 2 x PyTorch's {theirs:.3g} + {floor(ref_t):.3g} "
                    f"(largest |{name}| {ref_t.abs().max().item():.3g})")
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="", help="comma-separated labels (default: every step this GPU runs, "
                        "forward and backward, not the decode steps)")
    parser.add_argument("--pairs", default="", help="e.g. 113x203,1024x1023 (default: the ten pairs)")
    parser.add_argument("--quick", action="store_true", help="the first three pairs only")
    args = parser.parse_args()
    major, minor = torch.cuda.get_device_capability()
    arch = 10 * major + minor
    steps = fa_course.steps()
    wanted = [s for s in args.steps.split(",") if s]
    chosen = [s for s in steps if (s["label"] in wanted if wanted else s["max_q_len"] == 0) and runs_here(s, arch)]
    pairs = [tuple(int(x) for x in p.split("x")) for p in args.pairs.split(",") if p] or PAIRS
    if args.quick:
        pairs = pairs[:3]
    failures, cases, started = [], 0, time.time()
    for s in chosen:
        step_failures = 0
        for pair, mha, causal, dtype_name in itertools.product(pairs, KV_HEADS, (False, True), s["dtypes"]):
            for d in s["head_dims"]:
                cases += 1
                line = check(s["label"], s, pair, mha, causal, dtype_name, d, arch, steps)
                if line:
                    failures.append(line)
                    print(line, flush=True)
                    step_failures += 1
        print(f"step {s['label']}: {step_failures} failing cases ({time.time() - started:.0f} s so far)", flush=True)
    print(f"{cases} cases, {len(failures)} failed, {len(chosen)} steps, {time.time() - started:.0f} s")
    return 1 if failures or not cases else 0  # no case run is no evidence


if __name__ == "__main__":
    sys.exit(main())
