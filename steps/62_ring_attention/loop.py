"""Step 62, ring attention: one long sequence cut across the GPUs of a host, attention computed by passing K/V round.

Each of `world` ranks holds n of the sequence's tokens: its Q, K and V rows. It keeps its Q and passes the K/V it holds
to the next rank, `world` steps round the ring, so every Q block meets every K/V block once. At step s the rank starts
passing the K/V it holds to the next rank (and receiving the previous rank's), computes its block on the K/V it holds
while they travel, merges the block's partial O into its own through the LSE (merge.py: step 42's combine, in float32),
then takes the K/V that arrived. The transfer of step s hides behind step s's block; no rank ever holds more than two
K/V blocks. The backward walks the same ring with the global O and LSE (the merged ones: a block's P = exp(S - LSE) is
then the block's share of the whole row's softmax), keeps dQ at home, and sends dK/dV accumulators round with the K/V
they belong to: after `world` passes they are home.

The blocks come from a schedule: here, without a mask, every step's block is whole. Step 63 gives the causal mask its
own schedule (plan.py) and the loops below run it unchanged.

Torch-free: `attend`, `attend_backward` and `pass_on` come from the caller. ring.py gives the course's kernels and
NCCL; tests/python/test_context_parallel_plan.py gives numpy attention and one thread per rank.
  attend(q, k, v, causal) -> (O, LSE)                          partial O [B, n, H, d] and LSE [B, H, n] of a block
  attend_backward(q, k, v, out, lse, d_out, causal) -> (dQ, dK, dV)   with the global out and lse of the block's rows
  pass_on(kind, arrays) -> arrive    sends `arrays` to the next rank, receives the previous rank's; arrive() waits
                                     for them and returns them. kind ("kv" or "dkv") names the stream of messages.
"""
from __future__ import annotations

from dataclasses import dataclass

from .merge import merge


# --- The split: which tokens each rank holds --------------------------------------------------------------------------

def contiguous_indices(n: int, rank: int, world: int) -> list[int]:
    """The token positions rank `rank` holds under the plain split: the rank-th of `world` equal contiguous chunks."""
    if n % world:
        raise ValueError(f"contiguous split: {n} tokens do not cut into world = {world} equal chunks")
    c = n // world
    return list(range(rank * c, (rank + 1) * c))


# --- The schedule: what meets what at each ring step ------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    """One meeting of local Q rows with visiting K/V rows at one ring step.
    q and kv are slices of local positions (of this rank's Q, of the visiting rank's K/V); causal: the top-left
    causal mask applies within the block (row i sees keys 0 .. i), else every row sees every key."""
    step: int
    kv_rank: int   # whose K/V visits at this step: (rank - step) mod world
    q: slice
    kv: slice
    causal: bool


def schedule(rank: int, world: int, n_local: int) -> list[Block]:
    """Rank `rank`'s blocks without a mask, one per ring step 0 .. world-1: every block is whole, whatever the split.
    At step s the K/V of rank (rank - s) mod world visit: its own at step 0, then each previous rank's in turn."""
    whole = slice(0, n_local)
    return [Block(step, (rank - step) % world, whole, whole, False) for step in range(world)]


# --- The loops: what one rank does at each ring step ------------------------------------------------------------------

def ring_forward(blocks, q, k, v, out, lse, attend, pass_on, xp):
    """This rank's O and LSE over the whole sequence, accumulated into out (zeros, [B, n, H, d], float32 or wider)
    and lse (-inf, [B, H, n]), which are returned. blocks: a schedule (None: nothing to compute at that step)."""
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
