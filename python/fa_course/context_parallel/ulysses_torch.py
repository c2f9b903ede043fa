"""The all-to-all form (DeepSpeed-Ulysses) over torch.distributed: ulysses.py's layout and one rank's steps on the
course's kernels and NCCL's all_to_all_single.

One process per GPU (torchrun). Each rank passes its share of the sequence, q [B, n, Hq, d], k and v [B, n, Hkv, d],
split as ring_attention takes it (plan.split_indices: zigzag when causal, contiguous when not, unless `layout` says
otherwise), so a model can swap one form for the other. ulysses_attention returns this rank's rows of O,
differentiable in q, k and v. Forward: all-to-all of Q, K, V to head shards [B, N, Hq/world, d] in sequence order, the
course's forward step on the whole sequence of those heads (fa_course.torch.forward), all-to-all of O back to the
rank's tokens. Backward: all-to-all of dO to head shards, the course's backward step with the head shard's own O and
LSE (fa_course.torch.backward), all-to-all of dQ, dK, dV back; where a KV head is replicated on several ranks (Hkv <
world) its dK and dV are summed in float32 and cast once.

Each all-to-all runs on PyTorch's current stream (NCCL orders it after the kernel that wrote its input); nothing here
overlaps the exchange with computation: the kernel needs every token of its heads before it starts. Packing Q, K, V
into one all-to-all (and dQ, dK, dV into one) would save launches; three calls keep the lesson's shape.

The CPU test (tests/python/test_context_parallel_ulysses.py) runs the same steps (ulysses.ulysses_forward,
ulysses_backward) with numpy; python/tests/ring_attention.py is this file's GPU test (passed on two H200s in session
19, docs/results/runs/h200-2026-11-29-session-19.txt).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from .. import torch as fat
from . import ulysses


def _all_to_all(group):
    """ulysses.py's transport: buffer [world, ...], slot s to rank s of `group`; slot r of the result from rank r."""
    def all_to_all(buffer):
        if dist.get_world_size(group) == 1:
            return buffer
        buffer = buffer.contiguous()
        received = torch.empty_like(buffer)
        dist.all_to_all_single(received, buffer, group=group)  # equal splits along dim 0: one slot a rank
        return received
    return all_to_all


def _shards(q, k, world, layout):
    """ulysses.shards of the whole problem, its token indices as tensors on q's device (one copy, not one a use)."""
    _, n, hq, _ = q.shape
    who = ulysses.shards(n * world, hq, k.shape[2], world, layout)
    on_device = lambda idx: torch.tensor(idx, dtype=torch.long, device=q.device)  # noqa: E731
    return dataclasses.replace(who, tokens=[on_device(t) for t in who.tokens], order=on_device(who.order))


class _UlyssesAttention(torch.autograd.Function):
    """O of this rank's rows over the whole sequence; the gradients through the reverse all-to-alls."""

    @staticmethod
    def forward(ctx, q, k, v, causal, step_fwd, step_bwd, group, layout):
        who = _shards(q, k, dist.get_world_size(group), layout)

        def attend(q_, k_, v_, causal_):
            return fat.forward(step_fwd, q_.contiguous(), k_.contiguous(), v_.contiguous(), causal=causal_)

        out, saved = ulysses.ulysses_forward(who, q, k, v, torch.zeros_like(q), causal, attend, _all_to_all(group),
                                             torch)
        # The head shard's Q, K, V, O and LSE: the backward step reads them as the single-GPU backward would.
        ctx.save_for_backward(*saved)
        ctx.who, ctx.causal, ctx.step_bwd, ctx.group = who, causal, step_bwd, group
        ctx.dtypes, ctx.kv_shape = (q.dtype, k.dtype, v.dtype), k.shape
        return out

    @staticmethod
    def backward(ctx, d_out):
        saved = ctx.saved_tensors

        def attend_backward(q_, k_, v_, out_, lse_, d_out_, causal_):
            return fat.backward(ctx.step_bwd, q_.contiguous(), k_.contiguous(), v_.contiguous(), out_.contiguous(),
                                lse_.contiguous(), d_out_.contiguous(), causal=causal_)

        # dQ has one writer a head: the input's type. dK and dV sum a replicated KV head's ranks: float32.
        dq = torch.zeros(d_out.shape, dtype=ctx.dtypes[0], device=d_out.device)
        dk, dv = (torch.zeros(ctx.kv_shape, dtype=torch.float32, device=d_out.device) for _ in range(2))
        dq, dk, dv = ulysses.ulysses_backward(ctx.who, saved, d_out.contiguous(), dq, dk, dv, ctx.causal,
                                              attend_backward, _all_to_all(ctx.group), torch)
        return dq, dk.to(ctx.dtypes[1]), dv.to(ctx.dtypes[2]), None, None, None, None, None


def ulysses_attention(q, k, v, causal: bool, step_fwd: str, step_bwd: str, group=None, layout: str | None = None):
    """This rank's rows of attention over the sequence all ranks of `group` hold (the default group: all), with
    forward step `step_fwd` and backward step `step_bwd` of the course on each rank's head shard. Every rank holds n
    tokens, split by `layout` ("zigzag" or "contiguous"; by default zigzag when causal, as ring_attention takes them,
    contiguous when not). Hq must be a multiple of world, and Hkv a multiple or a divisor of it (ulysses.head_split
    refuses others by name)."""
    if layout is None:
        layout = "zigzag" if causal else "contiguous"
    return _UlyssesAttention.apply(q, k, v, causal, step_fwd, step_bwd, group, layout)
