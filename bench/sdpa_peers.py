#!/usr/bin/env python3
"""Time PyTorch's scaled_dot_product_attention backends, and FlashAttention-4, as peers of the course's steps.

Run on the GPU machine, where torch is installed:

    python3 bench/sdpa_peers.py --csv docs/results/h100-DATE-sdpa.csv
    python3 bench/sdpa_peers.py --pass backward --suites backward --backends flash,cudnn --csv out/bwd.csv
    python3 bench/sdpa_peers.py --dry-run          # the plan, without torch

For every shape x dtype x causal x backend (math, efficient, flash, cudnn,
selected with torch.nn.attention.sdpa_kernel) it takes the median of --reps
CUDA-event-timed calls after --warmup calls, the extra memory (peak bytes
allocated by one call beyond the inputs and the output), and the relative L2
error of --sample-rows random output rows (b, i, h) against a float64
computation, and APPENDS one row per measurement to the CSV with fa-bench's
columns (step = sdpa-math, sdpa-efficient, sdpa-flash, sdpa-cudnn; variant
empty), so tools/plots.py draws them next to the steps as peers. A backend
that refuses a configuration ("No available kernel") is skipped with the
reason printed. Inputs are uniform in [-1, 1) like fa-bench's; the scale is
1/sqrt(d) and causal masking is top-left aligned (SDPA's is_causal), as in
the course.

--pass backward (or both) times the backward of the flash and cuDNN backends:
torch.autograd.grad(out, (q, k, v), dO, retain_graph=True) on out = SDPA(q, k, v)
made once, dO uniform in [-1, 1), with CUDA events around each call, after
--warmup calls; the calls rotate through enough copies of (q, k, v, out, dO) to
overflow the L2 cache three times over, as fa-bench's do. Rows get pass =
backward and TFLOPS = 2.5 x the forward's count / t (AttentionProblem::flops);
extra_bytes is the peak allocated by one backward call beyond the gradients it
returns, and rel_err / max_err those of --sample-rows sampled rows of dQ against
float64 (dK and dV are not checked: their rows need every query row).

--backends fa4 times FlashAttention-4 (PyPI `flash-attn-4`, `flash_attn.cute.flash_attn_func`, CuTe DSL) the
same way, forward and backward, on the course's [B, N, H, d] tensors themselves (rows with step = fa4). It is
not part of the default; on a machine without network its wheels travel and are installed into a folder
(`pip install --no-index --no-deps --target DIR`), which --site DIR (or $FA_PEER_SITE) hands to
site.addsitedir before the import, so that the folder's .pth files put `cutlass` on the path. FA4 compiles
each configuration on its first call (seconds); the warm-up calls take that, and
FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 keeps the compiled kernels on disk for the next process. Its causal
mask is aligned bottom-right, the course's top-left: they agree when Nq = Nkv, and fa4 skips other causal
shapes; it takes f16 and bf16.

--pass decode times the forward on decode shapes (--suites decode, or --shape B,Nq,Nkv,Hq,Hkv,d with Nq new tokens
a sequence over a cache of Nkv keys), rows with pass decode and the effective K/V bandwidth (gbps), as fa-bench
--decode writes them. There the causal mask is aligned bottom-right (new token i sees keys j <= Nkv - Nq + i, the
course's decode steps' and FlashAttention's), timed when Nq > 1: SDPA gets it as
torch.nn.attention.bias.causal_lower_right, which a backend may refuse (the row is then skipped with its reason).
Each call reads the next of enough copies of the cache to leave the L2 cache (3 x its size, 1 to 8), as fa-bench's
do. --page-size N puts K and V in a paged cache for FlashAttention-4 (flash_attn_varlen_func with page_table and
seqused_k): pages of N tokens, [pages, N, Hkv, d], each sequence's pages in a shuffled order (fa-bench --page-size
does the same); the suite column says decode-pages<N>, and SDPA's backends, which take no pages, are skipped.
"""
from __future__ import annotations

import argparse
import bisect
import contextlib
import csv
import math
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
from plots import COLUMNS  # noqa: E402  fa-bench's CSV header, written down once in tools/plots.py

#: fa-bench's suites: name -> (batch, q_len, kv_len, q_heads, kv_heads, head_dim).
SUITES = {
    "teaching": (4, 1024, 1024, 8, 8, 64),
    "headline": (4, 4096, 4096, 16, 16, 64),
}
#: fa-bench's backward suite beyond the teaching shape (suite column "backward"): the tensor-core shapes.
BACKWARD_SHAPES = ((4, 4096, 4096, 16, 16, 64), (4, 4096, 4096, 16, 16, 128), (1, 16384, 16384, 16, 16, 128))
#: The backends whose backward is timed (the backward table's peers).
BACKWARD_BACKENDS = ("flash", "cudnn", "fa4")
#: fa-bench's decode suite (suite column "decode"): one query per sequence over a long KV cache, GQA.
DECODE_SHAPES = ((8, 1, 8192, 32, 8, 128), (1, 1, 131072, 32, 8, 128), (64, 1, 2048, 32, 8, 128),
                 (8, 1, 8192, 16, 16, 64))
