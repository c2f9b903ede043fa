#!/usr/bin/env python3
"""FlashAttention's API through fa_course.flash_attn (issue 59), on the GPU: every entry point against a float32
reference by FlashAttention's rule (the error at most twice PyTorch's own in the dtype, plus 1e-5 of the
reference's size), gradients through autograd, a KV cache written in place (contiguous and paged, with rotary
embeddings), the padding helpers, the refusals by name, and the chosen steps. Needs a CUDA GPU and PyTorch.

    PYTHONPATH=build/python python3 python/tests/flash_attn_api.py
"""
import sys

import torch

if __name__ == "__main__" and not torch.cuda.is_available():
    print("skipped: no CUDA device")  # ctest: exit 77 reads as skipped
    sys.exit(77)

import fa_course
from fa_course.flash_attn import (Refusal, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                                  flash_attn_varlen_func, flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache,
                                  last_choice)
from fa_course.flash_attn.bert_padding import pad_input, unpad_input
from fa_course.flash_attn.layers.rotary import apply_rotary_emb
from attention_reference import reference as _reference  # beside this script

dev = "cuda"
hopper = torch.cuda.get_device_capability() == (9, 0)
failures = []


def reference(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, upcast=True):
    """O and LSE as FlashAttention defines them: the diagonal at the bottom right (row i's at i + Nkv - Nq)."""
    return _reference(q, k, v, causal=causal, window=window, softcap=softcap, upcast=upcast, bottom_right=True,
                      with_lse=True)


def within_rule(name, got, ref32, ref_dtype):
    """FlashAttention's rule: max |got - ref32| <= 2 max |ref_dtype - ref32| + 1e-5 max |ref32|."""
    err = (got.float() - ref32.float()).abs().max().item()
    own = (ref_dtype.float() - ref32.float()).abs().max().item()
    bound = 2 * own + 1e-5 * ref32.float().abs().max().item()
    ok = err <= bound
    if not ok:
        failures.append(f"{name}: max error {err:.3g} > bound {bound:.3g} (PyTorch's own {own:.3g})")
    return ok


def expect_refusal(name, words, call):
    try:
        call()
    except Refusal as e:
        if not all(w in str(e) for w in words):
            failures.append(f"{name}: refused without naming {words}: {e}")
    except Exception as e:  # noqa: BLE001
        failures.append(f"{name}: {type(e).__name__} instead of a Refusal: {e}")
    else:
        failures.append(f"{name}: computed, expected a refusal naming {words}")


def rand(*shape, dtype, grad=False):
    return torch.randn(*shape, device=dev, dtype=dtype).requires_grad_(grad)


def check_with_grads(name, q, k, v, feat):
    """flash_attn_func(q, k, v, **feat): O and the gradients of q, k, v (through a random dO) by the rule against the
    bottom-right reference."""
    out = flash_attn_func(q, k, v, **feat)
    kw = dict(causal=feat.get("causal", False), window=feat.get("window_size", (-1, -1)),
              softcap=feat.get("softcap", 0.0))
    ref32, _ = reference(q, k, v, **kw)
    ref16, _ = reference(q, k, v, upcast=False, **kw)
    within_rule(name + " O", out, ref32, ref16)
    g = torch.randn_like(out)
    for t, a, b32, b16 in zip("qkv", torch.autograd.grad(out, (q, k, v), g),
                              torch.autograd.grad(ref32, (q, k, v), g), torch.autograd.grad(ref16, (q, k, v), g)):
        within_rule(f"{name} d{t}", a, b32, b16)


torch.manual_seed(0)
dtypes = (torch.float16, torch.bfloat16)
features = [dict(), dict(causal=True)]
if hopper:
    features += [dict(window_size=(32, 0), causal=True), dict(window_size=(40, 17)), dict(softcap=30.0),
                 dict(causal=True, softcap=5.0, window_size=(64, -1))]
