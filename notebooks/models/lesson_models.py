#!/usr/bin/env python3
"""Small lane-level models shared by the notebooks of steps 06, 08 and 09.

notebooks/06_sp_reuse.ipynb, 08_register_tiling.ipynb and 09_tensor_cores.ipynb each
emulate one kernel's index arithmetic in numpy. The index formulas themselves stay in
the notebooks, next to the lines of CUDA they copy; what the three share lives here:

* ``attention_reference``: softmax(scale * Q K^T) V for one head in float64, the
  answer every emulation is checked against; ``attention_heads``, the same over every
  (batch, head) of the course's layout with GQA, and ``TILING_SHAPES`` and ``TILINGS``, the
  shapes and tile sizes on which notebooks 03 and 04 check their loop orders.
* ``shfl_xor`` and ``butterfly``: a warp as 32 numpy lanes (the last axis) and the
  xor-shuffle reductions of step 02 (``warp_max``/``warp_sum``: offsets 16..1), step 08
  (``row_group_max``: 4, 8, 16) and step 09 (the quad: 1, 2), with a counter of the
  shuffles issued.
* ``warp_access`` and ``phase_words``: one warp-wide shared-memory instruction as a
  ``bank_models.Access`` (notebooks/models/bank_models.py's bank model: 32 banks of 4-byte words, a
  16-byte access served 8 lanes at a time, the same word read twice is a broadcast),
  from the 4-byte word address each lane gives.
* ``draw_owner_grid``: a matrix drawn as a coloured grid, optionally with a label in
  every cell or block (who owns which element).

Only numpy (and matplotlib for the drawing); import it (``import lesson_models``) with
notebooks/models/ on ``sys.path``, as the notebooks do.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

import bank_models

#: Lanes of a warp and banks of shared memory (the bank model's constants).
WARP = bank_models.WARP
BANKS = bank_models.BANKS


def attention_reference(Q, K, V, scale=None, causal=False):
    """softmax(scale * Q K^T) V for one head, in float64.

    Q is [q_len, d], K and V are [kv_len, d]; scale defaults to 1/sqrt(d). With
    ``causal`` query i sees keys j <= i (top-left aligned, as every step masks).
    """
    Q, K, V = (np.asarray(a, dtype=np.float64) for a in (Q, K, V))
    scale = 1.0 / np.sqrt(Q.shape[1]) if scale is None else scale
    S = scale * Q @ K.T
    if causal:
        S = np.where(np.arange(K.shape[0])[None, :] <= np.arange(Q.shape[0])[:, None], S, -np.inf)
    P = np.exp(S - S.max(axis=1, keepdims=True))
    return (P / P.sum(axis=1, keepdims=True)) @ V



def attention_heads(Q, K, V, scale=None, causal=False):
    """softmax(scale * Q K^T) V in the course's layout, in float64, one head at a time.

    Q is [batch, q_len, q_heads, d], K and V are [batch, kv_len, kv_heads, d]; query head h
    reads KV head h // (q_heads / kv_heads) (GQA, MQA when kv_heads is 1). Each head is
    ``attention_reference``, so ``causal`` is top-left aligned: what the float64 CPU
    reference in reference/ computes.
    """
    Q = np.asarray(Q, dtype=np.float64)
    B, _, Hq, _ = Q.shape
    group = Hq // K.shape[2]
    O = np.empty(Q.shape)
    for b in range(B):
        for h in range(Hq):
            O[b, :, h] = attention_reference(Q[b, :, h], K[b, :, h // group], V[b, :, h // group], scale, causal)
    return O


#: (batch, q_len, kv_len, q_heads, kv_heads, d) on which notebooks 03 and 04 check a loop order
#: against ``attention_heads``: lengths 1, 7, 100 (multiples of no tile), q_len != kv_len both
#: ways, GQA 8/2 and MQA 8/1, head_dim 32 to 128.
TILING_SHAPES = [
    (1, 1, 1, 1, 1, 32),
    (1, 7, 7, 2, 2, 32),
    (2, 100, 100, 4, 4, 64),
    (1, 7, 100, 2, 2, 64),      # q_len < kv_len
    (1, 100, 7, 2, 2, 64),      # q_len > kv_len: causal rows past kv_len see every key
    (1, 100, 130, 8, 2, 32),    # GQA
    (1, 65, 33, 8, 1, 32),      # MQA
    (1, 256, 256, 2, 2, 128),
]
#: (Br, Bc) pairs for those checks, Br != Bc in most of them.
TILINGS = [(32, 64), (16, 32), (7, 5), (64, 16), (1, 1)]

def shfl_xor(values, offset, counter: Counter | None = None, name: str = "shfl"):
    """``__shfl_xor_sync(full mask, value, offset)`` for every lane: lane L receives lane L ^ offset's value.

    ``values`` holds one value per lane on its last axis (length 32). Every call is one
    shuffle instruction for the warp; ``counter[name]`` counts them when a counter is given.
    """
    values = np.asarray(values)
    if values.shape[-1] != WARP:
        raise ValueError(f"the last axis must be the {WARP} lanes, got shape {values.shape}")
    if counter is not None:
        counter[name] += 1
    return values[..., np.arange(WARP) ^ offset]


def butterfly(values, offsets, op, counter: Counter | None = None, name: str = "shfl"):
    """Reduce with ``op`` (np.maximum, np.add) over the lanes that the xor ``offsets`` connect.

    ``offsets`` (16, 8, 4, 2, 1) is step 02's warp_reduce over all 32 lanes; (4, 8, 16) is
    step 08's row_group_max over the 8 lanes 4 apart; (1, 2) is step 09's quad. Every lane
    receives the result of its group, one shuffle per offset.
    """
    for offset in offsets:
        values = op(values, shfl_xor(values, offset, counter, name))
    return values


def warp_access(words, width: int = 1, kind: str = "read", label: str = "") -> bank_models.Access:
    """One warp-wide shared-memory instruction in notebooks/models/bank_models.py's bank model.

    ``words``: the first 4-byte word each of the 32 lanes touches (byte address / 4);
    ``width``: words per lane, 1 for a float, 4 for a float4, a uint4 or one ldmatrix row
    (16 bytes, served a quarter-warp of 8 lanes at a time: ldmatrix's 8 row addresses of one
    8x8 matrix are the 8 lanes of one quarter-warp).
    """
    words = np.asarray(words, dtype=np.int64).reshape(-1)
    if words.shape != (WARP,):
        raise ValueError(f"one word address per lane: expected {WARP}, got {words.size}")
    return bank_models.Access(label, kind, words, width)


def phase_words(access: bank_models.Access) -> list[int]:
    """Distinct 4-byte words each phase of ``access`` touches.

    A phase's lanes ask for ``lanes * width`` words; fewer distinct words means some lanes
    share them (a broadcast). 32 distinct words in a phase is the most one wavefront carries.
    """
    return [int(np.unique(access.lane_words()[lanes].ravel()).size) for lanes in access.phases()]


def draw_owner_grid(ax, values, labels=None, block=1, cmap="tab20", title="", xlabel="", ylabel="",
                    fontsize=6, vmin=None, vmax=None, aspect="equal"):
    """Draw matrix ``values`` (numbers, one colour each) as a grid of cells.

    ``labels`` (same shape, strings or numbers) are written in the cells; with ``block`` > 1
    only one label per ``block x block`` square is written, at its centre (the labels of a
    square must agree). NaN cells stay blank. Returns the image.
    """
    values = np.asarray(values, dtype=float)
    image = ax.imshow(values, cmap=cmap, interpolation="nearest", aspect=aspect, vmin=vmin, vmax=vmax)
    if labels is not None:
        labels = np.asarray(labels)
        rows, cols = values.shape
        for r in range(0, rows, block):
            for c in range(0, cols, block):
                ax.text(c + (block - 1) / 2, r + (block - 1) / 2, str(labels[r, c]), ha="center", va="center",
                        fontsize=fontsize)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return image
