"""PyTorch on top of fa_course._ext: attention() with autograd, and a decode call over a KV cache.

Every call runs on PyTorch's current CUDA stream of q's device, allocates its outputs (and a step's workspace) with
PyTorch on q's device, and raises the kit's ValueError for what a step does not take. A decode call (kv_lens,
page_table) makes no host sync and allocates nothing but its outputs and workspace through PyTorch's caching
allocator, so torch.cuda.graph can capture it (after one call outside the capture, as PyTorch asks of a warm-up);
a length or page entry its kernel refused is raised by the next call on that device or by fa_course.check().
Importing this module needs PyTorch; the rest of the course does not.
"""
from __future__ import annotations

import torch as _torch

from . import _ext


def _stream(q) -> int:
    """PyTorch's current stream on q's device (the current device's may be another device's)."""
    return _torch.cuda.current_stream(q.device).cuda_stream


def _workspace(step: str, q, k, v, **forms):
    """The step's workspace on q's device, of the size q's device asks for, or None. torch.empty, not zeros: the
    module zeroes the bytes the step uses on the call's stream before the launch (a workspace a caller hands in
    cannot be trusted to be zero), so one zeroing is enough."""
    size = _ext.workspace_bytes(step, q, k, v, **forms)
    return _torch.empty(size, dtype=_torch.uint8, device=q.device) if size else None


def _features(window_size=(-1, -1), softcap=0.0, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """The models' features as the module takes them: window_size (FlashAttention's (left, right), -1 or None an
    open side) as window_left and window_right."""
    left, right = (-1 if side is None else int(side) for side in window_size)
    return dict(window_left=left, window_right=right, softcap=float(softcap), sinks=sinks, cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_k=cu_seqlens_k)


def forward(step: str, q, k, v, *, causal=False, scale=None, causal_align="top-left", kv_lens=None,
            page_table=None, window_size=(-1, -1), softcap=0.0, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """O and LSE (float32 [B, Hq, Nq]) of forward (or decode) step `step`: new tensors. window_size, softcap and
    sinks (float32 [Hq]) are FlashAttention's models' features, for the steps that take them; so is a pack
    (FlashAttention's varlen): cu_seqlens_q and cu_seqlens_k, int32 [B + 1] on q's device, with q [total_q, Hq, d],
    k and v [total_k, Hkv, d], and then LSE [Hq, total_q]."""
    out = _torch.empty_like(q)
    if cu_seqlens_q is not None:  # a pack: q is [total_q, Hq, d]
        lse = _torch.empty(q.shape[1], q.shape[0], dtype=_torch.float32, device=q.device)
    else:
        lse = _torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=_torch.float32, device=q.device)
    forms = dict(causal=causal, scale=scale, causal_align=causal_align, kv_lens=kv_lens, page_table=page_table,
                 **_features(window_size, softcap, sinks, cu_seqlens_q, cu_seqlens_k))
    _ext.forward(step, q, k, v, out, lse=lse, workspace=_workspace(step, q, k, v, **forms), stream=_stream(q),
                 **forms)
    return out, lse


def backward(step: str, q, k, v, out, lse, d_out, *, causal=False, scale=None, causal_align="top-left",
             window_size=(-1, -1), softcap=0.0, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """dQ, dK, dV of backward step `step`: new tensors; with sinks (float32 [Hq]), also their gradient dsinks
    (float32 [Hq]) as a fourth. The features as forward() takes them, for the backward steps that list them."""
    dq, dk, dv = _torch.empty_like(q), _torch.empty_like(k), _torch.empty_like(v)
    forms = dict(causal=causal, scale=scale, causal_align=causal_align,
                 **_features(window_size, softcap, sinks, cu_seqlens_q, cu_seqlens_k))
    dsinks = None if sinks is None else _torch.empty(sinks.shape, dtype=_torch.float32, device=q.device)
    workspace = _workspace(step, q, k, v, **forms)
    _ext.backward(step, q, k, v, out, lse, d_out.contiguous(), dq, dk, dv, workspace=workspace, dsinks=dsinks,
                  stream=_stream(q), **forms)
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)


class _Attention(_torch.autograd.Function):
    """O = attention(Q, K, V) through a forward step; the gradients (and, with sinks, theirs) through a backward
    step."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, forward_step, backward_step, causal, scale, window_size, softcap, cu_seqlens_q,
                cu_seqlens_k):
        features = dict(window_size=window_size, softcap=softcap, sinks=sinks, cu_seqlens_q=cu_seqlens_q,
                        cu_seqlens_k=cu_seqlens_k)
        out, lse = forward(forward_step, q, k, v, causal=causal, scale=scale, **features)
        ctx.save_for_backward(q, k, v, out, lse, sinks, cu_seqlens_q, cu_seqlens_k)
        ctx.steps, ctx.causal, ctx.scale = (forward_step, backward_step), causal, scale
        ctx.window_size, ctx.softcap = window_size, softcap
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse, sinks, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        grads = backward(ctx.steps[1], q, k, v, out, lse, d_out, causal=ctx.causal, scale=ctx.scale,
                         window_size=ctx.window_size, softcap=ctx.softcap, sinks=sinks, cu_seqlens_q=cu_seqlens_q,
                         cu_seqlens_k=cu_seqlens_k)
        dsinks = grads[3] if sinks is not None else None
        return grads[0], grads[1], grads[2], dsinks, None, None, None, None, None, None, None, None


def attention(q, k, v, *, forward_step: str, backward_step: str | None = None, causal=False, scale=None,
              window_size=(-1, -1), softcap=0.0, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Attention of q [B, Nq, Hq, d], k and v [B, Nkv, Hkv, d] through the named steps, differentiable when a
    backward step is named: in q, k, v and, with sinks (float32 [Hq]), in the sinks. The models' features as
    forward() takes them (a pack: q [total_q, Hq, d], k and v [total_k, Hkv, d] with cu_seqlens_q and cu_seqlens_k)."""
    if backward_step is None:
        return forward(forward_step, q, k, v, causal=causal, scale=scale, window_size=window_size, softcap=softcap,
                       sinks=sinks, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)[0]
    return _Attention.apply(q, k, v, sinks, forward_step, backward_step, causal, scale, window_size, softcap,
                            cu_seqlens_q, cu_seqlens_k)


# The same calls as torch.library custom ops, with fake (meta) implementations that give the outputs' shapes
# without running anything: torch.compile traces through them. The steps' names, the flags and the models' features
# are the ops' arguments; forward_op's gradient goes through backward_step ("" refuses a backward). An op returns
# tensors only: backward_op's dsinks is empty ([0]) without sinks.
@_torch.library.custom_op("fa_course::forward", mutates_args=())
def forward_op(q: _torch.Tensor, k: _torch.Tensor, v: _torch.Tensor, step: str, backward_step: str, causal: bool,
               scale: float | None, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
               sinks: _torch.Tensor | None = None, cu_seqlens_q: _torch.Tensor | None = None,
               cu_seqlens_k: _torch.Tensor | None = None) -> tuple[_torch.Tensor, _torch.Tensor]:
    """forward() as an op: O and LSE."""
    return forward(step, q, k, v, causal=causal, scale=scale, window_size=(window_left, window_right),
                   softcap=softcap, sinks=sinks, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)


@forward_op.register_fake
def _(q, k, v, step, backward_step, causal, scale, window_left=-1, window_right=-1, softcap=0.0, sinks=None,
      cu_seqlens_q=None, cu_seqlens_k=None):
    if cu_seqlens_q is not None:  # a pack: LSE [Hq, total_q]
        return _torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=_torch.float32)
    return _torch.empty_like(q), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=_torch.float32)


