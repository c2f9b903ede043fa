"""FlashAttention's Python API over the course's steps: code written for `flash_attn` runs on the course with its
import changed (`from fa_course.flash_attn import flash_attn_func, ...`).

Each call describes its problem (choose.Problem), takes the highest-numbered step that takes it on q's GPU
(choose.choose; the backward's step too when an input requires a gradient), and runs it through fa_course.torch.
What the course does not compute is refused before any GPU work, by name: dropout, ALiBi, a deterministic backward,
a KV cache's batch index or left padding, and any problem no step takes (choose.Refusal, a NotImplementedError).
Malformed arguments raise RuntimeError, as FlashAttention's own checks do, or the kit's ValueError.

FlashAttention's conventions, kept: tensors [batch, seqlen, heads, head_dim] (a pack: [total, heads, head_dim] with
cu_seqlens int32 [batch + 1]); the causal mask and the window aligned at the bottom right (query i of seqlen_q sees
keys up to i + seqlen_k - seqlen_q); window_size=(-1, -1) for none; softmax_lse float32 [batch, heads, seqlen_q]
(a pack: [heads, total_q]), natural log. return_attn_probs=True returns (out, softmax_lse, None): the steps never
form P in memory, and FlashAttention's third output encodes dropout, which the course refuses.

Set FA_COURSE_DEBUG=1 (or fa_course.flash_attn.set_debug(True)) to print each call's chosen steps to stderr;
`last_choice()` returns the last one.
"""
from __future__ import annotations

import math
import os
import sys

import torch

from .. import _ext
from .. import torch as _course
from .choose import (Problem, Refusal, choose, one_new_token, padded_head_dim, refuse_unimplemented, window_of,
                     windowed)

_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16"}
USE_TRITON_ROCM = False  # FlashAttention's flag for its ROCm backend, which its tests read; the course is CUDA's
_debug = os.environ.get("FA_COURSE_DEBUG", "") not in ("", "0")
_last: dict = {}
_steps_cache: list = []


def set_debug(on: bool = True) -> None:
    """Print each call's chosen steps to stderr (FA_COURSE_DEBUG=1 does the same from the environment)."""
    global _debug
    _debug = bool(on)


def last_choice() -> dict:
    """The last call's choice: {"call", "forward", "backward" (or None), "problem"}, and "padded_from" (the call's
    own head_dim) when the problem's head_dim is the wider one its q, k and v were padded to."""
    return dict(_last)


def _steps() -> list:
    if not _steps_cache:
        _steps_cache.extend(_ext.steps())
    return _steps_cache


