#!/usr/bin/env python3
"""The Python module refuses what the kit and fa-run refuse, with their messages, before any GPU work.

Runs without a GPU: the tensors are numpy arrays (host memory, through DLPack), so every call must stop at a
refusal; the shapes' messages are checked against fa-run's on the same tensors saved as .npy files.
Usage: test_module_refusals.py BUILD/python BUILD/bench/fa-run. Plain asserts, no pytest.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tests"))
FA_RUN = sys.argv[2]
import fa_course  # noqa: E402
from refusal import refusal  # noqa: E402


def fa_run_message(**tensors) -> str:
    """fa-run's message for a forward call of step 12 on these tensors, saved as .npy files."""
    with tempfile.TemporaryDirectory() as folder:
        paths = {}
        for name, array in tensors.items():
            paths[name] = os.path.join(folder, name + ".npy")
            np.save(paths[name], array)
        run = subprocess.run([FA_RUN, "--step", "12", "--q", paths["q"], "--k", paths["k"], "--v", paths["v"],
                              "--out", os.path.join(folder, "o.npy")], capture_output=True, text=True)
        assert run.returncode == 1, (run.returncode, run.stderr)
        return run.stderr.replace(folder + os.sep, "").strip()


f16 = np.float16
q = np.zeros((2, 8, 4, 64), f16)
k = v = np.zeros((2, 8, 2, 64), f16)
out = np.zeros_like(q)

# The registry's list, as fa-run --list shows it.
listed = {s["label"]: s for s in fa_course.steps()}
assert listed["01"]["pass"] == "forward" and "f32" in listed["01"]["dtypes"], listed["01"]
assert listed["27"]["pass"] == "backward", listed["27"]
assert listed["42"]["max_q_len"] == 8 and listed["42"]["kv_lens"] and not listed["01"]["kv_lens"], listed["42"]

# The step's name: a label names its step even where it is another's prefix ("11" and "11-f32").
assert "no step or baseline called 'zz'" in refusal(fa_course.forward, "zz", q, k, v, out)
assert refusal(fa_course.forward, "11", q, k, v, out).startswith("q: the tensor is not in CUDA device memory")
assert refusal(fa_course.forward, "27", q, k, v, out) == "step 27 is a backward step; call backward() with it"

# Shapes: fa-run's checks and words, the tensor named by its argument (fa-run: by its file).
cases = [
    dict(q=q[0], k=k, v=v),                                 # Q of 3 dimensions
    dict(q=q, k=k, v=np.zeros((2, 8, 2, 32), f16)),         # K and V of different shapes
    dict(q=q, k=np.zeros((3, 8, 2, 64), f16), v=np.zeros((3, 8, 2, 64), f16)),  # another batch
    dict(q=q, k=k.astype(np.float32), v=v.astype(np.float32)),                  # dtypes that differ
]
for case in cases:
    ours = refusal(fa_course.forward, "12", case["q"], case["k"], case["v"], out)
    theirs = fa_run_message(**case)
    for name in ("q", "k", "v"):
        theirs = theirs.replace(f"{name}.npy", name)
    theirs = theirs.removeprefix("fa-run: ").replace(" (f32, f16 or bf16 as float32 with --dtype bf16)", "")
    assert ours == theirs, (ours, theirs)

# What the step takes: the kit's words ("step NN: field = value is not supported; supported: ...").
assert refusal(fa_course.forward, "11", q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), out) == (
    "q: its element type (DLPack code 2, 64 bits) is not one the steps take: float32, float16 or bfloat16")
q96, k96 = np.zeros((2, 8, 4, 96), f16), np.zeros((2, 8, 2, 96), f16)
assert refusal(fa_course.forward, "11", q96, k96, k96, np.zeros_like(q96)) == (
    "step 11: head_dim = 96 is not supported; supported: 64, 128")
assert refusal(fa_course.forward, "09-br64", q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
               out) == "step 09-br64: dtype = f32 is not supported; supported: f16, bf16"
q9 = np.zeros((2, 9, 4, 64), f16)
assert refusal(fa_course.forward, "42", q9, k, v, np.zeros_like(q9)).startswith(
    "step 42: q_len = 9 is not supported; supported: 1 .. 8 new tokens per sequence"), "decode: too many new tokens"
assert refusal(fa_course.forward, "11", q, k, v, out, causal=True, causal_align="bottom-right").startswith(
    "step 11: causal_align = bottom-right is not supported; supported: top-left")
