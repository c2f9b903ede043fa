#!/usr/bin/env python3
"""Time FlashAttention-3 (Dao-AILab's Hopper kernels) as a peer of the course's steps.

FlashAttention-3 is reached through the `flash-attn3-jax` wheel (its kernels prebuilt for sm_90 at
head_dim 128, f16 and bf16) and the GPU machine's JAX; the wheel needs only `einops` beside JAX. On a
machine without network, carry the wheel and install it without an index:

    python3 -m pip install --no-index --no-deps --target /tmp/site .whl/flash_attn3_jax-*.whl
    PYTHONPATH=/tmp/site XLA_PYTHON_CLIENT_PREALLOCATE=false \\
        python3 bench/fa3_peer.py --shape 4,4096,4096,16,16,128 --csv out/fa3.csv [--pass backward|both]
    python3 bench/fa3_peer.py --shape 4,4096,4096,16,16,128 --dry-run          # the plan, without JAX

XLA dispatches asynchronously and may drop a call whose result nobody reads, so each measurement is
a jitted chain of --chain calls in which each call's output is the next call's query (the kernel's
work does not depend on the values); the chain is timed on the host after block_until_ready, and its
time divided by --chain is one sample. The median of --reps samples after --warmup chains is
reported. Rows are appended to the CSV with fa-bench's columns and step = fa3, like
sdpa_peers.py's rows; the relative L2 error is that of --sample-rows rows of one plain call against
float64. Causal masking: FlashAttention-3 aligns it bottom-right, which is the course's top-left
alignment when q_len = kv_len; other shapes are refused with causal.

--pass backward (or both) times the backward: jax.vjp of flash_mha, jitted, as forward + backward
minus forward. Each rep times a chain of --chain forwards (as above) and then a chain of --chain
forward + backward calls, in which (dQ, dK, dV) of one call are the next call's (Q, K, V); the
sample is the difference of the two per call, and the median of --reps samples is reported (FA3's
backward needs the forward's LSE, which JAX passes only inside one traced function). Rows get
pass = backward and TFLOPS = 2.5 x the forward's count / t; rel_err and max_err are those of
--sample-rows sampled rows of dQ against float64 (dK and dV are not checked). GQA (Hkv < Hq) as
the forward: the wheel's backward sums dK and dV over each KV head's group.
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # sdpa_peers
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))  # plots
from plots import COLUMNS  # noqa: E402  fa-bench's CSV header, written down once in tools/plots.py
from sdpa_peers import BACKWARD_SHAPES, PASSES, SUITES, flops, open_csv, peer_row  # noqa: E402  the same CSV rows

#: The head_dims and dtypes the wheel's kernels are built for.
HEAD_DIMS = (128,)
DTYPES = ("f16", "bf16")


def parse_args(argv=None):
    """Command-line options; see --help."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", action="append", default=[],
                        help="B,Nq,Nkv,Hq,Hkv,d (repeatable; d = 128); suite column 'custom'")
    parser.add_argument("--dtypes", default="f16,bf16", help="comma-separated: f16, bf16 (default both)")
    parser.add_argument("--causal", default="no,yes", help="comma-separated: no, yes (default both)")
    parser.add_argument("--pass", dest="passes", default="forward", choices=tuple(PASSES),
                        help="forward (default), backward (forward + backward minus forward) or both")
    parser.add_argument("--chain", type=int, default=20, help="calls per timed chain (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed chains first (default 2)")
    parser.add_argument("--reps", type=int, default=7, help="timed chains, median reported (default 7)")
    parser.add_argument("--sample-rows", type=int, default=32, help="output rows checked in float64 (default 32)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--csv", help="CSV to append to (header written if the file is new or empty)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the CSV header; needs no JAX")
    args = parser.parse_args(argv)
    if not args.shape:
        parser.error("--shape is required (the wheel's kernels take head_dim 128: e.g. 4,4096,4096,16,16,128)")
    if not args.dry_run and not args.csv:
        parser.error("--csv is required (or --dry-run)")
    for value in args.dtypes.split(","):
        if value not in DTYPES:
            parser.error(f"--dtypes: unknown value '{value}', expected {', '.join(DTYPES)}")
    for value in args.causal.split(","):
        if value not in ("no", "yes"):
            parser.error(f"--causal: unknown value '{value}', expected no, yes")
    args.shapes = []
    for text in args.shape:
        values = tuple(int(v) for v in text.split(","))
        if len(values) != 6 or min(values) < 1 or values[3] % values[4]:
            parser.error(f"--shape {text}: expected six positive sizes B,Nq,Nkv,Hq,Hkv,d with Hkv dividing Hq")
        if values[5] not in HEAD_DIMS:
            parser.error(f"--shape {text}: the flash-attn3-jax wheel's kernels take head_dim "
                         f"{', '.join(map(str, HEAD_DIMS))}, not {values[5]}")
        if "yes" in args.causal.split(",") and values[1] != values[2]:
            parser.error(f"--shape {text} with causal: FlashAttention-3 aligns the mask bottom-right, the course "
                         "top-left; they agree only when Nq = Nkv")
        args.shapes.append(values)
    return args


