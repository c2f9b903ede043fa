#!/usr/bin/env python3
"""torch.autograd.gradcheck through fa_course, one step pair per track (issue 33). Needs a GPU and PyTorch.

No step takes float64, so gradcheck's finite differences run in float32: the steps' float32 pair (forward 11-f32,
backward 27, both on the CUDA cores) with a step of 1e-3 and tolerances of float32's size, on a small problem (GQA,
causal and not, q_len != kv_len). The 16-bit tracks (mma.sync, Hopper, decode) are checked by FlashAttention's error
rule instead (flash_attn_shapes.py): finite differences in 16 bits measure rounding, not the gradient.

    PYTHONPATH=build/python python3 python/tests/gradcheck_steps.py
"""
import sys

import torch

import fa_course.torch as fat


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
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
