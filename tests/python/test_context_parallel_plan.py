#!/usr/bin/env python3
"""Ring attention's CPU parts (steps 62, 63: context_parallel.loop, .plan, .merge), no GPU or PyTorch: the ring run in
one process, one thread per rank, numpy attention in float64 as the kernel, against attention over the whole sequence.

Checks: the tiny attention's gradients by finite differences (so the reference is right); every rank's blocks cover
exactly the (query, key) pairs its rows need, each once; the reassembled O, LSE, dQ, dK, dV of the ring equal the
whole sequence's to 1e-12 for world 1, 2, 3, 4, 8, causal (zigzag and contiguous) and not; zigzag gives every rank the
same number of pairs and the contiguous split does not (printed); the merge of rows that saw no key gives O = 0 and
LSE = -inf with no NaN and no floating-point warning. Plain asserts, no pytest. Needs numpy.
Usage: test_context_parallel_plan.py
"""
import concurrent.futures
import queue
import sys

import numpy as np

# First: it loads fa_course.context_parallel from the source tree, without the compiled module.
from context_parallel_numpy import attend, attend_backward, check_gradients, random
from fa_course.context_parallel import loop, merge, plan

assert "torch" not in sys.modules, "plan and loop must not need PyTorch"


# The reference's gradient, by central differences of sum(O * G) on a tiny problem, causal and not.
rng = np.random.default_rng(0)
check_gradients(attend, attend_backward, (1, 5, 2, 3), (1, 5, 2, 3), rng)


# --- The merge: rows that saw no key ----------------------------------------------------------------------------------

with np.errstate(all="raise"):  # a log(0), 0/0 or inf - inf in the merge raises here
    o_a, o_b = random((1, 4, 1, 2), rng), random((1, 4, 1, 2), rng)
    lse_a = np.array([[[0.5, -np.inf, -np.inf, 3.0]]])
    lse_b = np.array([[[-np.inf, 1.5, -np.inf, 2.0]]])
    o_a[:, 1], o_b[:, 0] = 0.0, 0.0   # a part that saw no key of a row holds O = 0 there, as the kernels write it
    o_a[:, 2], o_b[:, 2] = 0.0, 0.0
    out, lse = merge.merge(o_a, lse_a, o_b, lse_b, np)
    assert not np.isnan(out).any() and not np.isnan(lse).any(), (out, lse)
    assert np.array_equal(out[:, 0], o_a[:, 0]) and lse[0, 0, 0] == 0.5      # only a saw keys
    assert np.array_equal(out[:, 1], o_b[:, 1]) and lse[0, 0, 1] == 1.5      # only b
    assert np.array_equal(out[:, 2], np.zeros((1, 1, 2))) and lse[0, 0, 2] == -np.inf  # neither
    w = np.exp([3.0, 2.0]) / np.exp([3.0, 2.0]).sum()
    assert np.allclose(out[:, 3], w[0] * o_a[:, 3] + w[1] * o_b[:, 3], rtol=0, atol=1e-15)
    assert np.isclose(lse[0, 0, 3], np.logaddexp(3.0, 2.0), rtol=0, atol=1e-15)
    # The ring's first merge: the accumulators (O = 0, LSE = -inf) with a block's partials give the partials back.
    out, lse = merge.merge(np.zeros_like(o_b), np.full_like(lse_b, -np.inf), o_b, lse_b, np)
    assert np.array_equal(out, o_b) and np.array_equal(lse, lse_b)
    # float32 accumulation: a half-precision O with float32 LSE merges in float32.
    out, lse = merge.merge(o_a.astype(np.float16), lse_a.astype(np.float32), o_b.astype(np.float16),
                          lse_b.astype(np.float32), np)
    assert out.dtype == np.float32 and lse.dtype == np.float32, (out.dtype, lse.dtype)


# --- The split and the schedule ---------------------------------------------------------------------------------------

assert plan.zigzag_indices(8, 0, 2) == [0, 1, 6, 7] and plan.zigzag_indices(8, 1, 2) == [2, 3, 4, 5], \
    f"zigzag split of 8 tokens over 2 ranks: {plan.zigzag_indices(8, 0, 2)}, {plan.zigzag_indices(8, 1, 2)}"
for bad in ((10, 2, "zigzag"), (10, 4, "contiguous")):
    try:
        plan.split_indices(*bad)
    except ValueError:
        continue
    raise AssertionError(f"{bad}: a length that does not cut evenly must be refused")


