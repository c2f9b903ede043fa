#!/usr/bin/env python3
"""The module refuses outputs that share memory with an input or another output, and a workspace that is missing,
too small or misaligned, before it asks where the tensors live (issue 55). Runs without a GPU: the tensors are numpy
arrays (host memory, through DLPack), so a call that passes these checks stops at "q: the tensor is not in CUDA
device memory" -- which the right calls here must reach, to show that nothing right is refused.

    python3 python/tests/refusals_no_gpu.py BUILD/python

CI runs it (ctest -R cpu/python). Plain asserts, no pytest; prints one line when every check passed.
"""
import os
import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fa_course  # noqa: E402
from refusal import refusal  # noqa: E402

NOT_ON_GPU = "q: the tensor is not in CUDA device memory"
RACE = ": an output may not share memory with an input or another output (they would race); pass a separate tensor"


def overlap(message: str, output: str, other: str) -> None:
    assert message == f"{output} overlaps {other}{RACE}", message


def aligned(nbytes: int, offset: int = 0) -> np.ndarray:
    """nbytes of uint8 at an address that is `offset` past a multiple of 64 (numpy's own alignment may be 16)."""
    base = np.zeros(nbytes + 128, np.uint8)
    start = (-base.ctypes.data) % 64 + offset
    return base[start:start + nbytes]


def within(buffer: np.ndarray, byte: int, dtype, shape) -> np.ndarray:
    """A contiguous array of `dtype` and `shape` over `buffer`'s bytes from `byte` on (a view: shared memory)."""
    count = int(np.prod(shape))
    return buffer[byte:byte + count * np.dtype(dtype).itemsize].view(dtype).reshape(shape)


f16 = np.float16
B, N, HQ, HKV, D = 2, 8, 4, 2, 64
Q_SHAPE, KV_SHAPE, LSE_SHAPE = (B, N, HQ, D), (B, N, HKV, D), (B, HQ, N)
q, k, v = np.zeros(Q_SHAPE, f16), np.zeros(KV_SHAPE, f16), np.zeros(KV_SHAPE, f16)
out, lse = np.zeros(Q_SHAPE, f16), np.zeros(LSE_SHAPE, np.float32)
q_bytes = q.nbytes

# -- Forward (step 11): an output over an input, part of one, or another output; inputs may share memory.
assert refusal(fa_course.forward, "11", q, k, v, out).startswith(NOT_ON_GPU)  # the right call reaches the GPU check
overlap(refusal(fa_course.forward, "11", q, k, v, q), "out", "q")
overlap(refusal(fa_course.forward, "11", q, k, v, out, lse=lse, workspace=k.view(np.uint8).reshape(-1)),
        "workspace", "k")
pair = aligned(2 * q_bytes)
q_low = within(pair, 0, f16, Q_SHAPE)
overlap(refusal(fa_course.forward, "11", q_low, k, v, within(pair, q_bytes - 2, f16, Q_SHAPE)), "out", "q")  # 1 elt
assert refusal(fa_course.forward, "11", q_low, k, v, within(pair, q_bytes, f16, Q_SHAPE)).startswith(NOT_ON_GPU), \
    "an output that ends where an input starts does not overlap it"
overlap(refusal(fa_course.forward, "11", q, k, v, out, lse=within(out.view(np.uint8).reshape(-1), 64, np.float32,
                                                                  LSE_SHAPE)), "lse", "out")
assert refusal(fa_course.forward, "11", q, k, k, out).startswith(NOT_ON_GPU), "K and V may be one tensor"
overlap(refusal(fa_course.forward, "11", q, k, v, out, lse=lse, workspace=lse.view(np.uint8).reshape(-1)),
        "workspace", "lse")
# A strided output (its layout is refused later) is judged by the bytes from its first element to its last.
wide = np.zeros((B, N, 2 * HQ, D), f16)
overlap(refusal(fa_course.forward, "11", wide[:, :, :HQ], k, v, wide[:, :, HQ:]), "out", "q")

