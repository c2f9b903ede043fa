"""Step 63, the causal ring, load-balanced: the zigzag split and a schedule that skips what the mask hides.

Step 62's ring (loop.py) runs unchanged; what changes is which tokens each rank holds and which block each ring step
computes. Under the causal mask a contiguous split leaves rank 0 almost idle (its keys come first, its rows see little)
and the last rank doing most of the work, and every rank waits for the busiest at each step. The zigzag split (rank r
holds chunk r and chunk 2*world-1-r of 2*world chunks) gives every rank one chunk from the cheap front and one from the
expensive back of the causal triangle, and so the same work. The schedule then computes, at each step, only the part of
the visiting block that the mask lets the rank's rows see: half of step 62's whole block, with no mask at all (the
kernel's causal mask is needed only on the diagonal, at step 0), and nothing above the diagonal.

Torch-free and numpy-free: the GPU driver (ring.py) and the CPU test (tests/python/test_context_parallel_plan.py) run
the same lines.
"""
from __future__ import annotations

from .loop import Block, contiguous_indices
from .loop import schedule as whole_blocks


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


def split_indices(n: int, world: int, layout: str) -> list[list[int]]:
    """Every rank's token positions under `layout` ("zigzag" or "contiguous", step 62's)."""
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

def schedule(rank: int, world: int, n_local: int, causal: bool, layout: str = "zigzag") -> list[Block | None]:
    """Rank `rank`'s blocks, one per ring step 0 .. world-1 (None: nothing to compute at that step).

    Not causal: every block is whole, whatever the split (step 62's schedule). Causal, zigzag split (each rank's halves
    are its front chunk F and its back chunk B, in that order, n_local = 2c):
      step 0, its own K/V: the whole local block, causal (F before B, so top-left is right for all four quarters);
      K/V of a lower rank (step <= rank): that rank's F precedes both our chunks and its B follows both, so all of
        local Q meets the visiting FRONT half, unmasked;
      K/V of a higher rank (step > rank): its F lies between our F and our B and its B precedes our B, so only our
        BACK half of Q meets the whole visiting block, unmasked.
    Every block is then q_len * kv_len = 2c * c pairs, the same on every rank. Causal, contiguous split: step 0
    causal, a lower rank's K/V whole, a higher rank's skipped (it lies entirely above the diagonal)."""
    if not causal:
        return whole_blocks(rank, world, n_local)
    whole = slice(0, n_local)
    blocks: list[Block | None] = []
    for step in range(world):
        kv_rank = (rank - step) % world
        if step == 0:
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
