#!/usr/bin/env python3
"""The models' features through fa_course.torch, forward and backward (issue 58). Needs an sm_90 GPU and PyTorch.

The last forward step and the last backward step that take a sliding window, a soft-cap and sinks, found in the
registry (steps()), run through fa_course.torch.attention (the autograd Function) and attention_op (the custom ops)
with each feature alone and all three at once, GQA, q_len != kv_len, causal and not; O and the gradients of q, k,
v and, with sinks, of the sinks are held to FlashAttention's error rule: the error against a float32 computation at
most twice PyTorch's own in the dtype (plus 1e-5 for dsinks, a sum whose terms cancel). A pack (cu_seqlens) runs
through the forward against each sequence alone, and through the backward where a backward step takes packs.

    PYTHONPATH=build/python python3 python/tests/feature_grads.py
"""
import math
import sys

import torch

if __name__ == "__main__" and (not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0)):
    print("skipped: no sm_90 CUDA device")  # ctest: exit 77 reads as skipped
    sys.exit(77)

import fa_course
import fa_course.torch as fat
from attention_reference import reference  # beside this script


def last_step(pass_, feature_names):
    """The label of the last step of `pass_` that takes every feature named."""
    for s in reversed(fa_course.steps()):
        if s["pass"] == pass_ and all(s[name] for name in feature_names) and 128 in s["head_dims"]:
            return s["label"]
    raise RuntimeError(f"no {pass_} step takes {feature_names}")


def main() -> int:
    forward_step = last_step("forward", ("window", "softcap", "sinks", "varlen"))
    backward_step = last_step("backward", ("window", "softcap", "sinks"))
    failures = 0
    configs = [("window (48, 0)", dict(window=(48, 0), softcap=0.0, sinks=False)),
               ("window (30, 20)", dict(window=(30, 20), softcap=0.0, sinks=False)),
               ("softcap 5", dict(window=(-1, -1), softcap=5.0, sinks=False)),
               ("sinks", dict(window=(-1, -1), softcap=0.0, sinks=True)),
               ("all three", dict(window=(64, -1), softcap=20.0, sinks=True))]
    for (name, f), causal, dtype, through in ((c, causal, dtype, through) for c in configs for causal in (False, True)
                                              for dtype in (torch.float16, torch.bfloat16)
                                              for through in ("autograd", "ops")):
        if causal and f["window"][1] > 0:
            continue  # causal caps the right side at 0: the same as (left, 0)
        gen = torch.Generator(device="cuda").manual_seed(7)
        q = torch.randn(2, 150, 8, 128, device="cuda", generator=gen).mul(2).to(dtype)
        k, v = (torch.randn(2, 190, 2, 128, device="cuda", generator=gen).to(dtype) for _ in range(2))
        g = torch.randn(2, 150, 8, 128, device="cuda", generator=gen).to(dtype)
        sinks = torch.randn(8, device="cuda", generator=gen) if f["sinks"] else None
        leaves = [t.clone().requires_grad_() for t in (q, k, v)] + ([sinks.clone().requires_grad_()] if f["sinks"]
                                                                     else [])
        call = fat.attention if through == "autograd" else fat.attention_op
        out = call(*leaves[:3], forward_step=forward_step, backward_step=backward_step, causal=causal,
                   window_size=f["window"], softcap=f["softcap"], sinks=leaves[3] if f["sinks"] else None)
        ours = (out,) + torch.autograd.grad(out, leaves, g)
        kwargs = dict(causal=causal, window=f["window"], softcap=f["softcap"])
        ref_out = reference(*leaves[:3], sinks=leaves[3] if f["sinks"] else None, **kwargs)
        ref = (ref_out,) + torch.autograd.grad(ref_out, leaves, g)
        pt_out = reference(*leaves[:3], sinks=leaves[3] if f["sinks"] else None, upcast=False, **kwargs)
        pt = (pt_out,) + torch.autograd.grad(pt_out, leaves, g)
        names = ("O", "dQ", "dK", "dV", "dsinks")
        worst = [(n, (a.float() - r.float()).abs().max().item(), (p.float() - r.float()).abs().max().item())
                 for n, a, r, p in zip(names, ours, ref, pt)]
        ok = all(math.isfinite(e) and e <= 2 * e_pt + (1e-5 if n == "dsinks" else 0) for n, e, e_pt in worst)
        print(f"{name}, {forward_step} / {backward_step} {str(dtype)[6:]}, causal={causal}, {through}: "
              f"{'passed' if ok else 'FAILED'} (" + ", ".join(f"{n} {e:.2g} vs PyTorch {p:.2g}" for n, e, p in worst)
              + ")")
        failures += not ok

    # A pack: each sequence of the packed call against the same sequence alone (the forward step unpacked).
    lengths = [1, 127, 128, 129, 300]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(8)
    q = torch.randn(int(cu[-1]), 8, 128, device="cuda", generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(int(cu[-1]), 2, 128, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    packed = fat.attention(q, k, v, forward_step=forward_step, causal=True, window_size=(100, 0), softcap=30.0,
                           cu_seqlens_q=cu, cu_seqlens_k=cu)
    worst = 0.0
    for b in range(len(lengths)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        alone = fat.attention(q[rows][None], k[rows][None], v[rows][None], forward_step=forward_step, causal=True,
                              window_size=(100, 0), softcap=30.0)[0]
        worst = max(worst, (packed[rows].float() - alone.float()).abs().max().item())
    ok = worst < 1e-2  # the same kernel on the same rows and keys: a misplaced offset is off by O(1)
    print(f"a pack of {lengths} through {forward_step}: each sequence as alone, largest difference {worst:.2g}: "
          f"{'passed' if ok else 'FAILED'}")
    failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