assert refusal(fa_course.forward, "11", np.zeros((2, 8, 3, 64), f16), k, v, out) == (
    "attention problem: q_heads = 3 is not a multiple of kv_heads = 2")
assert refusal(fa_course.forward, "11", q, k, v, out, causal_align="middle") == (
    "causal_align 'middle' is not one of: top-left, bottom-right")

# The KV cache's forms: what a step does not take, and lengths or a page table of the wrong kind.
lens = np.array([8, 3], np.int32)
assert refusal(fa_course.forward, "11", q, k, v, out, kv_lens=lens).startswith(
    "step 11: kv_lens = 2 per-sequence lengths is not supported; supported: one kv_len for every sequence")
assert refusal(fa_course.forward, "42", q[:, :1], k, v, out[:, :1], kv_lens=lens.astype(np.int64)) == (
    "kv_lens: must be int32 [2]; got [2] DLPack code 0, 64 bits")
pool = np.zeros((4, 4, 2, 64), f16)  # 4 pages of 4 tokens; two pages a sequence
table = np.array([[2, 0], [1, 3]], np.int32)
assert refusal(fa_course.forward, "44", q[:, :1], pool, pool, out[:, :1], page_table=table).startswith(
    "step 44: page_size = 4 is not supported")
assert refusal(fa_course.forward, "45", q[:, :1], pool, pool, out[:, :1], page_table=table[:1]).startswith(
    "page_table: a paged call takes the page table int32 [B, pages per sequence] with Q's batch")

# Values of the cache: fa-run refuses a length past the capacity or a page entry outside the pool, a page a length
# reaches, in the words of fa::kv_len_fault and fa::page_fault, the words the module raises when a decode kernel
# records the same value on the GPU (python/tests/decode_values.py); an entry past a length is never read.
def fa_run_paged(table, lens) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as folder:
        files = {name: os.path.join(folder, name + ".npy") for name in ("q", "k", "v", "page_table")}
        np.save(files["q"], np.zeros((2, 1, 4, 64), f16))
        np.save(files["k"], pool), np.save(files["v"], pool), np.save(files["page_table"], table)
        return subprocess.run([FA_RUN, "--step", "45", "--q", files["q"], "--k", files["k"], "--v", files["v"],
                               "--page-table", files["page_table"], "--kv-lens", lens,
                               "--out", os.path.join(folder, "o.npy")], capture_output=True, text=True)


bad_page = fa_run_paged(np.array([[2, 0], [1, 9]], np.int32), "8,5")
assert bad_page.returncode == 1 and ("attention problem: page_table[1][1] = 9 is outside the pool's pages 0 .. 3 "
                                     "(sequence 1's length reaches that page") in bad_page.stderr, bad_page.stderr
unread = fa_run_paged(np.array([[2, 0], [1, -1]], np.int32), "8,4")  # sequence 1's 4 keys: its page 1 unread
assert "page_table" not in unread.stderr and "no CUDA device" in unread.stderr or unread.returncode == 0, unread.stderr
long = fa_run_paged(np.array([[2, 0], [1, 3]], np.int32), "8,9")
assert long.returncode == 1 and ("attention problem: kv_lens[1] = 9 is outside 0 .. kv_len = 8 (kv_len is the "
                                 "cache's capacity per sequence)") in long.stderr, long.stderr

# The models' features (issue 58): a step refuses by name the ones it does not take; a step that takes them gets past
# every refusal to the host memory's; sinks of another form than float32 [Hq] are refused.
assert listed["49"]["window"] and not listed["49"]["softcap"] and listed["51"]["sinks"] and not listed["25"]["window"]
assert refusal(fa_course.forward, "25", q, k, v, out, window_left=4, window_right=0).startswith(
    "step 25: window = (4, 0) is not supported; supported: (-1, -1), no window")
assert refusal(fa_course.forward, "49", q, k, v, out, softcap=30.0).startswith(
    "step 49: softcap = 30.000000 is not supported; supported: 0, no soft-capping")
sinks = np.zeros(4, np.float32)
assert refusal(fa_course.forward, "50", q, k, v, out, sinks=sinks).startswith("step 50: sinks = on is not supported")
assert refusal(fa_course.forward, "51", q, k, v, out, window_left=4, softcap=30.0, sinks=sinks,
               workspace=np.zeros(16, np.uint8)).startswith("q: the tensor is not in CUDA device memory")
assert refusal(fa_course.forward, "51", q, k, v, out, sinks=np.zeros(2, np.float32)) == (
    "sinks: one float32 logit a query head, float32 [4]; got f32 [2]")
