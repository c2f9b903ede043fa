"""Ring attention's plan: which tokens each rank holds, which block meets which at each ring step, and the merge.

Context parallelism cuts one long sequence across `world` ranks. Each rank keeps its own Q and passes its K/V block to
the next rank, `world` steps round the ring, so every Q block meets every K/V block once; the partial O of each meeting
is merged through its log-sum-exp, exactly as split-KV decoding merges its splits
(steps/42_split_kv_decode/split_kv.cuh, combine_kernel). Under the causal mask a contiguous split leaves rank 0 almost
idle and the last rank doing most of the work; the zigzag split (rank r holds chunk r and chunk 2*world-1-r of 2*world
chunks) gives every rank the same work.

Torch-free and numpy-free: the merge takes the array module (numpy or torch) as `xp`, so the GPU driver (ring.py) and
the CPU test (tests/python/test_context_parallel_plan.py) run the same lines.
"""
from __future__ import annotations

from dataclasses import dataclass


# --- The split: which tokens each rank holds --------------------------------------------------------------------------

def zigzag_indices(n: int, rank: int, world: int) -> list[int]:
    """The token positions rank `rank` holds under the zigzag split of n tokens: chunk `rank` then chunk
    2*world-1-rank, of 2*world equal chunks. Rank 0 holds the first and the last chunk, rank world-1 the two middle
    ones, so every rank has one chunk from the cheap front and one from the expensive back of the causal triangle."""
    if n % (2 * world):
        raise ValueError(f"zigzag split: {n} tokens do not cut into 2 * world = {2 * world} equal chunks")
    c = n // (2 * world)
    back = 2 * world - 1 - rank
    return list(range(rank * c, (rank + 1) * c)) + list(range(back * c, (back + 1) * c))


def contiguous_indices(n: int, rank: int, world: int) -> list[int]:
    """The token positions rank `rank` holds under the plain split: the rank-th of `world` equal contiguous chunks."""
    if n % world:
        raise ValueError(f"contiguous split: {n} tokens do not cut into world = {world} equal chunks")
    c = n // world
    return list(range(rank * c, (rank + 1) * c))


def split_indices(n: int, world: int, layout: str) -> list[list[int]]:
    """Every rank's token positions under `layout` ("zigzag" or "contiguous")."""
    of = {"zigzag": zigzag_indices, "contiguous": contiguous_indices}[layout]
    return [of(n, r, world) for r in range(world)]


def reassembly_order(per_rank: list[list[int]]) -> list[int]:
    """The inverse of a split: with the ranks' rows concatenated in rank order, row `order[t]` of the concatenation
    is token t. So `concatenated[order]` puts a sequence back in its original order."""
    held = [t for indices in per_rank for t in indices]
    order = [0] * len(held)
    for row, t in enumerate(held):
        order[t] = row
    return order


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


def schedule(rank: int, world: int, n_local: int, causal: bool, layout: str = "zigzag") -> list[Block | None]:
    """Rank `rank`'s blocks, one per ring step 0 .. world-1 (None: nothing to compute at that step).

    Not causal: every block is whole, whatever the split. Causal, zigzag split (each rank's halves are its front
    chunk F and its back chunk B, in that order, n_local = 2c):
      step 0, its own K/V: the whole local block, causal (F before B, so top-left is right for all four quarters);
      K/V of a lower rank (step <= rank): that rank's F precedes both our chunks and its B follows both, so all of
        local Q meets the visiting FRONT half, unmasked;
      K/V of a higher rank (step > rank): its F lies between our F and our B and its B precedes our B, so only our
        BACK half of Q meets the whole visiting block, unmasked.
    Every block is then q_len * kv_len = 2c * c pairs, the same on every rank. Causal, contiguous split: step 0
    causal, a lower rank's K/V whole, a higher rank's skipped (it lies entirely above the diagonal)."""
    whole = slice(0, n_local)
    blocks: list[Block | None] = []
    for step in range(world):
        kv_rank = (rank - step) % world
        if not causal:
            blocks.append(Block(step, kv_rank, whole, whole, False))
        elif step == 0:
            blocks.append(Block(step, kv_rank, whole, whole, True))
        elif layout == "contiguous":
            blocks.append(Block(step, kv_rank, whole, whole, False) if kv_rank < rank else None)
        elif layout == "zigzag":
            half = n_local // 2
            if kv_rank < rank:
                blocks.append(Block(step, kv_rank, whole, slice(0, half), False))
            else:
                blocks.append(Block(step, kv_rank, slice(half, n_local), whole, False))
        else:
            raise ValueError(f"schedule: layout {layout!r}: takes 'zigzag' or 'contiguous'")
    return blocks


def pairs(block: Block | None) -> int:
    """How many (query, key) pairs a block computes: the work of its kernel."""
    if block is None:
        return 0
    rows, cols = block.q.stop - block.q.start, block.kv.stop - block.kv.start
    if not block.causal:
        return rows * cols
    return sum(min(i + 1, cols) for i in range(rows))  # top-left: row i sees keys 0 .. i


# --- The merge: two partial results of the same rows, through their LSE -----------------------------------------------

def merge(o_a, lse_a, o_b, lse_b, xp):
    """O and LSE of rows that saw the keys of a and the keys of b, from each one's partial O [B, N, H, d] and LSE
    [B, H, N] (natural log); xp is the arrays' module (numpy or torch: both have maximum, where, exp, log, swapaxes).
    The same arithmetic as step 42's combine_kernel (steps/42_split_kv_decode/split_kv.cuh), for two splits and in
    natural log: weights exp(LSE - M) with M the larger LSE, O the weighted mean, LSE = M + log(sum of weights).
    A row neither part saw a key of (both LSE -inf) gets O = 0 and LSE = -inf, with no NaN: M is replaced by 0 where
    it is -inf, and the sum of weights by 1 where it is 0. The weights are in the LSE's type (float32 on the GPU,
    where O may be bf16: the products and the sum are float32)."""
    m = xp.maximum(lse_a, lse_b)
    m_finite = xp.where(m == float("-inf"), xp.zeros_like(m), m)
    w_a, w_b = xp.exp(lse_a - m_finite), xp.exp(lse_b - m_finite)  # exp(-inf) = 0: a part that saw no key
    total = w_a + w_b
    seen = total > 0
    total_or_1 = xp.where(seen, total, xp.ones_like(total))
    lse = m + xp.log(total_or_1)  # where nothing was seen: m = -inf, log(1) = 0
    per_row = lambda x: xp.swapaxes(x, -1, -2)[..., None]  # [B, H, N] -> [B, N, H, 1], to scale O's rows  # noqa: E731
    out = (per_row(w_a) * o_a + per_row(w_b) * o_b) / per_row(total_or_1)
    return out, lse