#: What --pass takes, and the passes each value times (fa3_peer.py takes these too).
PASSES = {"forward": ("forward",), "backward": ("backward",), "both": ("forward", "backward")}
#: This script's --pass also takes decode: the forward on the decode suite's shapes, without the mask, its rows
#: with pass "decode" and the effective K/V bandwidth (gbps), as fa-bench writes them.
PEER_PASSES = {**PASSES, "decode": ("decode",)}
#: Backend name in the CSV's step column -> name of the torch.nn.attention.SDPBackend member.
BACKENDS = {
    "math": "MATH",
    "efficient": "EFFICIENT_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
}
#: Peers that are libraries of their own, not SDPA backends: name in --backends (and the CSV's step column) ->
#: what the import needs. Not in --backends' default.
LIBRARIES = {"fa4": "flash_attn.cute (PyPI flash-attn-4)"}


def parse_args(argv=None):
    """Command-line options; see --help."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suites", default="teaching,headline",
                        help="comma-separated: " + ", ".join(SUITES) + ", backward (fa-bench's backward shapes: "
                        "B=4 N=4096 H=16 d=64 and 128, B=1 N=16384 H=16 d=128) (default teaching,headline)")
    parser.add_argument("--shape", action="append", default=[],
                        help="B,Nq,Nkv,Hq,Hkv,d instead of the suites (repeatable, or several separated by spaces); suite "
                             "column 'custom' ('decode' with --pass decode)")
    parser.add_argument("--dtypes", default="f32,f16,bf16", help="comma-separated: f32, f16, bf16 (default all)")
    parser.add_argument("--causal", default="no,yes", help="comma-separated: no, yes (default both)")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated: " + ", ".join((*BACKENDS, *LIBRARIES)) + " (default: "
                        + ", ".join(BACKENDS) + ")")
    parser.add_argument("--site", action="append", default=[],
                        help="a folder given to site.addsitedir before importing a library peer (fa4), e.g. "
                             "where its wheels were installed with pip --target (repeatable; default "
                             "$FA_PEER_SITE)")
    parser.add_argument("--pass", dest="passes", default="forward", choices=tuple(PEER_PASSES),
                        help="forward (default), backward (" + ", ".join(BACKWARD_BACKENDS) + " only), both, or "
                             "decode (the forward without the mask, rows with pass decode and gbps; with --suites "
                             "decode)")
    parser.add_argument("--page-size", type=int, default=0,
                        help="--pass decode: K and V in a paged cache of pages of N tokens (fa4 only; default 0: "
                             "contiguous)")
    parser.add_argument("--window", default="",
                        help="LEFT,RIGHT: a sliding window, FlashAttention's window_size (-1: an open side); fa4 "
                             "only (SDPA takes none), with Nq = Nkv (FlashAttention aligns it bottom-right, the course "
                             "top-left); the suite column says <suite>-window<LEFT>_<RIGHT>, as fa-bench's")
    parser.add_argument("--softcap", default="",
                        help="C: logit soft-capping at C; fa4 only; the suite column says <suite>-softcap<C>")
    parser.add_argument("--sinks", action="store_true",
                        help="attention sinks, one logit a query head drawn uniform in [-2, 2) (FlashAttention-4's "
                             "learnable_sink); fa4 only; the suite column says <suite>-sinks. With any of these "
                             "three the backward's dQ is timed, not checked (its rel_err is nan)")
    parser.add_argument("--varlen", default="",
                        help="L1,L2,...: packed variable lengths (FlashAttention's varlen), the pack's sequences, "
                             "each Li query rows and keys, as fa-bench --varlen: they replace every shape's B, Nq and "
                             "Nkv (the count, the longest); fa4 only (flash_attn_varlen_func); the suite column says "
                             "<suite>-varlen<count>_<total>; the backward's dQ is timed, not checked")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    parser.add_argument("--reps", type=int, default=15, help="timed calls, median reported (default 15, at least 15)")
    parser.add_argument("--sample-rows", type=int, default=64, help="output rows checked in float64 (default 64)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--csv", help="CSV to append to (header written if the file is new or empty)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the CSV header; needs no torch")
    args = parser.parse_args(argv)
    if args.reps < 15:
        parser.error("--reps must be at least 15")
    if not args.dry_run and not args.csv:
        parser.error("--csv is required (or --dry-run)")
    for name, allowed in (("dtypes", ("f32", "f16", "bf16")), ("causal", ("no", "yes")),
                          ("backends", (*BACKENDS, *LIBRARIES))):
        for value in getattr(args, name).split(","):
            if value not in allowed:
                parser.error(f"--{name}: unknown value '{value}', expected {', '.join(allowed)}")
    if args.page_size < 0 or (args.page_size and args.passes != "decode"):
        parser.error("--page-size: a number of tokens, 1 or more, with --pass decode (the decode steps' paged cache)")
    window = None
    if args.window:
        try:
            window = tuple(int(side) for side in args.window.split(","))
        except ValueError:
            window = ()
        if len(window) != 2 or min(window) < -1:
            parser.error(f"--window {args.window}: expected LEFT,RIGHT, two whole numbers of keys, -1 for an open side")
    softcap = 0.0
    if args.softcap:
        try:
            softcap = float(args.softcap)
        except ValueError:
            softcap = -1.0
        if not (softcap > 0 and math.isfinite(softcap)):
            parser.error(f"--softcap {args.softcap}: expected a cap C > 0")
    lengths = None
    if args.varlen:
        try:
            lengths = tuple(int(n) for n in args.varlen.split(","))
        except ValueError:
            lengths = (-1,)
        if min(lengths) < 0 or sum(lengths) == 0:
            parser.error(f"--varlen {args.varlen}: expected the pack's lengths, whole numbers >= 0 separated by commas, "
                         "at least one above 0")
    args.features = Features(window, softcap, args.softcap, args.sinks, lengths)
    if args.features.any() and args.passes == "decode":
        parser.error("--window, --softcap, --sinks and --varlen are not taken with --pass decode")
    if not args.site and os.environ.get("FA_PEER_SITE"):
        args.site = os.environ["FA_PEER_SITE"].split(os.pathsep)
    return args


class Features:
    """The model features of a run (issue 58): a window (LEFT, RIGHT) or None, a soft-cap (0: none) and the text it
    was given as (for the suite column, as fa-bench writes it), whether each head has a sink, and a pack's lengths
    (packed variable lengths) or None."""

    def __init__(self, window=None, softcap=0.0, softcap_text="", sinks=False, lengths=None):
        self.window, self.softcap, self.softcap_text, self.sinks = window, softcap, softcap_text, sinks
        self.lengths = lengths

    def offsets(self) -> list:
        """The pack's cu_seqlens: 0, then where each sequence ends."""
        out = [0]
        for n in self.lengths:
            out.append(out[-1] + n)
        return out

    def windowed(self, causal: bool) -> bool:
        """Whether the window bounds some row (AttentionProblem::windowed)."""
        return self.window is not None and (self.window[0] >= 0 or (self.window[1] >= 0 and not causal))

    def any(self) -> bool:
        return self.window is not None or self.softcap > 0 or self.sinks or self.lengths is not None

    def suffix(self) -> str:
        """What fa-bench appends to the suite column for the same options."""
        return ((f"-window{self.window[0]}_{self.window[1]}" if self.window is not None else "")
                + (f"-softcap{self.softcap_text}" if self.softcap > 0 else "") + ("-sinks" if self.sinks else "")
                + (f"-varlen{len(self.lengths)}_{sum(self.lengths)}" if self.lengths is not None else ""))


