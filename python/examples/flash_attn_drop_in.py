#!/usr/bin/env python3
"""Code written for FlashAttention, run on the course (issue 59): the one line that changes is the import.

    from flash_attn import flash_attn_func, flash_attn_with_kvcache           # FlashAttention
    from fa_course.flash_attn import flash_attn_func, flash_attn_with_kvcache  # the course: the same calls

The calls below are a decoder's attention as FlashAttention's users write it: a batch of prompts through
flash_attn_func (causal, GQA: 32 query heads over 8 KV heads of 128), their keys and values stored in a paged cache
(pages of 16 in one pool, a block table a sequence, as a server keeps them), then decoding steps through
flash_attn_with_kvcache, which appends each step's new key and value to the cache in place and attends over the
whole sequence. Every output is compared with PyTorch's SDPA on the same tensors (float32), and the course's step
each call ran is printed (fa_course.flash_attn.last_choice(); FA_COURSE_DEBUG=1 prints every choice as it is made).
--flash-attn runs the same function with FlashAttention's own package instead, where it is installed.

Needs a CUDA GPU, PyTorch and fa_course (a Hopper GPU for the prompts' steps in bf16 with pages; an Ampere one takes
f16 prompts through step 18: --dtype f16).

    PYTHONPATH=build/python python3 python/examples/flash_attn_drop_in.py [--dtype bf16] [--steps 16] [--flash-attn]
"""
import argparse
import sys

import torch


def sdpa(q, k, v, lengths):
    """PyTorch's attention in float32 of each sequence's last q.shape[1] rows over its first lengths[b] keys (the
    causal diagonal at the last key, as FlashAttention's), [B, N, H, d] in and out."""
    out = torch.empty_like(q, dtype=torch.float32)
    n_new = q.shape[1]
    for b, length in enumerate(lengths.tolist()):
        qb, kb, vb = (x[b:b + 1].float().transpose(1, 2) for x in (q, k[:, :length], v[:, :length]))
        rows = torch.arange(length - n_new, length, device=q.device)[:, None]
        mask = torch.arange(length, device=q.device)[None, :] <= rows
        out[b] = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask,
                                                                  enable_gqa=True)[0].transpose(0, 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    parser.add_argument("--steps", type=int, default=16, help="decoding steps")
    parser.add_argument("--flash-attn", action="store_true", help="FlashAttention's package instead of the course")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 77
    if args.flash_attn:
        from flash_attn import flash_attn_func, flash_attn_with_kvcache
        last_choice = None
    else:  # the only line a FlashAttention user changes
        from fa_course.flash_attn import flash_attn_func, flash_attn_with_kvcache, last_choice
    dev, dtype = "cuda", dict(bf16=torch.bfloat16, f16=torch.float16)[args.dtype]
    torch.manual_seed(0)
    batch, prompt, hq, hkv, d, page = 4, 1000, 32, 8, 128, 16
    capacity = prompt + args.steps
    pages_a_sequence = -(-capacity // page)

    # The prompts, one causal call for the batch.
    q = torch.randn(batch, prompt, hq, d, device=dev, dtype=dtype)
    k, v = (torch.randn(batch, prompt, hkv, d, device=dev, dtype=dtype) for _ in range(2))
    out = flash_attn_func(q, k, v, causal=True)
    lengths = torch.full((batch,), prompt, dtype=torch.int32, device=dev)
    err = (out.float() - sdpa(q, k, v, lengths)).abs().max().item()
    print(f"prompts: flash_attn_func {tuple(q.shape)}, causal: max error {err:.2e} against SDPA in float32"
          + (f"; the course's step {last_choice()['forward']}" if last_choice else ""))

    # The cache: a pool of pages, each sequence's pages shuffled through it (a server's pool is never in order).
    pool_k = torch.zeros(batch * pages_a_sequence, page, hkv, d, device=dev, dtype=dtype)
    pool_v = torch.zeros_like(pool_k)
    block_table = torch.randperm(batch * pages_a_sequence, device=dev).to(torch.int32).view(batch, pages_a_sequence)
    whole_k = torch.zeros(batch, pages_a_sequence * page, hkv, d, device=dev, dtype=dtype)  # SDPA's copy
    whole_v = torch.zeros_like(whole_k)
    whole_k[:, :prompt], whole_v[:, :prompt] = k, v
    for b in range(batch):
        pool_k[block_table[b].long()] = whole_k[b].view(pages_a_sequence, page, hkv, d)
        pool_v[block_table[b].long()] = whole_v[b].view(pages_a_sequence, page, hkv, d)
    cache_seqlens = lengths.clone()

    # Decoding: one new token a sequence a step, its key and value appended by the call.
    worst = 0.0
    for step in range(args.steps):
        q1 = torch.randn(batch, 1, hq, d, device=dev, dtype=dtype)
        k1, v1 = (torch.randn(batch, 1, hkv, d, device=dev, dtype=dtype) for _ in range(2))
        out1 = flash_attn_with_kvcache(q1, pool_k, pool_v, k=k1, v=v1, cache_seqlens=cache_seqlens,
                                       block_table=block_table, causal=True)
        at = prompt + step
        whole_k[:, at], whole_v[:, at] = k1[:, 0], v1[:, 0]
        cache_seqlens += 1
        worst = max(worst, (out1.float() - sdpa(q1, whole_k, whole_v, cache_seqlens)).abs().max().item())
    print(f"decoding: {args.steps} steps of flash_attn_with_kvcache over pages of {page}, the new keys appended in "
          f"place: max error {worst:.2e} against SDPA in float32"
          + (f"; the course's step {last_choice()['forward']}" if last_choice else ""))
    # FlashAttention's rule would compare with PyTorch's own error in the same dtype; an example only shows the size.
    return 0 if max(err, worst) < 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
