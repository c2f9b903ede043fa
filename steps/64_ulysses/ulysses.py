"""Step 64, the all-to-all form of context parallelism (DeepSpeed-Ulysses): swap sequence shards for head shards.

Each rank holds its tokens of every head, q [B, n, Hq, d], k and v [B, n, Hkv, d] (n = N / world tokens, the split of
plan.split_indices). One all-to-all gives every rank all N tokens of its own heads, [B, N, Hq / world, d]: attention
then runs on one rank per head group, the whole sequence at once, with the course's single-GPU kernel and no merge.
A second all-to-all takes O back to the ranks' tokens, [B, n, Hq, d]. The backward runs the same way round: dO to
head shards, the kernel's backward with the head shard's own O and LSE, dQ, dK, dV back to the tokens.

The head split: rank r takes query heads r*Hq/world .. (r+1)*Hq/world - 1 and the KV heads those read (query head h
reads KV head h // (Hq/Hkv), as the kernels' GQA does). With Hkv a multiple of world, rank r takes KV heads
r*Hkv/world .. (r+1)*Hkv/world - 1 and the kernel's GQA rule holds on the shard as it does on the whole. With fewer
KV heads than ranks (world a multiple of Hkv), each KV head is replicated on the world/Hkv ranks whose query heads
read it: those ranks' query heads all lie in its group, so each rank holds one KV head; the backward sums the
replicas' dK and dV. Any other Hkv is refused: a rank's query heads would then read KV heads on which the kernel's
GQA rule (local h // (local Hq / local Hkv)) picks the wrong one.

Under a zigzag split (the ring's, plan.zigzag_indices) the tokens that arrive from the ranks, concatenated in rank
order, are not in sequence order: they are put back with plan.reassembly_order before the kernel sees them (the
causal mask reads positions), and O goes out to rank s at rank s's own positions (plan.split_indices).

Torch-free and numpy-free: the functions take the array module `xp` (numpy or torch: stack, swapaxes, reshape and
indexing spell the same) and the transport `all_to_all(buffer) -> buffer` from the caller, where buffer is
[world, ...]: buffer[s] goes to rank s, and slot r of what comes back came from rank r. That is
torch.distributed.all_to_all_single on a tensor whose first dimension is world (ulysses_torch.py), or, on the CPU, one
barrier between threads (tests/python/test_context_parallel_ulysses.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from .plan import reassembly_order, split_indices


# --- The head split: which heads each rank computes -------------------------------------------------------------------

def head_split(hq: int, hkv: int, world: int) -> tuple[list[slice], list[slice]]:
    """Every rank's query heads and KV heads (slices of the head axis). Refuses, naming Hq, Hkv and world, a split
    where the heads do not divide: Hq must be a multiple of world, and Hkv a multiple of world or a divisor of it."""
    if hq % hkv:
        raise ValueError(f"ulysses: Hq = {hq} query heads do not share Hkv = {hkv} KV heads evenly (GQA needs Hq a "
                         f"multiple of Hkv)")
    if hq % world:
        raise ValueError(f"ulysses: Hq = {hq} query heads do not cut into world = {world} equal head shards; takes "
                         f"Hq a multiple of world")
    per = hq // world
    q_heads = [slice(r * per, (r + 1) * per) for r in range(world)]
    if hkv % world == 0:  # each rank its own KV heads, the group rule unchanged on the shard
        kv_per = hkv // world
        kv_heads = [slice(r * kv_per, (r + 1) * kv_per) for r in range(world)]
    elif world % hkv == 0:  # each KV head replicated on the world/Hkv ranks that read it: one KV head a rank
        ranks_per_kv = world // hkv
        kv_heads = [slice(r // ranks_per_kv, r // ranks_per_kv + 1) for r in range(world)]
    else:
        raise ValueError(f"ulysses: Hkv = {hkv} KV heads (Hq = {hq}) on world = {world} ranks: takes Hkv a "
                         f"multiple of world (each rank Hkv/world KV heads) or a divisor of it (each KV head on "
                         f"world/Hkv ranks)")
    return q_heads, kv_heads


@dataclass(frozen=True)
class Shards:
    """Who holds what: rank s's query heads q_heads[s] and KV heads kv_heads[s] (after the all-to-all), its tokens
    tokens[s] (before it, in the split's order), and order, which puts the ranks' tokens concatenated in rank order
    back in sequence order (plan.reassembly_order)."""
    q_heads: list[slice]
    kv_heads: list[slice]
    tokens: list[list[int]]
    order: list[int]

    @property
    def world(self) -> int:
        return len(self.tokens)


def shards(n: int, hq: int, hkv: int, world: int, layout: str) -> Shards:
    """The heads and tokens of every rank, for N = n tokens split by `layout` ("zigzag" or "contiguous")."""
    q_heads, kv_heads = head_split(hq, hkv, world)
    tokens = split_indices(n, world, layout)
    return Shards(q_heads, kv_heads, tokens, reassembly_order(tokens))


# --- The layout on each side of an all-to-all -------------------------------------------------------------------------

def to_heads(x, heads, xp):
    """What a rank sends to swap its sequence shard for head shards: x [B, n, H, d] (its tokens, every head) cut
    into [world, B, n, H_s, d], slot s holding rank s's heads. A KV head on several ranks goes to each of them."""
    return xp.stack([x[:, :, h] for h in heads])


def from_tokens(received, order):
    """What a rank computes on, from what arrived: received [world, B, n, h, d], slot r holding rank r's tokens of
    this rank's heads, becomes [B, N, h, d] in sequence order (the ranks' tokens in rank order, then `order`)."""
    world, b, n, h, d = received.shape
    return received.swapaxes(0, 1).reshape((b, world * n, h, d))[:, order]


def to_tokens(x, tokens, xp):
    """What a rank sends to swap its head shard back for sequence shards: x [B, N, h, d] (sequence order, its heads)
    cut into [world, B, n, h, d], slot s holding rank s's tokens in rank s's order."""
    return xp.stack([x[:, t] for t in tokens])


def from_heads(received, heads, out):
    """Adds what arrived, received [world, B, n, H_r, d] with slot r holding rank r's heads of this rank's tokens,
    into out [B, n, H, d] (zeros) at those heads, and returns out. A KV head replicated on several ranks gets their
    sum: the dK and dV of every query head that read it."""
    for r, h in enumerate(heads):
        out[:, :, h] += received[r]
    return out


# --- One rank's forward and backward ----------------------------------------------------------------------------------

def ulysses_forward(who: Shards, q, k, v, out, causal, attend, all_to_all, xp):
    """This rank's rows of O, written into out (zeros [B, n, Hq, d]) and returned, and the head shard's tensors the
    backward reads: (q, k, v, O, LSE) of this rank's heads over the whole sequence. who: shards() of the whole
    problem, the same on every rank (which rank this is shows only in what all_to_all brings).
    attend(q, k, v, causal) -> (O, LSE): the single-GPU kernel on [B, N, h, d] in sequence order, LSE [B, h, N]."""
    s = who
    q_h = from_tokens(all_to_all(to_heads(q, s.q_heads, xp)), s.order)
    k_h = from_tokens(all_to_all(to_heads(k, s.kv_heads, xp)), s.order)
    v_h = from_tokens(all_to_all(to_heads(v, s.kv_heads, xp)), s.order)
    o_h, lse_h = attend(q_h, k_h, v_h, causal)
    from_heads(all_to_all(to_tokens(o_h, s.tokens, xp)), s.q_heads, out)
    return out, (q_h, k_h, v_h, o_h, lse_h)


def ulysses_backward(who: Shards, saved, d_out, dq, dk, dv, causal, attend_backward, all_to_all, xp):
    """This rank's dQ, dK, dV, accumulated into dq, dk, dv (zeros of q's, k's and v's shapes; float32 or wider where
    a KV head is replicated, since its replicas' gradients are summed here) and returned. saved: what
    ulysses_forward returned beside O. attend_backward(q, k, v, out, lse, d_out, causal) -> (dQ, dK, dV)."""
    s = who
    q_h, k_h, v_h, o_h, lse_h = saved
    d_out_h = from_tokens(all_to_all(to_heads(d_out, s.q_heads, xp)), s.order)
    dq_h, dk_h, dv_h = attend_backward(q_h, k_h, v_h, o_h, lse_h, d_out_h, causal)
    from_heads(all_to_all(to_tokens(dq_h, s.tokens, xp)), s.q_heads, dq)
    from_heads(all_to_all(to_tokens(dk_h, s.tokens, xp)), s.kv_heads, dk)
    from_heads(all_to_all(to_tokens(dv_h, s.tokens, xp)), s.kv_heads, dv)
    return dq, dk, dv