def _check_tensors(call: str, q, k, v):
    """FlashAttention's own checks, in its words: dtypes, devices, matching head_dim."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _DTYPES:
            raise RuntimeError(f"{call}: FlashAttention only support fp16 and bf16 data type ({name} is {t.dtype})")
        if not t.is_cuda:
            raise RuntimeError(f"{call}: {name} must be on CUDA (it is on {t.device})")
    if not (q.dtype == k.dtype == v.dtype):
        raise RuntimeError(f"{call}: query and key must have the same dtype (q {q.dtype}, k {k.dtype}, v {v.dtype})")
    if q.shape[-1] != k.shape[-1] or v.shape[-1] != q.shape[-1]:
        raise RuntimeError(f"{call}: q, k and v must share head_dim (q {q.shape[-1]}, k {k.shape[-1]}, v "
                           f"{v.shape[-1]}); the course's steps take v's head_dim equal to q's")
    if q.shape[-1] < 1:  # no width to pad from, and a softmax scale of 1/sqrt(0)
        raise RuntimeError(f"{call}: head_dim must be positive (q's last dimension is {q.shape[-1]})")
    if q.shape[-2] < 1 or k.shape[-2] < 1:
        raise RuntimeError(f"{call}: q and k need at least one head ({q.shape[-2]} and {k.shape[-2]})")
    if q.shape[-2] % k.shape[-2]:
        raise RuntimeError(f"{call}: Number of heads in key/value must divide number of heads in query "
                           f"({k.shape[-2]} and {q.shape[-2]})")


def _choose(call: str, problem: Problem, device, needs_grad: bool) -> tuple[str, str | None]:
    capability = torch.cuda.get_device_capability(device)
    forward = choose(_steps(), problem, capability, call)
    backward = None
    if needs_grad:
        backward_problem = Problem(**{**problem.__dict__, "pass_": "backward"})
        backward = choose(_steps(), backward_problem, capability, call + "'s gradient")
    _last.clear()
    _last.update(call=call, forward=forward, backward=backward, problem=problem)
    if _debug:
        print(f"fa_course.flash_attn: {call} -> forward step {forward}"
              + (f", backward step {backward}" if backward else "") + f" ({', '.join(problem.needs())})",
              file=sys.stderr)
    return forward, backward


def _attention(call, q, k, v, *, softmax_scale, causal, window_size, softcap, cu_seqlens_q=None, cu_seqlens_k=None,
               dropout_p=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None,
               sinks=None):
    """The one path of every call but the KV cache's: refusals, the problem, the steps, autograd. sinks (a logit a
    query head, FlashAttention-3's and gpt-oss's attention sinks; fa_course.transformers passes them) are taken
    as float32 [Hq] and differentiated."""
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks))
    refuse_unimplemented(dropout_p, alibi_slopes, deterministic, needs_grad, block_table=block_table)
    _check_tensors(call, q, k, v)
    left, right = window_of(window_size, causal)
    varlen = cu_seqlens_q is not None
    if varlen:
        lens_q = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist()  # the module reads the offsets on the host too
        lens_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).tolist()
        q_len, kv_len = max(lens_q, default=0), max(lens_k, default=0)
        unequal = lens_q != lens_k
    else:
        q_len, kv_len = q.shape[1], k.shape[1]
        unequal = q_len != kv_len
    # One new token a sequence (a decoding step's query over the whole cache): no mask, on the window's keys alone.
    first, causal, left, right = one_new_token(q_len, kv_len, left, right, bool(causal), varlen)
    if first:  # a slice: autograd carries dK and dV back to the whole k and v
        k, v, kv_len = k[:, first:], v[:, first:], kv_len - first
    window = windowed(left, right, causal)
    head_dim = q.shape[-1]
    problem = Problem("forward", _DTYPES[q.dtype], head_dim, q_len, kv_len, causal=bool(causal),
                      bottom_right=unequal, window=window, softcap=bool(softcap), sinks=sinks is not None,
                      varlen=varlen)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    # A head_dim no step takes (80, 96, ...): zero columns up to the next one a step takes, as FlashAttention pads
    # its own; autograd slices the gradients back (choose.padded_head_dim says why the answer is unchanged).
    wider = padded_head_dim(_steps(), problem, torch.cuda.get_device_capability(q.device),
                            ("forward", "backward") if needs_grad else ("forward",))
    if wider is not None:
        problem = Problem(**{**problem.__dict__, "head_dim": wider})
        q, k, v = (torch.nn.functional.pad(t, (0, wider - head_dim)) for t in (q, k, v))
    forward_step, backward_step = _choose(call, problem, q.device, needs_grad)
    if wider is not None:
        _last.update(padded_from=head_dim)
        if _debug:
            print(f"fa_course.flash_attn: {call}: head_dim {head_dim} padded with zeros to {wider}", file=sys.stderr)
    # FlashAttention's alignment: with seqlen_q != seqlen_k the mask's (and window's) diagonal at the last key. The
    # chooser took a step that declares it (step 60 forward, or a decode step); the step must be told, or it would
    # compute the top-left mask.
    aligned = "bottom-right" if unequal and (causal or window) else "top-left"
    features = dict(window_size=(left, right), softcap=float(softcap or 0.0), cu_seqlens_q=cu_seqlens_q,
                    cu_seqlens_k=cu_seqlens_k, causal_align=aligned)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    sinks = None if sinks is None else sinks.float().contiguous()
    if backward_step is None:
        with torch.no_grad():
            out, lse = _course.forward(forward_step, q, k, v, causal=bool(causal), scale=scale, sinks=sinks,
                                       **features)
    else:  # the LSE from the same forward the gradient goes through
        out, lse = _WithLse.apply(q, k, v, sinks, forward_step, backward_step, bool(causal), scale, features)
    if wider is not None:  # O's own columns (contiguous, as FlashAttention returns O)
        out = out[..., :head_dim].contiguous()
    return (out, lse, None) if return_attn_probs else out


class _WithLse(torch.autograd.Function):
    """O and its LSE through a forward step, the gradients of q, k, v (and of the sinks, with sinks) through a
    backward step (the LSE is not differentiated, as FlashAttention's is not)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, forward_step, backward_step, causal, scale, features):
        out, lse = _course.forward(forward_step, q, k, v, causal=causal, scale=scale, sinks=sinks, **features)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.args = (backward_step, causal, scale, features)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        backward_step, causal, scale, features = ctx.args
        grads = _course.backward(backward_step, q, k, v, out, lse, d_out, causal=causal, scale=scale, sinks=sinks,
                                 **features)
        dsinks = grads[3] if sinks is not None else None
        return grads[0], grads[1], grads[2], dsinks, None, None, None, None, None


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q [B, Nq, Hq, d], k and v [B, Nkv, Hkv, d] -> out [B, Nq, Hq, d] (with return_attn_probs: out, softmax_lse
    [B, Hq, Nq], None)."""
    return _attention("flash_attn_func", q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                      softcap=softcap, dropout_p=dropout_p, alibi_slopes=alibi_slopes, deterministic=deterministic,
                      return_attn_probs=return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """kv [B, Nkv, 2, Hkv, d]: flash_attn_func on kv[:, :, 0], kv[:, :, 1]."""
    return _attention("flash_attn_kvpacked_func", q, kv[:, :, 0], kv[:, :, 1], softmax_scale=softmax_scale,
                      causal=causal, window_size=window_size, softcap=softcap, dropout_p=dropout_p,
                      alibi_slopes=alibi_slopes, deterministic=deterministic, return_attn_probs=return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv [B, N, 3, H, d]: flash_attn_func on its three parts."""
    return _attention("flash_attn_qkvpacked_func", qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2],
                      softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                      dropout_p=dropout_p, alibi_slopes=alibi_slopes, deterministic=deterministic,
                      return_attn_probs=return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """A pack: q [total_q, Hq, d], k and v [total_k, Hkv, d], cu_seqlens_q and cu_seqlens_k int32 [B + 1] -> out
    [total_q, Hq, d] (with return_attn_probs: out, softmax_lse [Hq, total_q], None). max_seqlen_q and max_seqlen_k
    are FlashAttention's hints; the course reads the lengths from the offsets."""
    return _attention("flash_attn_varlen_func", q, k, v, softmax_scale=softmax_scale, causal=causal,
                      window_size=window_size, softcap=softcap, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      dropout_p=dropout_p, alibi_slopes=alibi_slopes, deterministic=deterministic,
                      return_attn_probs=return_attn_probs, block_table=block_table)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """kv [total_k, 2, Hkv, d]: flash_attn_varlen_func on its two parts."""
    return _attention("flash_attn_varlen_kvpacked_func", q, kv[:, 0], kv[:, 1], softmax_scale=softmax_scale,
                      causal=causal, window_size=window_size, softcap=softcap, cu_seqlens_q=cu_seqlens_q,
                      cu_seqlens_k=cu_seqlens_k, dropout_p=dropout_p, alibi_slopes=alibi_slopes,
                      deterministic=deterministic, return_attn_probs=return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv [total, 3, H, d]: flash_attn_varlen_func on its three parts, one set of offsets."""
    return _attention("flash_attn_varlen_qkvpacked_func", qkv[:, 0], qkv[:, 1], qkv[:, 2],
                      softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                      cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, dropout_p=dropout_p,
                      alibi_slopes=alibi_slopes, deterministic=deterministic, return_attn_probs=return_attn_probs)


def _append(cache, new, cache_seqlens, block_table):
    """Writes new [B, Nnew, Hkv, d] into the cache at each sequence's positions cache_seqlens[b] + t, in place, on
    the GPU (no host sync): through the block table for a paged cache [pages, page_size, Hkv, d]. A position past
    the capacity, or a page entry outside the pool, is not written (its slot keeps its value): the decode step then
    reads that length or entry, refuses it, and the next call or fa_course.check() raises it, as for any length."""
    b, n_new = new.shape[0], new.shape[1]
    capacity = cache.shape[1] if block_table is None else block_table.shape[1] * cache.shape[1]
    positions = cache_seqlens.view(b, 1).long() + torch.arange(n_new, device=new.device).view(1, n_new)
    valid = (positions >= 0) & (positions < capacity)
    positions = positions.clamp(0, capacity - 1)
    if block_table is None:
        index = (torch.arange(b, device=new.device).view(b, 1).expand(b, n_new), positions)
    else:
        page_size = cache.shape[1]
        pages = torch.gather(block_table.long(), 1, positions // page_size)
        valid &= (pages >= 0) & (pages < cache.shape[0])
        index = (pages.clamp(0, cache.shape[0] - 1), positions % page_size)
    keep = valid.view(b, n_new, 1, 1)
    cache[index] = torch.where(keep, new, cache[index])


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Decode over a KV cache: q [B, Nq, Hq, d]; k_cache, v_cache [B, capacity, Hkv, d], or pools [pages,
    page_size, Hkv, d] with block_table int32 [B, pages a sequence]; cache_seqlens (int or int32 [B]) the keys
    already in it. k and v [B, Nnew, Hkv, d], when given, are written into the cache in place at cache_seqlens
    onward (rotated first, with rotary_cos and rotary_sin, as FlashAttention rotates them), and the attention sees
    cache_seqlens + Nnew keys. Captured in a CUDA graph the call makes no host sync: the decode step checks each
    length on the GPU, reads no page past the table, and a refused length is raised by the next call or
    fa_course.check(). Outside a capture, a paged cache's longest length is read back first, and one past what
    block_table addresses raises here (FlashAttention's own guard, with its sync). num_splits is FlashAttention's
    tuning hint; the decode steps choose their own splits."""
    refuse_unimplemented(alibi_slopes=alibi_slopes, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad)
    if (k is None) != (v is None):
        raise RuntimeError("flash_attn_with_kvcache: k and v come together (both or neither)")
    if (rotary_cos is None) != (rotary_sin is None):
        raise RuntimeError("flash_attn_with_kvcache: rotary_cos and rotary_sin come together")
    _check_tensors("flash_attn_with_kvcache", q, k_cache, v_cache)
    b = q.shape[0]
    if cache_seqlens is None:  # FlashAttention's default: every sequence fills the cache
        if block_table is not None or k is not None:
            raise RuntimeError("flash_attn_with_kvcache: a paged cache (block_table) and new keys (k, v) need "
                               "cache_seqlens, each sequence's keys already in the cache")
        cache_seqlens = torch.full((b,), k_cache.shape[1], dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((b,), cache_seqlens, dtype=torch.int32, device=q.device)
    n_new = 0 if k is None else k.shape[1]
    if block_table is not None and cache_seqlens.numel() and not torch.cuda.is_current_stream_capturing():
        addressed = block_table.shape[1] * k_cache.shape[1]
        longest = int(cache_seqlens.max()) + n_new
        if longest > addressed:
            raise RuntimeError(f"flash_attn_with_kvcache: cache_seqlens + the {n_new} new keys reach {longest} keys, "
                               f"past the {addressed} that block_table addresses ({block_table.shape[1]} pages a "
                               f"sequence of page_size {k_cache.shape[1]}); give block_table more pages a sequence")
    if rotary_cos is not None:
        from .layers.rotary import apply_rotary_emb
        if k is None:
            raise RuntimeError("flash_attn_with_kvcache: rotary_cos and rotary_sin rotate the new k; pass k and v")
        # FlashAttention's rule: k at its own positions; q at its positions if causal or local, else all at
        # cache_seqlens.
        local = causal or window_size[0] >= 0 or window_size[1] >= 0
        if local:
            q = apply_rotary_emb(q, rotary_cos, rotary_sin, interleaved=rotary_interleaved, seqlen_offsets=cache_seqlens)
        else:  # every new token at position cache_seqlens: the tokens as heads of one position
            s_q, h = q.shape[1], q.shape[2]
            q = apply_rotary_emb(q.reshape(b, 1, s_q * h, q.shape[3]), rotary_cos, rotary_sin,
                                 interleaved=rotary_interleaved, seqlen_offsets=cache_seqlens).reshape(q.shape)
        k = apply_rotary_emb(k, rotary_cos, rotary_sin, interleaved=rotary_interleaved, seqlen_offsets=cache_seqlens)
    if k is not None:
        _append(k_cache, k, cache_seqlens, block_table)
        _append(v_cache, v, cache_seqlens, block_table)
    kv_lens = (cache_seqlens + n_new).to(torch.int32)
    left, right = window_of(window_size, causal)
    problem = Problem("forward", _DTYPES[q.dtype], q.shape[-1], q.shape[1],
                      k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1],
                      causal=bool(causal), bottom_right=True, window=windowed(left, right, causal), softcap=bool(softcap),
                      cache=True, paged=block_table is not None)
    step, _ = _choose("flash_attn_with_kvcache", problem, q.device, needs_grad=False)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    # The new tokens' diagonal at each sequence's last key; without a mask or a window there is none to place (the
    # kit refuses an alignment with nothing to align).
    aligned = "bottom-right" if causal or problem.window else "top-left"
    with torch.no_grad():
        out, lse = _course.forward(step, q.contiguous(), k_cache, v_cache, causal=bool(causal), scale=scale,
                                   causal_align=aligned, kv_lens=kv_lens,
                                   page_table=None if block_table is None else block_table.to(torch.int32),
                                   window_size=(left, right), softcap=float(softcap or 0.0))
    return (out, lse) if return_softmax_lse else out


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """FlashAttention's test helper for its dropout mask's layout; the course implements no dropout."""
    raise Refusal("fa_course.flash_attn: _get_block_size_n describes FlashAttention's dropout mask; the course's "
                  "steps implement no dropout")