# -- Decode: kv_lens and the page table are inputs too.
q1, out1 = q[:, :1], np.zeros((B, 1, HQ, D), f16)
ints = np.zeros(8, np.int32)
lens = ints[:2]
overlap(refusal(fa_course.forward, "42", q1, k, v, out1, lse=ints.view(np.float32).reshape(B, HQ, 1), kv_lens=lens),
        "lse", "kv_lens")
pool = np.zeros((4, 16, HKV, D), f16)  # 4 pages of 16 tokens, two pages a sequence
table_bytes = out1.view(np.uint8).reshape(-1)
table = table_bytes[:16].view(np.int32).reshape(B, 2)
overlap(refusal(fa_course.forward, "46", q1, pool, pool, out1, page_table=table), "out", "page_table")
# Without a GPU the decode step's workspace cannot be sized (it follows the SM count): host memory is refused; with
# one, the missing workspace is refused first (the workspace checks come before where the tensors live).
message = refusal(fa_course.forward, "46", q1, pool, pool, np.zeros_like(out1),
                  page_table=np.array([[0, 1], [2, 3]], np.int32))
assert message.startswith(NOT_ON_GPU) or message.startswith("step 46 needs a workspace of"), message

# -- The models' features in decode (step 59): step 48, the kernel it grows from, refuses a window by name; step 59
# takes a window, a cap and sinks over the paged cache (the call reaches the GPU check, or with one the workspace's).
paged = dict(page_table=np.array([[0, 1], [2, 3]], np.int32), causal=True, causal_align="bottom-right")
message = refusal(fa_course.forward, "48", q1, pool, pool, np.zeros_like(out1), window_left=16, window_right=0, **paged)
assert "step 48: window = (16, 0) is not supported" in message, message
message = refusal(fa_course.forward, "59", q1, pool, pool, np.zeros_like(out1), window_left=16, window_right=0,
                  softcap=30.0, sinks=np.zeros(HQ, np.float32), **paged)
assert message.startswith(NOT_ON_GPU) or message.startswith("step 59 needs a workspace of"), message

# -- Backward (step 27, whose workspace, the float dQ and D, needs no GPU to size).
need = (q.size + lse.size) * 4
assert fa_course.steps()[[s["label"] for s in fa_course.steps()].index("27")]["needs_workspace"]
d_out = np.zeros(Q_SHAPE, f16)
dq, dk, dv = np.zeros(Q_SHAPE, f16), np.zeros(KV_SHAPE, f16), np.zeros(KV_SHAPE, f16)
ws = aligned(need)


def backward(**changed):
    """Step 27's backward call on the tensors above, with `changed` ones swapped in."""
    t = dict(q=q, k=k, v=v, out=out, lse=lse, d_out=d_out, dq=dq, dk=dk, dv=dv, workspace=ws) | changed
    return refusal(fa_course.backward, "27", t["q"], t["k"], t["v"], t["out"], t["lse"], t["d_out"], t["dq"],
                   t["dk"], t["dv"], workspace=t["workspace"])


assert backward().startswith(NOT_ON_GPU), backward()
overlap(backward(dk=q.reshape(-1)[:k.size].reshape(KV_SHAPE)), "dk", "q")  # issue 55: dK over Q
overlap(backward(dq=d_out), "dq", "d_out")
overlap(backward(dq=out), "dq", "out")
overlap(backward(dv=dk), "dv", "dk")
overlap(backward(dv=v), "dv", "v")
overlap(backward(workspace=lse.view(np.uint8).reshape(-1)), "workspace", "lse")
overlap(backward(workspace=dq.view(np.uint8).reshape(-1)), "workspace", "dq")

# -- The workspace: missing, too small, misaligned (each before where the tensors live), and right.
assert backward(workspace=None) == (f"step 27 needs a workspace of {need} bytes (workspace_bytes() says so): pass "
                                    "workspace=, uint8 on the call's device"), backward(workspace=None)