cases = 0
for dtype in dtypes:
    for d in (64, 128):
        for feat in features:
            q = rand(2, 257, 8, d, dtype=dtype, grad=True)
            k, v = rand(2, 257, 2, d, dtype=dtype, grad=True), rand(2, 257, 2, d, dtype=dtype, grad=True)
            name = f"flash_attn_func {dtype} d={d} {feat}"
            out, lse, probs = flash_attn_func(q, k, v, return_attn_probs=True, **feat)
            window = feat.get("window_size", (-1, -1))
            kw = dict(causal=feat.get("causal", False), window=window, softcap=feat.get("softcap", 0.0))
            ref32, lse32 = reference(q, k, v, **kw)
            ref16, _ = reference(q, k, v, upcast=False, **kw)
            within_rule(name + " O", out, ref32, ref16)
            if probs is not None or lse.shape != (2, 8, 257):
                failures.append(f"{name}: return_attn_probs gave {lse.shape}, {probs}")
            elif (lse - lse32).abs().max().item() > 1e-3:
                failures.append(f"{name}: LSE off by {(lse - lse32).abs().max().item():.3g}")
            g = torch.randn_like(out)
            grads = torch.autograd.grad(out, (q, k, v), g)
            grads32 = torch.autograd.grad(ref32, (q, k, v), g)
            grads16 = torch.autograd.grad(ref16, (q, k, v), g)
            for t, a, b32, b16 in zip("qkv", grads, grads32, grads16):
                within_rule(f"{name} d{t}", a, b32, b16)
            # The packed forms give the same output.
            qkv = torch.stack([q.detach(), q.detach(), q.detach()], dim=2)
            same = flash_attn_qkvpacked_func(qkv, **feat)
            expect = flash_attn_func(q.detach(), q.detach(), q.detach(), **feat)
            if not torch.equal(same, expect):
                failures.append(f"{name}: qkvpacked differs from the unpacked call")
            kv = torch.stack([k.detach(), v.detach()], dim=2)
            if not torch.equal(flash_attn_kvpacked_func(q.detach(), kv, **feat), out.detach()):
                failures.append(f"{name}: kvpacked differs from the unpacked call")
            cases += 1
print(f"flash_attn_func, packed forms, gradients: {cases} cases; chose {last_choice()['forward']} / "
      f"{last_choice()['backward']}")

# One new token under a window (a Gemma 2 or gpt-oss decoding step without a cache object): the call passes the
# window's last keys alone, so a step without the bottom-right diagonal takes it; O and the gradients of the whole
# q, k, v (zero outside the window) as the bottom-right reference's.
if hopper:
    for d, feat in ((256, dict(causal=True, window_size=(63, -1), softcap=50.0)), (128, dict(window_size=(40, 17))),
                    (128, dict(causal=True, window_size=(500, 0)))):
        q = rand(2, 1, 4, d, dtype=torch.bfloat16, grad=True)
        k, v = rand(2, 300, 2, d, dtype=torch.bfloat16, grad=True), rand(2, 300, 2, d, dtype=torch.bfloat16, grad=True)
        check_with_grads(f"one new token, d={d} {feat}", q, k, v, feat)
    print(f"one new token under a window: 3 cases, the last through {last_choice()['forward']} / "
          f"{last_choice()['backward']}")

# A few new tokens over more keys without a cache object (speculative decoding's verification): the diagonal, and a
# window, at the last key (FlashAttention's alignment), which the decode steps take; inference, so no gradient (the
# chunks below check the backward's alignment).
for n_new, feat in ((4, dict(causal=True)), (3, dict(window_size=(50, 10))), (8, dict(causal=True, window_size=(64, -1)))):
    q = rand(2, n_new, 8, 128, dtype=torch.bfloat16)
    k, v = rand(2, 300, 2, 128, dtype=torch.bfloat16), rand(2, 300, 2, 128, dtype=torch.bfloat16)
    out = flash_attn_func(q, k, v, **feat)
    kw = dict(causal=feat.get("causal", False), window=feat.get("window_size", (-1, -1)))
    within_rule(f"{n_new} new tokens over 300 keys {feat} O", out, reference(q, k, v, **kw)[0],
                reference(q, k, v, upcast=False, **kw)[0])