def reference_dq_rows(np, qd, kd, vd, dod, causal, rows):
    """float64 dQ of the sampled rows (b, i, h) given dO, all [B, N, H, d] float64 arrays:
    dQ_i = scale sum_j P_ij (dP_ij - D_i) K_j with dP_ij = dO_i . V_j and D_i = dO_i . O_i."""
    q_heads, kv_heads, head_dim = qd.shape[2], kd.shape[2], qd.shape[3]
    scale = 1 / np.sqrt(head_dim)
    out = []
    for b, i, h in rows:
        kv_h = h // (q_heads // kv_heads)
        keys, values = kd[b, :, kv_h], vd[b, :, kv_h]
        scores = keys @ qd[b, i, h] * scale
        if causal:
            scores[i + 1:] = -np.inf  # top-left aligned: query i sees keys j <= i
        p = np.exp(scores - scores.max())
        p /= p.sum()
        d_o = dod[b, i, h]
        d_s = p * (values @ d_o - d_o @ (p @ values))
        out.append(scale * (d_s @ keys))
    return np.array(out)


def time_backward(jax, jnp, np, flash_mha, q, k, v, shape, causal, args):
    """(median ms, min ms, max ms, reps, rel_err, max_err) of FlashAttention-3's backward on one configuration:
    per rep, a jitted chain of --chain forwards and one of --chain forward + backward calls (jax.vjp), each timed
    on the host; the sample is their difference per call. rel_err, max_err: sampled rows of dQ against float64."""
    batch, q_len, _, q_heads, _, head_dim = shape
    d_o = jax.random.uniform(jax.random.PRNGKey(args.seed + 2), (batch, q_len, q_heads, head_dim), jnp.float32,
                             -1.0, 1.0).astype(q.dtype)

    def attention(q, k, v):
        return flash_mha(q, k, v, is_causal=causal)

    # Accuracy of one backward call on sampled rows of dQ.
    _, vjp = jax.vjp(attention, q, k, v)
    dq = np.asarray(vjp(d_o)[0].astype(jnp.float32), dtype=np.float64)
    qd, kd, vd, dod = (np.asarray(x.astype(jnp.float32), dtype=np.float64) for x in (q, k, v, d_o))
    rng = np.random.default_rng(args.seed + 1)
    rows = [(int(rng.integers(batch)), int(rng.integers(q_len)), int(rng.integers(q_heads)))
            for _ in range(args.sample_rows)]
    got = np.array([dq[b, i, h] for b, i, h in rows])
    want = reference_dq_rows(np, qd, kd, vd, dod, causal, rows)
    rel_err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    max_err = float(np.abs(got - want).max())

    @jax.jit
    def forwards(q0, k, v):
        return jax.lax.fori_loop(0, args.chain, lambda _, x: attention(x, k, v), q0)

    @jax.jit
    def forwards_backwards(q0, k0, v0, d_o):
        def step(_, qkv):  # this call's dQ, dK, dV are the next call's Q, K, V (the work does not depend on them)
            return jax.vjp(attention, *qkv)[1](d_o)

        return jax.lax.fori_loop(0, args.chain, step, (q0, k0, v0))

    for _ in range(args.warmup):
        forwards(q, k, v).block_until_ready()
        jax.block_until_ready(forwards_backwards(q, k, v, d_o))
    samples = []
    for _ in range(args.reps):
        start = time.perf_counter()
        forwards(q, k, v).block_until_ready()
        middle = time.perf_counter()
        jax.block_until_ready(forwards_backwards(q, k, v, d_o))
        end = time.perf_counter()
        samples.append(((end - middle) - (middle - start)) * 1e3 / args.chain)
    return statistics.median(samples), min(samples), max(samples), len(samples), rel_err, max_err