NO_FEATURES = Features()


def key_range(i: int, q_len: int, kv_len: int, causal: bool, window=None, bottom_right: bool = False):
    """The keys [first, last) query row i sees: keys_range_in of common/fa/problem.hpp, the one rule."""
    left, right = window if window is not None else (-1, -1)
    diagonal = kv_len - q_len + i if bottom_right else i
    last = min(max(diagonal + 1, 0), kv_len) if causal else kv_len
    if not causal and right >= 0:
        last = min(diagonal + right + 1, last)
    first = diagonal - left if left >= 0 and diagonal - left > 0 else 0
    last = max(last, 0)
    return min(first, last), last


def plan(args):
    """The measurements to take: list of (suite, shape tuple, dtype, causal bool, backend, pass), the forward
    and the backward of one configuration next to each other; the backward for BACKWARD_BACKENDS only."""
    if args.shape:
        shapes = []
        for text in (item for arg in args.shape for item in arg.split()):  # several in one argument: spaces
            values = tuple(int(v) for v in text.split(","))
            if len(values) != 6 or min(values) < 1 or values[3] % values[4]:
                sys.exit(f"--shape {text}: expected six positive sizes B,Nq,Nkv,Hq,Hkv,d with Hkv dividing Hq")
            shapes.append(("decode" if args.passes == "decode" else "custom", values))
    else:
        shapes = []
        for suite in args.suites.split(","):
            if suite == "backward":
                shapes += [(suite, shape) for shape in BACKWARD_SHAPES]
            elif suite == "decode":
                shapes += [(suite, shape) for shape in DECODE_SHAPES]
            elif suite in SUITES:
                shapes.append((suite, SUITES[suite]))
            else:
                sys.exit(f"--suites: unknown suite '{suite}', expected {', '.join(SUITES)}, backward, decode")
    if args.page_size:
        for suite, shape in shapes:
            if shape[2] % args.page_size:
                sys.exit(f"--page-size {args.page_size} does not divide Nkv = {shape[2]} of the {suite} shape "
                         f"{','.join(map(str, shape))} (a paged cache holds whole pages)")
        shapes = [(f"{suite}-pages{args.page_size}", shape) for suite, shape in shapes]
    features = getattr(args, "features", NO_FEATURES)
    if features.lengths is not None:  # the pack's count and longest length replace B, Nq and Nkv
        longest = max(features.lengths)
        shapes = [(suite, (len(features.lengths), longest, longest, *shape[3:])) for suite, shape in shapes]
    shapes = [(suite + features.suffix(), shape) for suite, shape in shapes]
    return [(suite, shape, dtype, causal == "yes", backend, pass_)
            for suite, shape in shapes
            for dtype in args.dtypes.split(",")
            for causal in args.causal.split(",")
            for backend in args.backends.split(",")
            for pass_ in PEER_PASSES[args.passes]
            # a decode shape's mask is aligned bottom-right: with one new token it is no mask at all
            if (pass_ != "backward" or backend in BACKWARD_BACKENDS)
            and not (pass_ == "decode" and causal == "yes" and shape[1] == 1)]