def covered(world, n, causal, layout):
    """Checks that each rank's blocks meet exactly the (query, key) pairs its rows need, each once, and that the
    K/V of step s is rank (r - s)'s; returns each rank's number of pairs."""
    per_rank = plan.split_indices(n, world, layout)
    work = []
    for r in range(world):
        met = []
        blocks = plan.schedule(r, world, len(per_rank[r]), causal, layout)
        assert len(blocks) == world
        for s, block in enumerate(blocks):
            if block is None:
                continue
            assert block.step == s and block.kv_rank == (r - s) % world, block
            rows, keys = per_rank[r][block.q], per_rank[block.kv_rank][block.kv]
            met += [(i, j) for a, i in enumerate(rows) for b, j in enumerate(keys) if not block.causal or b <= a]
        needed = [(i, j) for i in per_rank[r] for j in range(n) if not causal or j <= i]
        assert len(met) == len(set(met)), f"world {world}, rank {r}: a pair met twice"
        missed, extra = sorted(set(needed) - set(met))[:4], sorted(set(met) - set(needed))[:4]
        assert not missed and not extra, (f"world {world}, n {n}, {layout}, causal {causal}, rank {r}: "
                                          f"missed {missed}, extra {extra}")
        assert sum(plan.pairs(b) for b in blocks) == len(met)
        work.append(len(met))
    return work


for world in (1, 2, 3, 4, 8):
    for c in (1, 3, 5):  # tokens per chunk: odd, so no half of a chunk is ever taken
        n = 2 * world * c
        zigzag = covered(world, n, True, "zigzag")
        assert len(set(zigzag)) == 1, f"world {world}, n {n}: zigzag work per rank {zigzag}"
        assert zigzag[0] == c * (2 * c + 1) + (world - 1) * 2 * c * c  # step 0's triangle, then 2c x c a step
        plain = covered(world, n, True, "contiguous")
        # The contiguous split: rank r does r whole blocks of (n / world)^2 and one triangle.
        m = n // world
        assert plain == [r * m * m + m * (m + 1) // 2 for r in range(world)], plain
        covered(world, n, False, "zigzag")
        covered(world, n, False, "contiguous")
    if world > 1:
        print(f"world {world}, n {n}, causal: pairs per rank, zigzag {zigzag} (equal); contiguous {plain}, "
              f"the busiest rank {max(plain) / min(plain):.1f}x the idlest")


# --- The ring, one thread per rank, against the whole sequence ------------------------------------------------------

def ring_transport(world):
    """pass_on for each rank: a queue per (receiving rank, kind); a send copies, as a transfer would."""
    boxes = [{"kv": queue.Queue(), "dkv": queue.Queue()} for _ in range(world)]
    sent = [{"kv": 0, "dkv": 0} for _ in range(world)]

    def for_rank(r):
        def pass_on(kind, arrays):
            boxes[(r + 1) % world][kind].put(tuple(a.copy() for a in arrays))
            sent[r][kind] += 1
            return lambda: boxes[r][kind].get(timeout=60)
        return pass_on
    return for_rank, boxes, sent


def run_rank(r, world, causal, layout, local, pass_on):
    q, k, v, d_out = local
    blocks = plan.schedule(r, world, q.shape[1], causal, layout)
    b, n, h, d = q.shape
    out, lse = loop.ring_forward(blocks, q, k, v, np.zeros(q.shape), np.full((b, h, n), -np.inf), attend, pass_on, np)
    grads = loop.ring_backward(blocks, q, k, v, out, lse, d_out, np.zeros(q.shape), np.zeros(k.shape),
                               np.zeros(v.shape), attend_backward, pass_on)
    return (out, lse) + grads


def check_ring(world, n, causal, layout, rng):
    q, k, v, d_out = (random((2, n, 3, 4), rng) * 2 for _ in range(4))
    o_ref, lse_ref = attend(q, k, v, causal)
    ref = (o_ref, lse_ref) + attend_backward(q, k, v, o_ref, lse_ref, d_out, causal)
    per_rank = plan.split_indices(n, world, layout)
    for_rank, boxes, sent = ring_transport(world)
    with concurrent.futures.ThreadPoolExecutor(max_workers=world) as pool:
        futures = [pool.submit(run_rank, r, world, causal, layout,
                               tuple(x[:, per_rank[r]] for x in (q, k, v, d_out)), for_rank(r)) for r in range(world)]
        results = [f.result() for f in futures]
    # K/V pass on world-1 times in the forward and again in the backward; dK/dV world times, the last one home.
    assert all(s == {"kv": 2 * (world - 1), "dkv": world} for s in sent), sent
    assert all(box[kind].empty() for box in boxes for kind in box), "a message nobody took"
    order = plan.reassembly_order(per_rank)
    for i, name in enumerate(("O", "LSE", "dQ", "dK", "dV")):
        seq_axis = 2 if name == "LSE" else 1
        whole = np.concatenate([res[i] for res in results], axis=seq_axis)
        whole = np.take(whole, order, axis=seq_axis)
        err = np.abs(whole - ref[i]).max() / max(1.0, np.abs(ref[i]).max())
        assert err < 1e-12, f"world {world}, n {n}, causal {causal}, {layout}: {name} off by {err:.2g}"


rng = np.random.default_rng(1)
for world in (1, 2, 3, 4, 8):
    for c in (1, 3, 5):
        n = 2 * world * c
        check_ring(world, n, True, "zigzag", rng)
        check_ring(world, n, True, "contiguous", rng)
        check_ring(world, n, False, "contiguous", rng)
        check_ring(world, n, False, "zigzag", rng)
print("ring attention's plan and loops: O, LSE, dQ, dK, dV as the whole sequence's for world 1, 2, 3, 4, 8: passed")
