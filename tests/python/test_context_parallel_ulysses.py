#!/usr/bin/env python3
"""The all-to-all form (fa_course.context_parallel.ulysses) without a GPU or PyTorch: every rank a thread, the
all-to-all a barrier between them, numpy attention in float64 as the kernel, against attention over the whole sequence.

Checks: the GQA reference's gradients by finite differences; the head split (every query head on one rank, each rank
holding the KV heads its query heads read, the kernel's GQA rule right on every shard) and its refusals (Hq not a
multiple of world; Hkv neither a multiple nor a divisor of world), each naming Hq, Hkv and world; every rank's rows of
O and its dQ, dK, dV, and every head shard's O and LSE, equal the whole sequence's to 1e-12, for world 1, 2, 3, 4, MHA,
GQA with KV heads split and with KV heads replicated, causal and not, contiguous and zigzag shards; every all-to-all
sends and receives equal pieces (as all_to_all_single needs). Plain asserts, no pytest. Needs numpy.
Usage: test_context_parallel_ulysses.py
"""
import concurrent.futures
import sys
import threading

import numpy as np

# First: it loads fa_course.context_parallel from the source tree, without the compiled module.
from context_parallel_numpy import attend, attend_backward, check_gradients, random
from fa_course.context_parallel import ulysses

assert "torch" not in sys.modules, "ulysses must not need PyTorch"


# --- The kernel with GQA: query head h reads KV head h // (Hq / Hkv), as the course's kernels do ---------------------

def attend_gqa(q, k, v, causal):
    group = q.shape[2] // k.shape[2]
    return attend(q, np.repeat(k, group, axis=2), np.repeat(v, group, axis=2), causal)


def attend_backward_gqa(q, k, v, out, lse, d_out, causal):
    """dK, dV of a KV head: the sum over the query heads of its group."""
    group = q.shape[2] // k.shape[2]
    dq, dk, dv = attend_backward(q, np.repeat(k, group, axis=2), np.repeat(v, group, axis=2), out, lse, d_out, causal)
    b, m, hkv, d = k.shape
    return dq, dk.reshape(b, m, hkv, group, d).sum(3), dv.reshape(b, m, hkv, group, d).sum(3)


rng = np.random.default_rng(0)
check_gradients(attend_gqa, attend_backward_gqa, (1, 5, 4, 3), (1, 5, 2, 3), rng)


# --- The head split ---------------------------------------------------------------------------------------------------

