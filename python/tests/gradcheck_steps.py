#!/usr/bin/env python3
"""torch.autograd.gradcheck through fa_course, one step pair per track (issue 33). Needs a GPU and PyTorch.

No step takes float64, so gradcheck's finite differences run in float32: the steps' float32 pair (forward 11-f32,
backward 27, both on the CUDA cores) with a step of 1e-3 and tolerances of float32's size, on a small problem (GQA,
causal and not, q_len != kv_len). Finite differences in 16 bits measure rounding, not the gradient, so the 16-bit
tracks take FlashAttention's error rule instead: the gradients through fa_course.torch.attention (the autograd
Function, forward and backward steps by name) against float32 autograd, at most twice PyTorch's own in f16, for
one pair a track: mma.sync (forward 18, backward 37) and Hopper (forward 25, backward 40, where the GPU is sm_90).
The decode track has no backward; python/tests/decode_cache.py checks it.

    PYTHONPATH=build/python python3 python/tests/gradcheck_steps.py
"""
import itertools
import sys

import torch

if __name__ == "__main__" and not torch.cuda.is_available():
    print("skipped: no CUDA device")  # ctest: exit 77 reads as skipped
    sys.exit(77)

import fa_course.torch as fat
from flash_attn_shapes import attention_ref


def main() -> int:
    failures = 0
    for causal in (False, True):
        gen = torch.Generator(device="cuda").manual_seed(3)
        q = torch.randn(1, 5, 4, 32, device="cuda", generator=gen).requires_grad_()
        k = torch.randn(1, 7, 2, 32, device="cuda", generator=gen).requires_grad_()
        v = torch.randn(1, 7, 2, 32, device="cuda", generator=gen).requires_grad_()

        def attention(q, k, v):
            return fat.attention(q, k, v, forward_step="11-f32", backward_step="27", causal=causal)

        ok = torch.autograd.gradcheck(attention, (q, k, v), eps=1e-3, atol=2e-3, rtol=2e-2, raise_exception=False)
        print(f"gradcheck 11-f32 / 27, causal={causal}: {'passed' if ok else 'FAILED'}")
        failures += not ok
    major, minor = torch.cuda.get_device_capability()
    pairs = [("18", "37")] + ([("25", "40")] if (major, minor) == (9, 0) else [])
    for (fwd, bwd), causal in itertools.product(pairs, (False, True)):
        gen = torch.Generator(device="cuda").manual_seed(4)
        q, k, v = (torch.randn(2, n, h, 64, device="cuda", dtype=torch.float16, generator=gen)
                   for n, h in ((77, 6), (130, 2), (130, 2)))
        g = torch.randn(2, 77, 6, 64, device="cuda", dtype=torch.float16, generator=gen)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ours = torch.autograd.grad(fat.attention(*leaves, forward_step=fwd, backward_step=bwd, causal=causal),
                                   leaves, g)
        ref = torch.autograd.grad(attention_ref(*leaves, causal), leaves, g)
        pt = torch.autograd.grad(attention_ref(*leaves, causal, upcast=False, reorder_ops=True), leaves, g)
        worst = [(name, (a - r).abs().max().item(), (p - r).abs().max().item())
                 for name, a, r, p in zip(("dQ", "dK", "dV"), ours, ref, pt)]
        ok = all(e <= 2 * e_pt for _, e, e_pt in worst)
        print(f"FlashAttention's rule through autograd, {fwd} / {bwd} f16, causal={causal}: "
              f"{'passed' if ok else 'FAILED'} (" + ", ".join(f"{n} {e:.2g} vs PyTorch {p:.2g}" for n, e, p in worst)
              + ")")
        failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