def flops(shape, causal: bool, pass_: str = "forward", features: Features = NO_FEATURES) -> float:
    """4·B·Hq·Nq·Nkv·d, halved when causal, and 2.5 times that for the backward: the same count as fa-bench
    (AttentionProblem::flops(Pass)); with a window, 4·B·Hq·d times the (row, key) pairs it leaves."""
    batch, q_len, kv_len, q_heads, _, head_dim = shape
    if features.lengths is not None:  # a pack: each sequence alone, its rows over its own keys
        pairs = 0
        for n in features.lengths:
            if features.windowed(causal):
                pairs += sum(last - first for first, last in (key_range(i, n, n, causal, features.window)
                                                              for i in range(n)))
            else:
                pairs += n * n / 2 if causal else n * n
        forward = 4.0 * q_heads * pairs * head_dim
        return 2.5 * forward if pass_ == "backward" else forward
    if features.windowed(causal):
        pairs = sum(last - first for first, last in (key_range(i, q_len, kv_len, causal, features.window)
                                                      for i in range(q_len)))
        forward = 4.0 * batch * q_heads * pairs * head_dim
    else:
        full = 4.0 * batch * q_heads * q_len * kv_len * head_dim
        forward = full / 2 if causal else full
    return 2.5 * forward if pass_ == "backward" else forward


def fmt(value) -> str:
    """A number the way fa-bench's C++ stream writes it (6 significant digits, nan)."""
    if isinstance(value, int):
        return str(value)
    return "nan" if value is None or math.isnan(value) else f"{value:.6g}"


def kv_gbps(shape, dtype: str, ms: float) -> float:
    """The bytes of K and V, read once, over the time, in GB/s (fa-bench's gbps: AttentionProblem::kv_bytes)."""
    batch, _, kv_len, _, kv_heads, head_dim = shape
    return 2.0 * batch * kv_len * kv_heads * head_dim * (4 if dtype == "f32" else 2) / (ms * 1e6)


def step_name(backend: str) -> str:
    """The CSV's step column for a backend: sdpa-flash, sdpa-cudnn, ... for SDPA's, the library's own name (fa4)."""
    return backend if backend in LIBRARIES else f"sdpa-{backend}"


def refusal(backend: str, shape, dtype: str, causal: bool, pass_: str = "forward", page_size: int = 0,
            features: Features = NO_FEATURES):
    """Why a peer does not take a configuration (None when it does): checked before any call."""
    if backend != "fa4":
        if features.any():
            return "SDPA takes no sliding window, soft-cap, sinks or packed lengths"
        return "SDPA takes no paged cache" if page_size else None
    if features.window is not None and shape[1] != shape[2]:
        return "FlashAttention-4 aligns the window bottom-right, the course top-left; they agree only when Nq = Nkv"
    if dtype == "f32":
        return "FlashAttention-4 takes f16 and bf16"
    if causal and shape[1] != shape[2] and pass_ != "decode":
        return "FlashAttention-4 aligns the causal mask bottom-right, the course top-left; they agree only when Nq = Nkv"
    return None


def peer_row(step, dtype, shape, causal, suite, gpu, ms, ms_min, ms_max, reps, extra, rel_err, max_err,
             pass_="forward", features: Features = NO_FEATURES) -> list:
    """One peer measurement as a row of fa-bench's CSV (speedup columns nan: a peer has no step before it;
    gbps only for the decode pass)."""
    batch, q_len, kv_len, q_heads, kv_heads, head_dim = shape
    return [step, "", dtype, batch, q_len, kv_len, q_heads, kv_heads, head_dim, int(causal), fmt(ms),
            fmt(flops(shape, causal, pass_, features) / (ms * 1e9)), extra, fmt(rel_err), gpu, suite, fmt(ms_min),
            fmt(ms_max),
            reps, "nan", "nan", "nan", fmt(max_err), pass_,
            fmt(kv_gbps(shape, dtype, ms)) if pass_ == "decode" else "nan"]


def open_csv(path: str):
    """Open the CSV for appending; write the header if new, refuse a file with another header."""
    exists = os.path.exists(path) and os.path.getsize(path) > 0
    if exists:
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        if header != COLUMNS:
            sys.exit(f"{path}: its header is not fa-bench's ({','.join(COLUMNS)}); refusing to append")
    f = open(path, "a", newline="")
    if not exists:
        f.write(",".join(COLUMNS) + "\n")
    return f