@_torch.library.custom_op("fa_course::backward", mutates_args=())
def backward_op(q: _torch.Tensor, k: _torch.Tensor, v: _torch.Tensor, out: _torch.Tensor, lse: _torch.Tensor,
                d_out: _torch.Tensor, step: str, causal: bool, scale: float | None, window_left: int = -1,
                window_right: int = -1, softcap: float = 0.0, sinks: _torch.Tensor | None = None,
                cu_seqlens_q: _torch.Tensor | None = None, cu_seqlens_k: _torch.Tensor | None = None
                ) -> tuple[_torch.Tensor, _torch.Tensor, _torch.Tensor, _torch.Tensor]:
    """backward() as an op: dQ, dK, dV, and dsinks (empty without sinks)."""
    grads = backward(step, q, k, v, out, lse, d_out, causal=causal, scale=scale,
                     window_size=(window_left, window_right), softcap=softcap, sinks=sinks,
                     cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    return grads if sinks is not None else (*grads, q.new_empty((0,), dtype=_torch.float32))


@backward_op.register_fake
def _(q, k, v, out, lse, d_out, step, causal, scale, window_left=-1, window_right=-1, softcap=0.0, sinks=None,
      cu_seqlens_q=None, cu_seqlens_k=None):
    dsinks = q.new_empty((0,) if sinks is None else tuple(sinks.shape), dtype=_torch.float32)
    return _torch.empty_like(q), _torch.empty_like(k), _torch.empty_like(v), dsinks


_FEATURE_DEFAULTS = (-1, -1, 0.0, None, None, None)  # forward_op's window_left .. cu_seqlens_k, as declared


def _setup_context(ctx, inputs, output):
    # The inputs as the op was called: its features' defaulted arguments may be left out (opcheck's 7).
    (q, k, v, step, backward_step, causal, scale, window_left, window_right, softcap, sinks, cu_seqlens_q,
     cu_seqlens_k) = tuple(inputs) + _FEATURE_DEFAULTS[len(inputs) - 7:]
    ctx.n_inputs = len(inputs)
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks, cu_seqlens_q, cu_seqlens_k)
    ctx.backward_step, ctx.causal, ctx.scale = backward_step, causal, scale
    ctx.window, ctx.softcap = (window_left, window_right), softcap


def _forward_op_backward(ctx, d_out, d_lse):
    if not ctx.backward_step:
        raise RuntimeError("fa_course::forward was called without a backward step: name one to differentiate")
    q, k, v, out, lse, sinks, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv, dsinks = backward_op(q, k, v, out, lse, d_out.contiguous(), ctx.backward_step, ctx.causal, ctx.scale,
                                     *ctx.window, ctx.softcap, sinks, cu_seqlens_q, cu_seqlens_k)
    return (dq, dk, dv, None, None, None, None, None, None, None, dsinks if sinks is not None else None, None,
            None)[:ctx.n_inputs]


forward_op.register_autograd(_forward_op_backward, setup_context=_setup_context)


def attention_op(q, k, v, *, forward_step: str, backward_step: str = "", causal=False, scale=None,
                 window_size=(-1, -1), softcap=0.0, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """attention() through the custom ops (for torch.compile): differentiable when a backward step is named (in the
    sinks too, with sinks)."""
    features = _features(window_size, softcap, sinks, cu_seqlens_q, cu_seqlens_k)
    return forward_op(q, k, v, forward_step, backward_step, causal, scale, features["window_left"],
                      features["window_right"], features["softcap"], sinks, cu_seqlens_q, cu_seqlens_k)[0]