print(f"a few new tokens over more keys, bottom-right: 3 cases, the last through {last_choice()['forward']}")

# More rows than a decode step takes over more keys (a prompt's chunk over its cached prefix), causal and with a
# window without the mask, their diagonal at the last key, with gradients: on Hopper steps 60 and 61 take it.
if hopper:
    for n_q, n_k, feat in ((100, 300, dict(causal=True)), (200, 700, dict(window_size=(40, 17))),
                           (300, 100, dict(causal=True))):
        q = rand(2, n_q, 8, 64, dtype=torch.float16, grad=True)
        k, v = rand(2, n_k, 2, 64, dtype=torch.float16, grad=True), rand(2, n_k, 2, 64, dtype=torch.float16, grad=True)
        check_with_grads(f"{n_q} rows over {n_k} keys {feat}", q, k, v, feat)
    print(f"a chunk over more keys, bottom-right: 3 cases, through {last_choice()['forward']} / "
          f"{last_choice()['backward']}")

# A pack (varlen) against each sequence alone, causal, with its gradients; the padding helpers round trip.
if hopper:
    for dtype in dtypes:
        lens = [1, 127, 300, 64]
        mask = torch.zeros(len(lens), max(lens), dtype=torch.bool, device=dev)
        for b, n in enumerate(lens):
            mask[b, :n] = True
        x = rand(len(lens), max(lens), 3, 8, 128, dtype=dtype)
        packed, indices, cu, max_len, used = unpad_input(x, mask)
        if not torch.equal(pad_input(packed, indices, len(lens), max(lens)), x * mask[:, :, None, None, None]):
            failures.append("unpad_input / pad_input: no round trip")
        packed.requires_grad_(True)
        out = flash_attn_varlen_qkvpacked_func(packed, cu, max_len, causal=True)
        apart = flash_attn_varlen_func(packed[:, 0].detach(), packed[:, 1].detach(), packed[:, 2].detach(), cu, cu,
                                       max_len, max_len, causal=True)
        if not torch.equal(apart, out.detach()):
            failures.append(f"varlen {dtype}: flash_attn_varlen_func differs from its qkvpacked form")
        g = torch.randn_like(out)
        (grad,) = torch.autograd.grad(out, packed, g)
        for b, n in enumerate(lens):
            rows = slice(int(cu[b]), int(cu[b + 1]))
            one = packed.detach()[rows].unsqueeze(0).requires_grad_(True)
            r32, _ = reference(one[:, :, 0], one[:, :, 1], one[:, :, 2], causal=True)
            r16, _ = reference(one[:, :, 0], one[:, :, 1], one[:, :, 2], causal=True, upcast=False)
            within_rule(f"varlen {dtype} sequence {b} O", out[rows], r32[0], r16[0])
            (g32,) = torch.autograd.grad(r32[0], one, g[rows])
            (g16,) = torch.autograd.grad(r16[0], one, g[rows])
            within_rule(f"varlen {dtype} sequence {b} dqkv", grad[rows], g32[0], g16[0])
    print(f"varlen: a pack of {lens} against each sequence alone; chose {last_choice()['forward']}")