def main(argv=None) -> int:
    """Run every shape x dtype x causal (x pass), print one line each, append rows to the CSV."""
    args = parse_args(argv)
    plan = [(shape, dtype, causal == "yes") for shape in args.shapes for dtype in args.dtypes.split(",")
            for causal in args.causal.split(",")]
    passes = PASSES[args.passes]
    if args.dry_run:
        print(",".join(COLUMNS))
        for shape, dtype, causal in plan:
            for pass_ in passes:
                how = "forward + backward minus forward, " if pass_ == "backward" else ""
                print(f"would time fa3 {pass_:<8} {dtype} B,Nq,Nkv,Hq,Hkv,d = {','.join(map(str, shape))} "
                      f"causal={'yes' if causal else 'no'}: {how}chains of {args.chain}, {args.warmup} warm-ups, "
                      f"median of {args.reps}")
        return 0

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave the GPU's memory to others
    try:  # only here: --help and --dry-run work without JAX
        import jax
        import jax.numpy as jnp
        import numpy as np
        from flash_attn3_jax import flash_mha
    except ImportError as error:
        sys.exit(f"fa3_peer.py needs JAX and the flash-attn3-jax wheel (see --help): {error}")
    gpu = jax.devices()[0].device_kind
    if jax.devices()[0].platform != "gpu":
        sys.exit("no GPU visible to JAX: fa3_peer.py times GPU kernels")
    print(f"{gpu}, jax {jax.__version__}; appending to {args.csv}")
    dtypes = {"f16": jnp.float16, "bf16": jnp.bfloat16}
    suite_of = {shape: name for name, shape in SUITES.items()}
    suite_of.update({shape: "backward" for shape in BACKWARD_SHAPES})  # fa-bench --suite backward's

    with open_csv(args.csv) as f:
        writer = csv.writer(f, lineterminator="\n")
        for shape, dtype, causal in plan:
            batch, q_len, kv_len, q_heads, kv_heads, head_dim = shape
            keys = jax.random.split(jax.random.PRNGKey(args.seed), 3)
            # Uniform in [-1, 1), drawn in float32 and rounded to dtype like fa-bench's inputs; [B, N, H, d].
            q, k, v = (jax.random.uniform(key, (batch, n, heads, head_dim), jnp.float32, -1.0, 1.0).astype(dtypes[dtype])
                       for key, n, heads in zip(keys, (q_len, kv_len, kv_len), (q_heads, kv_heads, kv_heads)))

            if "forward" in passes:
                # Accuracy of one call on sampled rows (b, i, h) against float64.
                out = np.asarray(flash_mha(q, k, v, is_causal=causal).astype(jnp.float32), dtype=np.float64)
                qd, kd, vd = (np.asarray(x.astype(jnp.float32), dtype=np.float64) for x in (q, k, v))
                rng = np.random.default_rng(args.seed + 1)
                got, want = [], []
                for _ in range(args.sample_rows):
                    b, i, h = int(rng.integers(batch)), int(rng.integers(q_len)), int(rng.integers(q_heads))
                    kv_h = h // (q_heads // kv_heads)
                    scores = kd[b, :, kv_h] @ qd[b, i, h] / np.sqrt(head_dim)
                    if causal:
                        scores[i + 1:] = -np.inf
                    p = np.exp(scores - scores.max())
                    want.append(p @ vd[b, :, kv_h] / p.sum())
                    got.append(out[b, i, h])
                got, want = np.array(got), np.array(want)
                rel_err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                max_err = float(np.abs(got - want).max())

                @jax.jit
                def chain(q0, k, v):
                    return jax.lax.fori_loop(0, args.chain, lambda _, x: flash_mha(x, k, v, is_causal=causal),
                                             q0)

                for _ in range(args.warmup):
                    chain(q, k, v).block_until_ready()
                samples = []
                for _ in range(args.reps):
                    start = time.perf_counter()
                    chain(q, k, v).block_until_ready()
                    samples.append((time.perf_counter() - start) * 1e3 / args.chain)
                ms = statistics.median(samples)
                tflops = flops(shape, causal) / (ms * 1e9)
                writer.writerow(peer_row("fa3", dtype, shape, causal, suite_of.get(shape, "custom"), gpu, ms,
                                         min(samples), max(samples), len(samples), 0, rel_err, max_err))
                f.flush()
                print(f"fa3 {dtype} {','.join(map(str, shape))} causal={'yes' if causal else 'no'}: {ms:.4g} ms "
                      f"(min {min(samples):.4g}, max {max(samples):.4g}), {tflops:.3g} TFLOPS, rel err {rel_err:.2e}")

            if "backward" in passes:
                ms, ms_min, ms_max, reps, rel_err, max_err = time_backward(jax, jnp, np, flash_mha, q, k, v, shape,
                                                                           causal, args)
                tflops = flops(shape, causal, "backward") / (ms * 1e9)
                writer.writerow(peer_row("fa3", dtype, shape, causal, suite_of.get(shape, "custom"), gpu, ms, ms_min,
                                         ms_max, reps, 0, rel_err, max_err, "backward"))
                f.flush()
                print(f"fa3 backward {dtype} {','.join(map(str, shape))} causal={'yes' if causal else 'no'}: "
                      f"{ms:.4g} ms (min {ms_min:.4g}, max {ms_max:.4g}), {tflops:.3g} TFLOPS, "
                      f"dQ rel err {rel_err:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
