"""Ring attention over torch.distributed: steps 62 and 63 (loop.py, plan.py) on the course's kernels and NCCL.

One process per GPU (torchrun). Each rank passes its share of the sequence, q [B, n, Hq, d], k and v [B, n, Hkv, d]
as FlashAttention lays tensors out: with causal=True the zigzag share (plan.zigzag_indices: chunk r and chunk
2*world-1-r), else any equal share. ring_attention returns this rank's rows of O, differentiable in q, k and v. Each
block runs through fa_course.torch.forward/backward (the course's steps); O and LSE merge in float32 (merge.py);
dQ, dK, dV accumulate in float32 and are cast to the inputs' type once, at the end. The K/V (and in the backward the
dK/dV accumulators) go to the next rank through NCCL (batch_isend_irecv), issued from a side stream, so the block's
kernel runs while they travel.

The CPU test runs the same loops (loop.py) with numpy; python/tests/ring_attention.py is this file's GPU test (passed
on two H200s in session 19, docs/results/runs/h200-2026-11-29-session-19.txt).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import torch as fat
from . import loop, plan


class _Ring:
    """This rank's neighbours in `group` and the side stream its transfers are issued from."""

    def __init__(self, group, device):
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        # P2POp takes global ranks; the ring's neighbours are the group's.
        to_global = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
        self.next, self.prev = to_global((self.rank + 1) % self.world), to_global((self.rank - 1) % self.world)
        self.stream = torch.cuda.Stream(device=device)

    def pass_on(self, kind, tensors):
        """Sends `tensors` to the next rank and receives the previous rank's into new tensors; returns arrive(), which
        makes the compute stream wait for them (the host does not wait) and returns them. kind only names the
        message for loop.py's CPU transport: NCCL matches the sends and receives of each pair of ranks in order."""
        if self.world == 1:
            return lambda: tuple(tensors)
        sending = [t.contiguous() for t in tensors]
        arriving = [torch.empty_like(t) for t in sending]
        compute = torch.cuda.current_stream()
        # The side stream starts when the compute stream has written what it sends (this block's K/V, or the dK/dV
        # just accumulated), and no sooner; NCCL's own stream waits for the stream the transfer is issued on. The
        # tensors stay safe from the allocator while in flight: ProcessGroupNCCL records them (or holds them until
        # wait() with TORCH_NCCL_AVOID_RECORD_STREAMS=1).
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in sending]
            ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in arriving]
            works = dist.batch_isend_irecv(ops)

        def arrive():
            for work in works:
                work.wait()  # NCCL's wait: the current (compute) stream waits for the transfer
            compute.wait_stream(self.stream)
            return tuple(arriving)
        return arrive


class _RingAttention(torch.autograd.Function):
    """O of this rank's rows over the whole sequence; the gradients through the same ring."""

    @staticmethod
    def forward(ctx, q, k, v, causal, step_fwd, step_bwd, group):
        ring = _Ring(group, q.device)
        b, n, h, _ = q.shape
        if causal and n % 2:
            raise ValueError(f"ring_attention: causal needs the zigzag split, two equal chunks a rank; n_local = {n}")
        blocks = plan.schedule(ring.rank, ring.world, n, causal, "zigzag")

        def attend(q_, k_, v_, causal_):
            return fat.forward(step_fwd, q_.contiguous(), k_.contiguous(), v_.contiguous(), causal=causal_)

        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full((b, h, n), float("-inf"), dtype=torch.float32, device=q.device)
        loop.ring_forward(blocks, q, k, v, out, lse, attend, ring.pass_on, torch)
        out = out.to(q.dtype)
        # The backward of every block reads the global (merged) O and LSE of its rows.
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.blocks, ctx.step_bwd, ctx.group = blocks, step_bwd, group
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.group, q.device)

        def attend_backward(q_, k_, v_, out_, lse_, d_out_, causal_):
            return fat.backward(ctx.step_bwd, q_.contiguous(), k_.contiguous(), v_.contiguous(), out_.contiguous(),
                                lse_.contiguous(), d_out_.contiguous(), causal=causal_)

        def zeros32(t):
            return torch.zeros(t.shape, dtype=torch.float32, device=t.device)

        dq, dk, dv = loop.ring_backward(ctx.blocks, q, k, v, out, lse, d_out.contiguous(), zeros32(q), zeros32(k),
                                        zeros32(v), attend_backward, ring.pass_on)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def ring_attention(q, k, v, causal: bool, step_fwd: str, step_bwd: str, group=None):
    """This rank's rows of attention over the sequence all ranks of `group` hold (the default group: all), with
    forward step `step_fwd` and backward step `step_bwd` of the course on each block. Every rank holds n tokens, the
    zigzag share when causal (split them with plan.split_indices, put O back with plan.reassembly_order)."""
    return _RingAttention.apply(q, k, v, causal, step_fwd, step_bwd, group)