class Inputs:
    """Q, K, V of one shape and dtype in the course's layout [B, N, H, d]."""

    def __init__(self, torch, shape, dtype, seed, sinks: bool = False, total=None):
        batch, q_len, kv_len, q_heads, kv_heads, head_dim = shape
        if total is not None:  # a pack: one sequence of every row, [1, total, H, d]
            batch, q_len, kv_len = 1, total, total
        generator = torch.Generator(device="cuda").manual_seed(seed)

        def uniform(*size):
            # Uniform in [-1, 1), drawn in float32 and rounded to dtype like fa-bench's inputs.
            return (torch.rand(*size, device="cuda", generator=generator) * 2 - 1).to(dtype)

        self.q = uniform(batch, q_len, q_heads, head_dim)
        self.k = uniform(batch, kv_len, kv_heads, head_dim)
        self.v = uniform(batch, kv_len, kv_heads, head_dim)
        self.gqa = q_heads != kv_heads
        # The sinks' logits, float32 [Hq], uniform in [-2, 2) (as the course's random_inputs draws them).
        self.sinks = (torch.rand(q_heads, device="cuda", generator=generator) * 4 - 2) if sinks else None


class DecodeCache:
    """One copy of a decode shape's K/V cache: contiguous ([B, Nkv, Hkv, d], k and v), or paged: pages of page_size
    tokens ([pages, page_size, Hkv, d]), sequence b's page p at page_table[b, p], the pages in a shuffled order, and
    every sequence's length in lens (FlashAttention's seqused_k)."""

    def __init__(self, torch, inputs: Inputs, page_size: int, seed: int):
        self.page_table = self.lens = None
        if not page_size:
            self.k, self.v = inputs.k.clone(), inputs.v.clone()
            return
        batch, kv_len, kv_heads, head_dim = inputs.k.shape
        pages = batch * (kv_len // page_size)
        # Logical page n (sequence n // (Nkv / page_size)) is stored at physical page order[n].
        order = torch.randperm(pages, generator=torch.Generator().manual_seed(seed)).to("cuda")
        self.k, self.v = (torch.empty(pages, page_size, kv_heads, head_dim, dtype=x.dtype, device="cuda")
                          for x in (inputs.k, inputs.v))
        self.k[order] = inputs.k.reshape(pages, page_size, kv_heads, head_dim)
        self.v[order] = inputs.v.reshape(pages, page_size, kv_heads, head_dim)
        self.page_table = order.reshape(batch, kv_len // page_size).to(torch.int32)
        self.lens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")

    def bytes(self) -> int:
        return sum(x.numel() * x.element_size() for x in (self.k, self.v))


def decode_call(torch, backend: str, q, cache: DecodeCache, causal: bool, gqa: bool):
    """A call with no arguments that attends q ([B, Nq, Hq, d]) over one copy of the cache, the mask (when causal)
    aligned bottom-right; returns O [B, Nq, Hq, d]. Call it inside the backend's sdpa_kernel context."""
    if backend == "fa4":
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func  # imported in main() first

        if cache.page_table is None:
            return lambda: flash_attn_func(q, cache.k, cache.v, causal=causal)[0]
        return lambda: flash_attn_varlen_func(q, cache.k, cache.v, page_table=cache.page_table,
                                              seqused_k=cache.lens, causal=causal)[0]
    import torch.nn.functional as F

    kwargs = {"enable_gqa": True} if gqa else {}
    if causal:
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(q.shape[1], cache.k.shape[1])
    k, v = cache.k.transpose(1, 2), cache.v.transpose(1, 2)
    return lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k, v, **kwargs).transpose(1, 2)


def measure_decode(torch, backend: str, inputs: Inputs, shape, causal: bool, args):
    """(median ms, min ms, max ms, reps, extra bytes, rel_err, max_err) of one peer on one decode configuration:
    each call on the next of enough copies of the cache to leave the L2 cache (3 x its size, 1 to 8, as fa-bench),
    contiguous or paged (--page-size). rel_err and max_err: sampled rows against float64, bottom-right mask.

    Raises RuntimeError when the selected backend has no kernel for it."""
    caches = [DecodeCache(torch, inputs, args.page_size, args.seed)]
    copies = max(1, min(8, -(-3 * l2_cache_bytes(torch) // caches[0].bytes())))
    caches += [DecodeCache(torch, inputs, args.page_size, args.seed + n) for n in range(1, copies)]
    calls = [decode_call(torch, backend, inputs.q, cache, causal, inputs.gqa) for cache in caches]

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = calls[0]()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before - out.numel() * out.element_size()

    rows = sampled_rows(torch, shape, args)
    got = torch.stack([out[b, i, h].double() for b, i, h in rows])
    rel_err, max_err = errors(torch, got, reference_rows(torch, inputs, shape, causal, rows, bottom_right=True))
    del out
    return (*event_times(torch, lambda n: calls[n % len(calls)](), args), max(0, extra), rel_err, max_err)


def reference_rows(torch, inputs: Inputs, shape, causal: bool, rows, bottom_right: bool = False,
                   features: Features = NO_FEATURES):
    """float64 attention output of the sampled rows (b, i, h): tensor [len(rows), d]; the causal mask top-left, or
    bottom-right (a decode shape's: new token i sees keys j <= Nkv - Nq + i); the features' window (top-left),
    soft-cap and sinks as the course's reference applies them."""
    head_dim = shape[5]
    group = shape[3] // shape[4]
    offsets = features.offsets() if features.lengths is not None else None
    out = []
    for b, i, h in rows:
        q = inputs.q[b, i, h].double()
        k = inputs.k[b, :, h // group].double()
        v = inputs.v[b, :, h // group].double()
        q_len, kv_len = shape[1], shape[2]
        if offsets is not None:  # a pack's row i: row i - start of its sequence, over that sequence's keys alone
            seq = bisect.bisect_right(offsets, i) - 1
            start, q_len = offsets[seq], offsets[seq + 1] - offsets[seq]
            k, v, i, kv_len = k[start:start + q_len], v[start:start + q_len], i - start, q_len
        scores = (k @ q) / math.sqrt(head_dim)
        if features.softcap > 0:
            scores = features.softcap * torch.tanh(scores / features.softcap)
        first, last = key_range(i, q_len, kv_len, causal, features.window, bottom_right)
        scores[:first] = -math.inf
        scores[last:] = -math.inf
        if features.sinks:  # one more logit in the softmax, with no value
            sink = inputs.sinks[h].double().reshape(1)
            out.append(torch.softmax(torch.cat([scores, sink]), dim=0)[:-1] @ v)
        elif last > first:
            out.append(torch.softmax(scores, dim=0) @ v)
        else:  # a row that sees no key: O = 0
            out.append(torch.zeros(head_dim, dtype=torch.float64, device=q.device))
    return torch.stack(out)


def reference_dq_rows(torch, inputs: Inputs, d_o, shape, causal: bool, rows):
    """float64 dQ of the sampled rows (b, i, h) of out = attention(Q, K, V) given dO ([B, N, H, d]):
    tensor [len(rows), d]. dQ_i = scale sum_j P_ij (dP_ij - D_i) K_j with dP_ij = dO_i . V_j, D_i = dO_i . O_i."""
    head_dim = shape[5]
    group = shape[3] // shape[4]
    scale = 1 / math.sqrt(head_dim)
    out = []
    for b, i, h in rows:
        q = inputs.q[b, i, h].double()
        k = inputs.k[b, :, h // group].double()
        v = inputs.v[b, :, h // group].double()
        scores = (k @ q) * scale
        if causal:
            scores[i + 1:] = -math.inf  # top-left aligned: query i sees keys j <= i
        p = torch.softmax(scores, dim=0)
        do = d_o[b, i, h].double()
        d_p = v @ do
        d_s = p * (d_p - do @ (p @ v))
        out.append(scale * (d_s @ k))
    return torch.stack(out)


def l2_cache_bytes(torch) -> int:
    """The GPU's L2 cache size (50 MiB, an H100's, when this torch does not say)."""
    return int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
               or 50 * 2**20)


def sampled_rows(torch, shape, args):
    """args.sample_rows random (b, i, h) rows of a [B, N, H, d] problem, the same for every backend."""
    batch, q_len, _, q_heads, _, _ = shape
    generator = torch.Generator().manual_seed(args.seed + 1)
    return [(int(torch.randint(batch, (1,), generator=generator)), int(torch.randint(q_len, (1,), generator=generator)),
             int(torch.randint(q_heads, (1,), generator=generator))) for _ in range(args.sample_rows)]


def errors(torch, got, want):
    """(relative L2, max abs) error of sampled rows against float64; NaN for both when any is not finite."""
    rel_err = float(torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want))
    max_err = float((got - want).abs().max())
    return (rel_err, max_err) if math.isfinite(rel_err) else (math.nan, math.nan)


def event_times(torch, call, args):
    """(median, min, max, count) in ms of args.reps CUDA-event-timed calls call(n) after args.warmup untimed ones.

    As fa-bench times the steps: the timed calls are queued back to back, each between its own pair of events,
    behind a hold (torch.cuda._sleep) long enough for the host to queue them all, so the events bracket the GPU's
    work and not the host's (a backward through autograd spends a few hundred microseconds on the host), and the
    GPU runs the calls one after another, as in a training loop.
    """
    for n in range(args.warmup):
        call(n)
    torch.cuda.synchronize()
    queued = time.perf_counter()
    call(args.warmup)
    host_us = (time.perf_counter() - queued) * 1e6  # the host's time to queue one call, on an idle GPU
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.reps)]
    torch.cuda._sleep(int((1000 + 1.5 * args.reps * host_us) * 2000))  # _sleep counts cycles: ~2 a nanosecond
    for n, (start, stop) in enumerate(events):
        start.record()
        call(n)
        stop.record()
    torch.cuda.synchronize()
    times = [start.elapsed_time(stop) for start, stop in events]
    return statistics.median(times), min(times), max(times), len(times)


def attention_call(torch, backend: str, inputs: Inputs, causal: bool, features: Features = NO_FEATURES):
    """attend(q, k, v) -> out for one backend, all in the course's layout [B, N, H, d]: SDPA's backends get
    [B, H, N, d] views and give theirs back as views (no copies); FlashAttention-4 takes the layout itself.
    Call it inside the backend's sdpa_kernel context."""
    if backend == "fa4":
        from flash_attn.cute import flash_attn_func  # imported in main() first, with --site on the path

        if not features.any():
            return lambda q, k, v: flash_attn_func(q, k, v, causal=causal)[0]
        window = tuple(None if side < 0 else side for side in (features.window or (-1, -1)))
        if features.lengths is not None:  # the pack [1, total, H, d] as [total, H, d], and back
            from flash_attn.cute import flash_attn_varlen_func

            cu = torch.tensor(features.offsets(), dtype=torch.int32, device="cuda")
            longest = max(features.lengths)
            return lambda q, k, v: flash_attn_varlen_func(
                q[0], k[0], v[0], cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest,
                causal=causal, window_size=window, softcap=features.softcap, learnable_sink=inputs.sinks)[0].unsqueeze(0)
        return lambda q, k, v: flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=features.softcap,
                                               learnable_sink=inputs.sinks)[0]
    import torch.nn.functional as F

    kwargs = {"is_causal": causal}
    if inputs.gqa:
        kwargs["enable_gqa"] = True  # query head h reads KV head h // (Hq / Hkv), as in the course

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              **kwargs).transpose(1, 2)

    return attend


def measure_backward(torch, attend, inputs: Inputs, shape, causal: bool, args):
    """(median ms, min ms, max ms, reps, extra bytes, rel_err, max_err) of one backend's backward on one
    configuration: torch.autograd.grad(out, (q, k, v), dO, retain_graph=True) for out = attend(q, k, v), each call
    on the next of enough copies of (q, k, v, out, dO) to leave the L2 cache (3 x its size, 1 to 8 copies, as
    fa-bench). rel_err and max_err: sampled rows of dQ against float64.

    Raises RuntimeError when the selected backend has no kernel for it.
    """
    forward = attend  # [B, N, H, d] leaves in, out and the gradients in the same layout

    # One set first (a backend without a kernel raises here), then as many as leave the L2 cache.
    leaves = [x.detach().clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v)]
    out = forward(*leaves)
    generator = torch.Generator(device="cuda").manual_seed(args.seed + 2)
    d_o = torch.empty_like(out)  # out's strides (SDPA's kernels write [B, N, H, d] memory)
    d_o.copy_((torch.rand(out.shape, device="cuda", generator=generator) * 2 - 1).to(out.dtype))
    # What one call reads and writes: Q, K, V, O, dO (and LSE, small), and dQ, dK, dV shaped like Q, K, V.
    bytes_per_set = sum(x.numel() * x.element_size() for x in (*leaves, out, d_o, *leaves))
    copies = max(1, min(8, -(-3 * l2_cache_bytes(torch) // bytes_per_set)))
    sets = [(leaves, out, d_o)]
    for _ in range(copies - 1):
        more = [x.detach().clone().requires_grad_() for x in leaves]
        sets.append((more, forward(*more), d_o.clone()))

    def call(n):
        qkv, o, g = sets[n % len(sets)]
        return torch.autograd.grad(o, qkv, g, retain_graph=True)

    # Extra memory: peak allocated during one backward call beyond what was live before it and the gradients.
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    grads = call(0)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before - sum(g.numel() * g.element_size() for g in grads)

    # Accuracy of dQ on sampled rows; grads[0] is [B, N, H, d] ([1, total, H, d] for a pack).
    rows = sampled_rows(torch, tuple(grads[0].shape[:2]) + tuple(shape[2:]), args)
    got = torch.stack([grads[0][b, i, h].double() for b, i, h in rows])
    # The float64 dQ of a window, a cap or sinks is not written here: timed, not checked.
    if getattr(args, "features", NO_FEATURES).any():
        rel_err, max_err = math.nan, math.nan
    else:
        rel_err, max_err = errors(torch, got, reference_dq_rows(torch, inputs, d_o, shape, causal, rows))
    del grads
    return (*event_times(torch, call, args), max(0, extra), rel_err, max_err)


def measure(torch, attend, inputs: Inputs, shape, causal: bool, args):
    """(median ms, min ms, max ms, reps, extra bytes, rel_err, max_err) of one backend on one configuration.

    Raises RuntimeError when the selected backend has no kernel for it.
    """
    def call():
        return attend(inputs.q, inputs.k, inputs.v)

    # Extra memory: peak allocated during one call beyond what was live before it and the output it returns.
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = call()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before - out.numel() * out.element_size()

    # Accuracy on sampled rows; out is [B, N, H, d] ([1, total, H, d] for a pack).
    features = getattr(args, "features", NO_FEATURES)
    rows = sampled_rows(torch, tuple(out.shape[:2]) + tuple(shape[2:]), args)
    got = torch.stack([out[b, i, h].double() for b, i, h in rows])
    rel_err, max_err = errors(torch, got, reference_rows(torch, inputs, shape, causal, rows, features=features))
    del out
    return (*event_times(torch, lambda n: call(), args), max(0, extra), rel_err, max_err)


def main(argv=None) -> int:
    """Run the plan, print one line per measurement, append rows to the CSV."""
    args = parse_args(argv)
    measurements = plan(args)
    if args.passes != "forward":
        for backend in args.backends.split(","):
            if backend not in BACKWARD_BACKENDS:
                print(f"{step_name(backend)}: backward not timed (--pass backward times {', '.join(BACKWARD_BACKENDS)})")
    if args.dry_run:
        print(",".join(COLUMNS))
        for suite, shape, dtype, causal, backend, pass_ in measurements:
            why = refusal(backend, shape, dtype, causal, pass_, args.page_size, args.features)
            print(f"would {'skip' if why else 'time'} {step_name(backend):<14} {pass_:<8} {suite:<8} {dtype} B,Nq,Nkv,Hq,Hkv,d = "
                  f"{','.join(map(str, shape))} causal={'yes' if causal else 'no'}: {args.warmup} warm-ups, "
                  f"median of {args.reps}" + (f" ({why})" if why else ""))
        return 0

    try:  # only here: --help and --dry-run work without torch
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as error:
        sys.exit(f"sdpa_peers.py needs PyTorch with torch.nn.attention (2.3 or later): {error}")

    if not torch.cuda.is_available():
        sys.exit("no CUDA device: sdpa_peers.py times GPU kernels")
    if "fa4" in args.backends.split(","):
        import site

        for folder in args.site:
            site.addsitedir(folder)  # runs the folder's .pth files: the CuTe DSL's put cutlass on the path
        try:
            import flash_attn.cute  # noqa: F401  attention_call imports flash_attn_func from it
        except ImportError as error:
            sys.exit(f"--backends fa4 needs {LIBRARIES['fa4']} and its wheels (see --help; --site {args.site}): "
                     f"{error}")
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 means f32, as in the steps and the cuBLAS baseline
    torch.backends.cudnn.allow_tf32 = False
    gpu = torch.cuda.get_device_name()
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    print(f"{gpu}, torch {torch.__version__}; appending to {args.csv}")

    with open_csv(args.csv) as f:
        writer = csv.writer(f, lineterminator="\n")
        inputs_key, inputs = None, None
        for n, (suite, shape, dtype, causal, backend, pass_) in enumerate(measurements):
            if inputs_key != (shape, dtype):
                inputs = None
                torch.cuda.empty_cache()
                total = sum(args.features.lengths) if args.features.lengths is not None else None
                inputs = Inputs(torch, shape, dtypes[dtype], args.seed, args.features.sinks, total)
                inputs_key = (shape, dtype)
            what = (f"{step_name(backend):<14} {suite:<8} {dtype} {','.join(map(str, shape))} "
                    f"causal={'yes' if causal else 'no'}" + ("" if pass_ == "forward" else f" {pass_}"))
            timed = measure_backward if pass_ == "backward" else measure
            why = refusal(backend, shape, dtype, causal, pass_, args.page_size, args.features)
            if why:
                print(f"skip {what}: {why}")
                continue
            member = getattr(SDPBackend, BACKENDS[backend], None) if backend in BACKENDS else None
            if backend in BACKENDS and member is None:
                print(f"skip {what}: this torch has no SDPBackend.{BACKENDS[backend]}")
                continue
            try:
                with warnings.catch_warnings(record=True) as caught, \
                        (sdpa_kernel([member]) if member is not None else contextlib.nullcontext()):
                    warnings.simplefilter("always")
                    if pass_ == "decode":
                        ms, ms_min, ms_max, reps, extra, rel_err, max_err = measure_decode(torch, backend, inputs,
                                                                                          shape, causal, args)
                    else:
                        attend = attention_call(torch, backend, inputs, causal, args.features)
                        ms, ms_min, ms_max, reps, extra, rel_err, max_err = timed(torch, attend, inputs, shape,
                                                                                 causal, args)
            except Exception as error:  # noqa: BLE001  a library peer's refusals are its own exception types
                if backend in BACKENDS and not isinstance(error, (RuntimeError, torch.cuda.OutOfMemoryError)):
                    raise
                # torch explains a refusal in warnings ("... requires ..."), then raises "No available kernel".
                reasons = "; ".join(str(w.message).splitlines()[0] for w in caught)
                print(f"skip {what}: {str(error).splitlines()[0]}" + (f" ({reasons})" if reasons else ""))
                torch.cuda.empty_cache()
                continue
            tflops = flops(shape, causal, pass_, args.features) / (ms * 1e9)
            writer.writerow(peer_row(step_name(backend), dtype, shape, causal, suite, gpu, ms, ms_min, ms_max, reps,
                                     extra, rel_err, max_err, pass_, args.features))
            f.flush()
            print(f"{what}: {ms:.4g} ms (min {ms_min:.4g}, max {ms_max:.4g}), {tflops:.3g} TFLOPS, "
                  + (f"{kv_gbps(shape, dtype, ms):.1f} GB/s, " if pass_ == "decode" else "")
                  + f"extra {extra / 2**20:.1f} MiB, rel err {rel_err:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
