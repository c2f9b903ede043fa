"""The ring's two loops, forward and backward, over any arrays and any transport: what one rank does at each step.

At step s the rank starts passing the K/V it holds to the next rank (and receiving the previous rank's), computes its
block of the schedule (plan.schedule) on the K/V it holds while they travel, merges the block's partial O into its
own through the LSE (plan.merge), then takes the K/V that arrived. The backward walks the same ring with the global
O and LSE (the merged ones: a block's P = exp(S - LSE) is then the block's share of the whole row's softmax), keeps
dQ at home, and sends dK/dV accumulators round with the K/V they belong to: after `world` passes they are home.

Torch-free: `attend`, `attend_backward` and `pass_on` come from the caller. ring.py gives the course's kernels and
NCCL; tests/python/test_context_parallel_plan.py gives numpy attention and one thread per rank.
  attend(q, k, v, causal) -> (O, LSE)                          partial O [B, n, H, d] and LSE [B, H, n] of a block
  attend_backward(q, k, v, out, lse, d_out, causal) -> (dQ, dK, dV)   with the global out and lse of the block's rows
  pass_on(kind, arrays) -> arrive    sends `arrays` to the next rank, receives the previous rank's; arrive() waits
                                     for them and returns them. kind ("kv" or "dkv") names the stream of messages.
"""
from __future__ import annotations

from .plan import merge


def ring_forward(blocks, q, k, v, out, lse, attend, pass_on, xp):
    """This rank's O and LSE over the whole sequence, accumulated into out (zeros, [B, n, H, d], float32 or wider)
    and lse (-inf, [B, H, n]), which are returned. blocks: plan.schedule(rank, world, n, causal, layout)."""
    kv = (k, v)
    for s, block in enumerate(blocks):
        # The next step's K/V travel while this block computes (none after the last step: they would be home).
        arriving = pass_on("kv", kv) if s + 1 < len(blocks) else None
        if block is not None:
            o_b, lse_b = attend(q[:, block.q], kv[0][:, block.kv], kv[1][:, block.kv], block.causal)
            out[:, block.q], lse[:, :, block.q] = merge(out[:, block.q], lse[:, :, block.q], o_b, lse_b, xp)
        if arriving is not None:
            kv = arriving()
    return out, lse


def ring_backward(blocks, q, k, v, out, lse, d_out, dq, dk, dv, attend_backward, pass_on):
    """This rank's dQ, dK, dV, accumulated into dq, dk, dv (zeros, float32 or wider) and returned; out and lse are
    the global ones ring_forward returned (out in the inputs' type, as the kernels take it)."""
    kv, dkv = (k, v), (dk, dv)  # dk, dv: the accumulators of this rank's own K/V, which set off with them
    arriving_dkv = None
    for s, block in enumerate(blocks):
        arriving_kv = pass_on("kv", kv) if s + 1 < len(blocks) else None
        grads = None
        if block is not None:
            grads = attend_backward(q[:, block.q], kv[0][:, block.kv], kv[1][:, block.kv], out[:, block.q],
                                    lse[:, :, block.q], d_out[:, block.q], block.causal)
        if arriving_dkv is not None:  # the accumulators of the K/V held now, from the ranks they visited before
            dkv = arriving_dkv()
        if grads is not None:
            dq[:, block.q] += grads[0]
            dkv[0][:, block.kv] += grads[1]
            dkv[1][:, block.kv] += grads[2]
        # On with the K/V's owner's accumulators, overlapped with the next block; the last pass takes them home.
        arriving_dkv = pass_on("dkv", dkv)
        if arriving_kv is not None:
            kv = arriving_kv()
    dk_home, dv_home = arriving_dkv()
    return dq, dk_home, dv_home