# A KV cache: new keys appended in place (contiguous and paged), rotary on the new q and k, 1 and 4 new tokens.
for dtype in dtypes:
    for paged in (False, True):
        for n_new, causal in ((1, True), (4, True), (4, False)):
            b, cap, hq, hkv, d = 3, 256, 8, 2, 128
            seqlens = torch.tensor([0, 17, 200], dtype=torch.int32, device=dev)
            k_all, v_all = rand(b, cap, hkv, d, dtype=dtype), rand(b, cap, hkv, d, dtype=dtype)
            k_new, v_new = rand(b, n_new, hkv, d, dtype=dtype), rand(b, n_new, hkv, d, dtype=dtype)
            q = rand(b, n_new, hq, d, dtype=dtype)
            cos = torch.cos(torch.arange(cap, device=dev)[:, None] / 10000 ** (torch.arange(32, device=dev) / 32))
            sin = torch.sin(torch.arange(cap, device=dev)[:, None] / 10000 ** (torch.arange(32, device=dev) / 32))
            cos, sin = cos.to(dtype), sin.to(dtype)
            if paged:  # pages of 16, shuffled over a pool
                page = 16
                perm = torch.randperm(b * cap // page, device=dev).to(torch.int32)
                table = perm.view(b, cap // page)
                k_cache = torch.empty(b * cap // page, page, hkv, d, device=dev, dtype=dtype)
                v_cache = torch.empty_like(k_cache)
                k_cache[table.long()] = k_all.view(b, cap // page, page, hkv, d)
                v_cache[table.long()] = v_all.view(b, cap // page, page, hkv, d)
            else:
                table, k_cache, v_cache = None, k_all.clone(), v_all.clone()
            out = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                          cache_seqlens=seqlens, block_table=table, causal=causal,
                                          rotary_interleaved=False)
            # FlashAttention's rule: q rotated at its own positions if causal (or local), else every new token at the
            # cache's length (the tokens as heads of one position).
            if causal:
                q_ro = apply_rotary_emb(q, cos, sin, seqlen_offsets=seqlens)
            else:
                q_one = q.reshape(b, 1, n_new * hq, d)
                q_ro = apply_rotary_emb(q_one, cos, sin, seqlen_offsets=seqlens).reshape(q.shape)
            k_ro = apply_rotary_emb(k_new, cos, sin, seqlen_offsets=seqlens)
            name = f"kvcache {dtype} {'paged' if paged else 'contiguous'} {n_new} new{'' if causal else ', no mask'}"
            for i in range(b):
                n = int(seqlens[i]) + n_new
                keys = torch.cat([k_all[i, :int(seqlens[i])], k_ro[i]]).unsqueeze(0)
                vals = torch.cat([v_all[i, :int(seqlens[i])], v_new[i]]).unsqueeze(0)
                r32, _ = reference(q_ro[i:i + 1], keys, vals, causal=causal)
                r16, _ = reference(q_ro[i:i + 1], keys, vals, causal=causal, upcast=False)
                within_rule(f"{name} sequence {i}", out[i:i + 1], r32, r16)
                stored = (k_cache[table[i].long()].reshape(cap, hkv, d) if paged else k_cache[i])[:n]
                if not torch.equal(stored[int(seqlens[i]):], k_ro[i]):
                    failures.append(f"{name}: the cache does not hold sequence {i}'s new (rotated) keys")
print(f"flash_attn_with_kvcache: contiguous and paged, 1 and 4 new tokens, causal and not, rotary; chose {last_choice()['forward']}")

# A head_dim no step takes, padded with zeros to the next one a step takes (FlashAttention's own move): O, the LSE
# and the gradients as the reference's at the true head_dim; O that head_dim wide and contiguous.
for d, feat in ((96, dict(causal=True)), (80, dict()), (40, dict(softcap=30.0, window_size=(50, 0)) if hopper else dict())):
    q = rand(2, 130, 8, d, dtype=torch.bfloat16, grad=True)
    k, v = rand(2, 130, 2, d, dtype=torch.bfloat16, grad=True), rand(2, 130, 2, d, dtype=torch.bfloat16, grad=True)
    check_with_grads(f"head_dim {d} padded {feat}", q, k, v, feat)
    choice = last_choice()
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **feat)
    _, lse32 = reference(q, k, v, causal=feat.get("causal", False), window=feat.get("window_size", (-1, -1)),
                         softcap=feat.get("softcap", 0.0))
    if choice.get("padded_from") != d or out.shape != q.shape or not out.is_contiguous():
        failures.append(f"head_dim {d}: padded_from {choice.get('padded_from')}, O {tuple(out.shape)}, "
                        f"contiguous {out.is_contiguous()}")
    elif (lse - lse32).abs().max().item() > 1e-3:
        failures.append(f"head_dim {d}: LSE off by {(lse - lse32).abs().max().item():.3g}")
print(f"head dims 96, 80, 40 padded with zeros (40 to {choice['problem'].head_dim}): forward {choice['forward']}, "
      f"backward {choice['backward']}")

# Refusals by name, before any GPU work.
q = rand(1, 100, 4, 64, dtype=torch.float16, grad=True)
kv = rand(1, 300, 4, 64, dtype=torch.float16)
expect_refusal("dropout", ["dropout_p"], lambda: flash_attn_func(q, q, q, dropout_p=0.1))
expect_refusal("ALiBi", ["alibi_slopes"], lambda: flash_attn_func(q, q, q, alibi_slopes=torch.ones(4, device=dev)))
expect_refusal("deterministic", ["deterministic"], lambda: flash_attn_func(q, q, q, deterministic=True))
if not hopper:  # no Ampere step takes the diagonal at the last key
    expect_refusal("bottom-right causal", ["bottom-right"], lambda: flash_attn_func(q, kv, kv, causal=True))
expect_refusal("head_dim 288", ["head_dim 288"], lambda: flash_attn_func(*(rand(1, 8, 2, 288, dtype=torch.float16),) * 3))
expect_refusal("cache_batch_idx", ["cache_batch_idx"],
               lambda: flash_attn_with_kvcache(q[:, :1], kv, kv, cache_batch_idx=torch.zeros(1, device=dev)))
for name, shapes in (("head_dim 0", ((1, 8, 2, 0),) * 3), ("no KV heads", ((1, 8, 2, 64), (1, 8, 0, 64), (1, 8, 0, 64)))):
    try:
        flash_attn_func(*(rand(*shape, dtype=torch.float16) for shape in shapes))
        failures.append(f"{name}: computed, expected a RuntimeError")
    except RuntimeError as e:
        if "head" not in str(e):
            failures.append(f"{name}: {e}")
try:
    flash_attn_func(*(rand(1, 8, 2, 64, dtype=torch.float32),) * 3)
    failures.append("float32: computed, expected FlashAttention's RuntimeError")
except RuntimeError as e:
    if "fp16 and bf16" not in str(e):
        failures.append(f"float32: {e}")
with torch.no_grad():  # no gradient, so deterministic=True has nothing to refuse
    flash_attn_func(q, q, q, deterministic=True)
# A paged cache's lengths past what block_table addresses (one page of 16 a sequence): FlashAttention's RuntimeError
# naming block_table, in the call, with the new keys and without; nothing written into the pool.
pool = rand(4, 16, 4, 64, dtype=torch.float16)
before = pool.clone()
one_page = torch.zeros(1, 1, dtype=torch.int32, device=dev)
for seqlens, new in ((17, None), (16, rand(1, 1, 4, 64, dtype=torch.float16))):
    try:
        flash_attn_with_kvcache(q[:, :1].detach(), pool, pool, k=new, v=new, block_table=one_page,
                                cache_seqlens=torch.full((1,), seqlens, dtype=torch.int32, device=dev))
        failures.append(f"block_table bounds ({seqlens} keys, new {new is not None}): computed, expected a RuntimeError")
    except RuntimeError as e:
        if "block_table" not in str(e) or "17" not in str(e):
            failures.append(f"block_table bounds: {e}")
    if not torch.equal(pool, before):
        failures.append("block_table bounds: the refused call wrote into the pool")
fa_course.check()  # nothing left refused on the GPU: the call raised before any kernel

if failures:
    print(f"{len(failures)} failure(s):\n  " + "\n  ".join(failures))
    sys.exit(1)
print("fa_course.flash_attn: every entry point by FlashAttention's rule, refusals named")