assert backward(workspace=aligned(need - 1)) == f"workspace: step 27 needs {need} bytes; got {need - 1}"
message = backward(workspace=aligned(need, offset=1))  # issue 55: an odd address faulted on the GPU
assert message.startswith("step 27: ") and "(workspace)" in message and "aligned" in message, message
message = backward(workspace=aligned(need + 8, offset=8))
assert message.startswith("step 27: ") and "(workspace)" in message, message
assert backward(workspace=aligned(need + 100)).startswith(NOT_ON_GPU), "a larger workspace is taken"
# A decode step sizes its workspace by the GPU's SM count; without a GPU its alignment is still checked.
message = refusal(fa_course.forward, "46", q1, k, v, out1, kv_lens=lens, workspace=aligned(1 << 20, offset=1))
assert message.startswith("step 46: ") and "(workspace)" in message, message

# -- head_dim 256 (Gemma-class heads): step 57 takes it, and the call reaches the GPU check; step 52, the kernel it
# grows from, refuses it by name with the head_dims it takes.
q256, kv256 = np.zeros((B, N, HQ, 256), f16), np.zeros((B, N, HKV, 256), f16)
message = refusal(fa_course.forward, "52", q256, kv256, kv256, np.zeros_like(q256), workspace=aligned(64))
assert "head_dim = 256 is not supported" in message and "supported: 64, 128" in message, message
message = refusal(fa_course.forward, "57", q256, kv256, kv256, np.zeros_like(q256), workspace=aligned(64))
assert message.startswith(NOT_ON_GPU), message
# The backward at 256: step 56 refuses it by name, step 58's call (its workspace the float dQ and D) reaches the GPU
# check.
lse256 = np.zeros((B, HQ, N), np.float32)


def backward_256(step):
    return refusal(fa_course.backward, step, q256, kv256, kv256, np.zeros_like(q256), lse256, np.zeros_like(q256),
                   np.zeros_like(q256), np.zeros_like(kv256), np.zeros_like(kv256),
                   workspace=aligned((q256.size + lse256.size) * 4))


message = backward_256("56")
assert "head_dim = 256 is not supported" in message and "supported: 64, 128" in message, message
message = backward_256("58")
assert message.startswith(NOT_ON_GPU), message

# The causal diagonal at the last key (bottom-right) in prefill: step 57 refuses it by name; step 60's call, 300 rows
# over 1000 keys at d = 256, reaches the GPU check; the backward's causal_align is refused by step 58 by name and
# reaches the GPU check through step 61.
q_chunk, kv_prefix = np.zeros((1, 300, HQ, 256), f16), np.zeros((1, 1000, HKV, 256), f16)
for step in ("57", "60"):
    message = refusal(fa_course.forward, step, q_chunk, kv_prefix, kv_prefix, np.zeros_like(q_chunk), causal=True,
                      causal_align="bottom-right", workspace=aligned(64))
    if step == "57":
        assert "causal_align = bottom-right is not supported" in message, message
    else:
        assert message.startswith(NOT_ON_GPU), message
message = refusal(fa_course.backward, "58", q256, kv256, kv256, np.zeros_like(q256), lse256, np.zeros_like(q256),
                  np.zeros_like(q256), np.zeros_like(kv256), np.zeros_like(kv256), causal=True,
                  causal_align="bottom-right", workspace=aligned((q256.size + lse256.size) * 4))
assert "causal_align = bottom-right is not supported" in message, message
message = refusal(fa_course.backward, "61", q256, kv256, kv256, np.zeros_like(q256), lse256, np.zeros_like(q256),
                  np.zeros_like(q256), np.zeros_like(kv256), np.zeros_like(kv256), causal=True,
                  causal_align="bottom-right", workspace=aligned((q256.size + lse256.size) * 4))
assert message.startswith(NOT_ON_GPU), message

assert callable(fa_course.check)
print("fa_course refuses overlapping outputs and a missing, small or misaligned workspace before the GPU, "
      "head_dim 256 where the step does not take it, a window in decode before step 59, and the bottom-right "
      "diagonal in prefill before steps 60 and 61")