HEADS = ((12, 12), (12, 6), (12, 4), (12, 3), (8, 2), (8, 1), (12, 1))  # (Hq, Hkv): MHA, GQA, MQA
accepted = {}
for world in (1, 2, 3, 4, 8):
    for hq, hkv in HEADS + ((6, 6), (6, 3), (6, 2)):
        try:
            q_heads, kv_heads = ulysses.head_split(hq, hkv, world)
        except ValueError as e:
            # Refused only when the heads do not divide, and saying so with the numbers.
            assert hq % world or (hkv % world and world % hkv), (hq, hkv, world, e)
            assert f"Hq = {hq}" in str(e) and f"world = {world}" in str(e), e
            assert hq % world or f"Hkv = {hkv}" in str(e), e
            continue
        accepted.setdefault(world, []).append((hq, hkv))
        group = hq // hkv
        assert sorted(h for s in q_heads for h in range(hq)[s]) == list(range(hq)), "each query head on one rank"
        for qs, kvs in zip(q_heads, kv_heads):
            local_q, local_kv = range(hq)[qs], range(hkv)[kvs]
            assert len(local_q) == hq // world and len(local_q) % len(local_kv) == 0, (hq, hkv, world, qs, kvs)
            local_group = len(local_q) // len(local_kv)
            # The kernel on the shard maps local query head j to local KV head j // local_group: the right one.
            assert all(local_kv[j // local_group] == h // group for j, h in enumerate(local_q)), (hq, hkv, world)
        # Every rank sends pieces of one size (all_to_all_single cuts its buffer evenly).
        assert len({s.stop - s.start for s in kv_heads}) == 1, (hq, hkv, world, kv_heads)
for bad in ((6, 6, 4), (12, 3, 2), (12, 6, 4), (12, 5, 3)):  # Hq % world; Hkv neither; Hkv neither; Hq % Hkv
    try:
        ulysses.head_split(*bad)
    except ValueError as e:
        print(f"refused {bad}: {e}")
        continue
    raise AssertionError(f"head_split{bad} must be refused")
print("head splits accepted: " + "; ".join(f"world {w}: {heads}" for w, heads in accepted.items()))


# --- Ulysses, one thread per rank, against the whole sequence ---------------------------------------------------------

def a2a_transport(world):
    """all_to_all for each rank: slot s of what rank r sends becomes slot r of what rank s receives (copies, as a
    transfer makes), after every rank has sent; every rank's buffer the same shape, as all_to_all_single needs."""
    sent = [None] * world
    barrier = threading.Barrier(world, timeout=60)
    calls = [0] * world

    def for_rank(r):
        def all_to_all(buffer):
            assert buffer.shape[0] == world, buffer.shape
            sent[r] = buffer.copy()
            barrier.wait()
            assert len({b.shape for b in sent}) == 1, [b.shape for b in sent]
            received = np.stack([sent[s][r] for s in range(world)])
            barrier.wait()  # every rank has read before any sends again
            calls[r] += 1
            return received
        return all_to_all
    return for_rank, calls


def run_rank(who, causal, local, all_to_all):
    q, k, v, d_out = local
    out, saved = ulysses.ulysses_forward(who, q, k, v, np.zeros(q.shape), causal, attend_gqa, all_to_all, np)
    grads = ulysses.ulysses_backward(who, saved, d_out, np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape),
                                     causal, attend_backward_gqa, all_to_all, np)
    return (out,) + grads, saved


def check_ulysses(world, n, hq, hkv, causal, layout, rng):
    q, d_out = random((2, n, hq, 4), rng) * 2, random((2, n, hq, 4), rng)
    k, v = random((2, n, hkv, 4), rng) * 2, random((2, n, hkv, 4), rng)
    o_ref, lse_ref = attend_gqa(q, k, v, causal)
    ref = (o_ref,) + attend_backward_gqa(q, k, v, o_ref, lse_ref, d_out, causal)
    who = ulysses.shards(n, hq, hkv, world, layout)
    for_rank, calls = a2a_transport(world)
    with concurrent.futures.ThreadPoolExecutor(max_workers=world) as pool:
        futures = [pool.submit(run_rank, who, causal, tuple(x[:, who.tokens[r]] for x in (q, k, v, d_out)),
                               for_rank(r)) for r in range(world)]
        results = [f.result() for f in futures]
    assert calls == [8] * world, calls  # Q, K, V, O forward; dO, dQ, dK, dV backward
    where = f"world {world}, n {n}, Hq {hq}, Hkv {hkv}, causal {causal}, {layout}"

    def close(got, want, name):
        err = np.abs(got - want).max() / max(1.0, np.abs(want).max())
        assert err < 1e-12, f"{where}: {name} off by {err:.2g}"
    for r, (grads, saved) in enumerate(results):
        for name, got, want in zip(("O", "dQ", "dK", "dV"), grads, ref):
            close(got, want[:, who.tokens[r]], f"rank {r}'s {name}")
        # The head shard: the whole sequence in order, this rank's heads.
        close(saved[3], o_ref[:, :, who.q_heads[r]], f"rank {r}'s head shard of O")
        close(saved[4], lse_ref[:, who.q_heads[r]], f"rank {r}'s head shard of LSE")


rng = np.random.default_rng(1)
cases = 0
for world, heads in accepted.items():
    if world == 8:  # the split above; the simulation stops at 4
        continue
    for hq, hkv in heads:
        for c in (1, 3):  # tokens per zigzag chunk
            n = 2 * world * c
            for causal in (True, False):
                for layout in ("zigzag", "contiguous"):
                    check_ulysses(world, n, hq, hkv, causal, layout, rng)
                    cases += 1
print(f"ulysses: O, dQ, dK, dV as the whole sequence's for world 1, 2, 3, 4, MHA and GQA (KV split and replicated), "
      f"causal and not, zigzag and contiguous ({cases} cases): passed")