assert refusal(fa_course.forward, "51", q, k, v, out, sinks=sinks.astype(np.float16)) == (
    "sinks: one float32 logit a query head, float32 [4]; got f16 [4]")
assert refusal(fa_course.forward, "49", q, k, v, out, window_left=-2).startswith("attention problem: window")
# A pack (FlashAttention's varlen): Q, K, V [total, H, d] with both offsets, int32 [B + 1] (read on the host here);
# the offsets checked as fa-run checks them, and a step that takes no pack refuses it by name.
pq, pk = np.zeros((20, 4, 64), f16), np.zeros((19, 2, 64), f16)
cu_q, cu_k = np.array([0, 3, 20], np.int32), np.array([0, 5, 19], np.int32)
assert listed["52"]["varlen"] and not listed["51"]["varlen"]
assert refusal(fa_course.forward, "51", pq, pk, pk, np.zeros_like(pq), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k).startswith(
    "step 51: cu_seqlens = 2 packed sequences of their own lengths is not supported")
assert refusal(fa_course.forward, "52", pq, pk, pk, np.zeros_like(pq), cu_seqlens_q=cu_q).startswith(
    "a pack needs both cu_seqlens_q and cu_seqlens_k")
assert refusal(fa_course.forward, "52", pq, pk, pk, np.zeros_like(pq), cu_seqlens_q=np.array([0, 3, 21], np.int32),
               cu_seqlens_k=cu_k).startswith("cu_seqlens_q[B] = 21 must be the q's rows, 20")
assert refusal(fa_course.forward, "52", pq, pk, pk, np.zeros_like(pq), cu_seqlens_q=np.array([0, 30, 20], np.int32),
               cu_seqlens_k=cu_k).startswith("attention problem: cu_seqlens_q[2] - cu_seqlens_q[1] = -10")
assert refusal(fa_course.forward, "52", q, k, v, out, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k).startswith(
    "q: Q of a pack must have 3 dimensions [total, H, d]")
message = refusal(fa_course.forward, "52", pq, pk, pk, np.zeros_like(pq), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                  workspace=np.zeros(16, np.uint8))
assert message.startswith("q: the tensor is not in CUDA device memory"), message  # every check but the memory passed

# The backward takes the same features (issue 58): refused by name where a step does not take them; with sinks it
# writes their gradient, so dsinks (float32 [Hq]) must be there, and only then; a step that takes every one of them
# gets past every refusal to the host memory's (the backward's workspace: the float dQ and the LSE's scratch).
lse = np.zeros((2, 4, 8), np.float32)
dq, dk, dv = np.zeros_like(q), np.zeros((2, 8, 2, 64), f16), np.zeros((2, 8, 2, 64), f16)


def backward(step, **features):
    return refusal(fa_course.backward, step, q, k, v, out, lse, np.zeros_like(q), dq, dk, dv,
                   workspace=np.zeros(1 << 16, np.uint8), **features)


assert listed["55"]["sinks"] and listed["53"]["window"] and not listed["41"]["window"]
assert backward("41", window_left=4, window_right=0).startswith(
    "step 41: window = (4, 0) is not supported; supported: (-1, -1), no window")
assert backward("53", softcap=30.0).startswith("step 53: softcap = 30.000000 is not supported")
assert backward("54", sinks=sinks, dsinks=np.zeros(4, np.float32)).startswith("step 54: sinks = on is not supported")
assert backward("55", sinks=sinks) == ("dsinks: a backward with sinks writes their gradient; pass dsinks=, float32 [4] "
                                       "on the call's device")
assert backward("55", dsinks=np.zeros(4, np.float32)) == (
    "dsinks: given without sinks; a backward writes dsinks only with sinks=")
assert backward("55", sinks=sinks, dsinks=np.zeros(3, np.float32)) == "dsinks: must be f32 [4]; got f32 [3]"
message = backward("55", window_left=4, softcap=30.0, sinks=sinks, dsinks=np.zeros(4, np.float32))
assert message.startswith("q: the tensor is not in CUDA device memory"), message
assert backward("55", cu_seqlens_q=cu_q, cu_seqlens_k=cu_k).startswith("q: Q of a pack must have 3 dimensions")

# Where the tensors live: host memory is refused by name, before anything runs.
message = refusal(fa_course.forward, "11", q, k, v, out)
assert message.startswith("q: the tensor is not in CUDA device memory"), message
print("fa_course refuses as the kit and fa-run do")
