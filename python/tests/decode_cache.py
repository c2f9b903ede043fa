#!/usr/bin/env python3
"""The decode steps through fa_course with a KV cache, against a reference (issue 33). Needs a GPU and PyTorch.

For every decode step this GPU runs (a step whose cache forms take new tokens, max_q_len > 0), every dtype and
head_dim it takes: a batch of four sequences of different lengths (1, 77, 300 and 320 keys) in a cache of capacity
320, GQA 8/2 and MHA 4/4; one new token, and three under the bottom-right causal mask where the step takes it; the
contiguous cache, and where the step takes pages, pools of 16-token pages in a shuffled order. Every key past a
sequence's length, and every page no sequence uses, holds NaN: a read of one shows. Compared as FlashAttention-3's
tests compare: the step's largest error against a float32 reference at most twice PyTorch's own attention's in the
input dtype, plus twice the dtype's rounding at the reference's size.

    PYTHONPATH=build/python python3 python/tests/decode_cache.py [--steps 44,46]

Prints one line per case that fails and a summary; exits 1 if any failed.
"""
from __future__ import annotations

import argparse
import itertools
import sys

import torch

if __name__ == "__main__" and not torch.cuda.is_available():
    print("skipped: no CUDA device")  # ctest: exit 77 reads as skipped
    sys.exit(77)

import fa_course
import fa_course.torch as fat
from flash_attn_shapes import DTYPES, attention_ref, runs_here

LENS, CAPACITY, PAGE = [1, 77, 300, 320], 320, 16
HEADS = {"gqa": (8, 2), "mha": (4, 4)}


def check(step, dtype_name, d, heads, q_len, causal, paged):
    """Runs one case; returns a failure line or None."""
    dtype = DTYPES[dtype_name]
    hq, hkv = HEADS[heads]
    b = len(LENS)
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(b, q_len, hq, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(b, CAPACITY, hkv, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(b, CAPACITY, hkv, d, device="cuda", dtype=dtype, generator=gen)
    for i, n in enumerate(LENS):  # past each length: NaN
        k[i, n:], v[i, n:] = float("nan"), float("nan")
    lens = torch.tensor(LENS, dtype=torch.int32, device="cuda")
    forms = dict(causal=causal, kv_lens=lens, **({"causal_align": "bottom-right"} if causal else {}))
    if paged:  # pages in a shuffled order, and as many unused pages again, all NaN
        per_seq = CAPACITY // PAGE
        order = torch.randperm(2 * b * per_seq, generator=torch.Generator().manual_seed(2))[: b * per_seq]
        table = order.view(b, per_seq).to(torch.int32).cuda()
        k_pool = torch.full((2 * b * per_seq, PAGE, hkv, d), float("nan"), device="cuda", dtype=dtype)
        v_pool = torch.full_like(k_pool, float("nan"))
        k_pool[table.long().flatten()] = k.reshape(b * per_seq, PAGE, hkv, d)
        v_pool[table.long().flatten()] = v.reshape(b * per_seq, PAGE, hkv, d)
        out, _ = fat.forward(step["label"], q, k_pool, v_pool, page_table=table, **forms)
    else:
        out, _ = fat.forward(step["label"], q, k, v, **forms)
    where = (f"{step['label']} {dtype_name} d={d} {heads} q_len={q_len} causal={int(causal)} "
             f"{'pages of 16' if paged else 'contiguous'}")
    for i, n in enumerate(LENS):
        args = (q[i:i + 1], k[i:i + 1, :n], v[i:i + 1, :n], causal)
        ref = attention_ref(*args, align="bottom-right").to(dtype)
        pt = attention_ref(*args, upcast=False, reorder_ops=True, align="bottom-right")
        ours, theirs = (out[i:i + 1] - ref).abs().max().item(), (pt - ref).abs().max().item()
        atol = 2 * (ref + 0.3 - 0.3 - ref).abs().max().item()
        if not ours <= 2 * theirs + atol:  # NaN fails too
            return f"FAIL {where}: sequence {i} ({n} keys) O max error {ours:.3g} > 2 x {theirs:.3g} + {atol:.3g}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="", help="comma-separated labels (default: every decode step here)")
    args = parser.parse_args()
    major, minor = torch.cuda.get_device_capability()
    arch = 10 * major + minor
    wanted = [s for s in args.steps.split(",") if s]
    chosen = [s for s in fa_course.steps() if s["max_q_len"] > 0 and s["kv_lens"] and runs_here(s, arch)
              and (s["label"] in wanted if wanted else True)]
    failures = cases = 0
    for s in chosen:
        news = [(1, False)] + ([(3, True)] if s["bottom_right"] and s["max_q_len"] >= 3 else [])
        layouts = [False] + ([True] if s["paged"] else [])
        for dtype_name, d, heads, (q_len, causal), paged in itertools.product(
                s["dtypes"], s["head_dims"], HEADS, news, layouts):
            cases += 1
            line = check(s, dtype_name, d, heads, q_len, causal, paged)
            if line:
                failures += 1
                print(line, flush=True)
    print(f"{cases} cases, {failures} failed, {len(chosen)} decode steps ({', '.join(s['label'] for s in chosen)})")
    return 1 if failures or not chosen else 0


if __name__ == "__main__":
    sys.exit(main())
