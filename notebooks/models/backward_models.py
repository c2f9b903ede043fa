#!/usr/bin/env python3
"""Models shared by the notebooks of the backward steps, notebooks/26_naive_backward.ipynb to
37_staggered_q_walk.ipynb and 41_lean_backward_consumer.ipynb.

Each of those notebooks goes with one step; what several of them use lives here, once:

* One head in float64 (notebook 26 derives them, notebook 27 builds its references from them):
  ``forward``, ``loss``, ``backward`` (step 26's formulas), ``numeric_gradient`` and
  ``online_lse`` (the forward's log-sum-exp, tile by tile).
* mma.sync m16n8k16's fragments (steps/09_tensor_cores/mma.cuh) as index arrays over the 32
  lanes, ``mma`` on fragments and ``ldmatrix_x4`` from a model of shared memory (notebook 28
  introduces them; notebooks 29, 30 and 33 use them).
* The walk over a block's Q tiles of step 32 (``per_head_tiles``, ``walked``), which notebook 37
  rotates.
* Readers of what the course's H100 recorded: ``Rounds`` (a CSV of alternating rounds, its
  medians per step and configuration), ``config``, ``label``, ``span``, and the Nsight Compute
  listings (``stall_metric``, ``opcodes``, ``metrics``, ``stall_shares``, ``warp_tiles``).

``show`` displays the source of what a notebook uses from here, so the notebook that teaches a
function still shows it. Only numpy; import it (``import backward_models``) with
notebooks/models/ on ``sys.path``, as the notebooks do.
"""
from __future__ import annotations

import csv
import functools
import inspect
import itertools
import os
import re
import statistics
import sys

import numpy as np

#: The repository's root: the recorded files are read relative to it.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.path.join(REPO, "tools") not in sys.path:
    sys.path.append(os.path.join(REPO, "tools"))
import plots  # noqa: E402  tools/plots.py: step_id_of, a recorded CSV's step ids as the course numbers them today


def show(*items):
    """Display the source of functions from this module, or of one of its sections named by its title
    (the text after ``# ---- `` up to the next such line), as a Python code block."""
    text = inspect.getsource(inspect.getmodule(show))
    parts = []
    for item in items:
        if isinstance(item, str):
            start = text.index(f"# ---- {item}")
            end = text.find("\n# ---- ", start + 1)
            parts.append(text[start:end if end >= 0 else len(text)].strip("\n"))
        else:
            parts.append(inspect.getsource(item).strip("\n"))
    source = "\n\n".join(parts)
    try:
        from IPython.display import Markdown, display
        display(Markdown(f"```python\n{source}\n```"))
    except ImportError:
        print(source)


# ---- One head, float64: the forward, the loss, the backward (notebook 26)

def forward(Q, K, V, causal=False, scale=None):
    """One head: S, P and O of softmax(scale Q K^T) V (top-left causal: row i sees keys j <= i)."""
    scale = 1 / np.sqrt(Q.shape[1]) if scale is None else scale
    S = scale * Q @ K.T
    if causal:
        S = np.where(np.arange(K.shape[0])[None, :] <= np.arange(Q.shape[0])[:, None], S, -np.inf)
    P = np.exp(S - S.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    return S, P, P @ V


def loss(Q, K, V, dO, causal=False, scale=None):
    return np.sum(forward(Q, K, V, causal, scale)[2] * dO)


def backward(Q, K, V, dO, causal=False, scale=None):
    """One head, step 26's formulas: returns dQ, dK, dV and the intermediates P, dS, D."""
    scale = 1 / np.sqrt(Q.shape[1]) if scale is None else scale
    _, P, O = forward(Q, K, V, causal, scale)
    dV = P.T @ dO
    dP = dO @ V.T
    D = np.sum(P * dP, axis=1)                  # the softmax's row sum
    dS = P * (dP - D[:, None])
    dQ = scale * dS @ K
    dK = scale * dS.T @ Q
    return dQ, dK, dV, P, dS, D


def numeric_gradient(f, X, h=1e-6):
    """Central finite differences of the scalar f() with respect to every element of X (changed in place)."""
    G = np.zeros_like(X)
    for idx in np.ndindex(X.shape):
        x = X[idx]
        X[idx] = x + h; up = f()
        X[idx] = x - h; down = f()
        X[idx] = x
        G[idx] = (up - down) / (2 * h)
    return G


def online_lse(S, Bc, exp=np.exp, log=np.log):
    """m + log l after the forward's online softmax over K/V tiles of Bc keys (exp2, log2: the exp2 forwards)."""
    m = np.full(S.shape[0], -np.inf)
    l = np.zeros(S.shape[0])
    for k0 in range(0, S.shape[1], Bc):
        S_j = S[:, k0:k0 + Bc]
        m_new = np.maximum(m, S_j.max(axis=1))
        m_safe = np.where(m_new == -np.inf, 0.0, m_new)       # a causal row with no key yet in this tile
        l = exp(m - m_safe) * l + exp(S_j - m_safe[:, None]).sum(axis=1)
        m = m_new
    return m, l, m + log(l)


# ---- The fragments of mma.sync m16n8k16 (steps/09_tensor_cores/mma.cuh), lane = 4 g + t (notebook 28)

lane = np.arange(32)
g, t = lane >> 2, lane & 3
A_ROWS = np.stack([g, g + 8, g, g + 8], 1)            # register r of a lane holds A[row][col], A[row][col + 1]
A_COLS = np.stack([2 * t, 2 * t, 2 * t + 8, 2 * t + 8], 1)
B_KS = np.stack([2 * t, 2 * t + 8], 1)                # b[r] = B[k][g], B[k + 1][g]
C_ROWS = np.stack([g, g, g + 8, g + 8], 1)            # c[0..3] = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]
C_COLS = np.stack([2 * t, 2 * t + 1, 2 * t, 2 * t + 1], 1)


def a_frag(A):  # 16 x 16 -> (32 lanes, 4 registers, 2 halves)
    return np.stack([A[A_ROWS, A_COLS], A[A_ROWS, A_COLS + 1]], -1)


def b_frag(B):  # 16 x 8, (k, n) -> (32, 2, 2)
    return np.stack([B[B_KS, g[:, None]], B[B_KS + 1, g[:, None]]], -1)


def c_frag(C):  # 16 x 8 -> (32, 4)
    return C[C_ROWS, C_COLS]


def unfrag(shape, idx, frag):
    """The matrix back from its fragments; each element must come from exactly one (lane, register, half)."""
    M, hits = np.zeros(shape), np.zeros(shape, int)
    for ix, v in zip(idx, frag):
        M[ix] = v
        np.add.at(hits, ix, 1)
    assert (hits == 1).all()
    return M


def from_a(a):
    return unfrag((16, 16), [(A_ROWS, A_COLS), (A_ROWS, A_COLS + 1)], [a[..., 0], a[..., 1]])


def from_b(b):
    return unfrag((16, 8), [(B_KS, g[:, None]), (B_KS + 1, g[:, None])], [b[..., 0], b[..., 1]])


def from_c(c):
    return unfrag((16, 8), [(C_ROWS, C_COLS)], [c])


def mma(a, b, c):
    """One mma.sync on fragments: D = A B + C, A and B gathered from the 32 lanes, D handed back as C fragments."""
    return c + c_frag(from_a(a) @ from_b(b))


def ldmatrix_x4(smem, addr, trans=False):
    """Lanes 8i .. 8i+7 give rows 0..7 of 8 x 8 matrix i (16 bytes); lane (g, t) gets (g, 2t..), or (2t.., g) .trans.
    smem: shared memory as an array of 16-bit elements; addr: each lane's byte address."""
    assert (addr % 16 == 0).all()
    M = np.stack([smem[a // 2:a // 2 + 8] for a in addr]).reshape(4, 8, 8)    # matrix, row, column
    i, gg, tt = np.arange(4), g[:, None], 2 * t[:, None]
    return np.stack([M[i, tt + h, gg] if trans else M[i, gg, tt + h] for h in range(2)], -1)


# ---- The walk over a block's Q tiles (notebook 32)

def per_head_tiles(q_len, first_row, Br=64):
    return (q_len - first_row + Br - 1) // Br if first_row < q_len else 0


def walked(group, q_len, first_row, Br=64, kv_h=1, next_head=1):
    """Step 32: the next tile from this one. next_head=0 is the mutant walk_head_not_advanced."""
    tiles = group * per_head_tiles(q_len, first_row, Br)
    h, i0, visits = kv_h * group, first_row, []
    for it in range(tiles):
        h1, i1 = h, i0 + Br
        if i1 >= q_len:
            i1, h1 = first_row, h1 + next_head
        visits.append((h, i0))                 # the tile's products; its copies went out one tile earlier
        h, i0 = h1, i1
    if tiles and next_head:
        assert (h, i0) == ((kv_h + 1) * group, first_row)   # past the group, and never copied: it + 1 < tiles
    return visits


# ---- What the course's H100 recorded: rounds and profiles (notebooks 29 to 37)

def config(r):
    """A CSV row's configuration: (dtype, batch, q_len, kv_len, q_heads, kv_heads, head_dim, causal), as strings."""
    return tuple(r[k] for k in ("dtype", "batch", "q_len", "kv_len", "q_heads", "kv_heads", "head_dim", "causal"))


def label(c):
    """A configuration as a table row's first column."""
    return (f"d={c[6]:>3} B={c[1]} N={c[2]:>5} H={c[4]:>2} {c[0]:>4} "
            f"{'causal' if c[7] == '1' else 'non-causal':>10}")


def span(table, d=None, causal=None, N=None):
    """(min, max) of a {configuration: ratio} table, rounded to 2 places, over the configurations that match."""
    vals = [v for c, v in table.items() if (d is None or c[6] == d) and (causal is None or c[7] == causal)
            and (N is None or c[2] == N)]
    return round(min(vals), 2), round(max(vals), 2)


class Rounds:
    """One call's recorded rounds: the backward rows of suites round1 and round2 of a CSV of fa-bench's columns
    (path relative to the repository), each configuration of each step run once per round; the step ids are today's
    (tools/plots.py's step_id_of), whatever the CSV's date."""

    def __init__(self, path):
        with open(os.path.join(REPO, path), newline="") as f:
            self.rows = [dict(r, step=plots.step_id_of(path, r["step"])) for r in csv.DictReader(f)
                         if r["pass"] == "backward" and r["suite"] in ("round1", "round2")]

    def median(self, step, key="tflops", cfg=("f16", "4", "4096", "4096", "16", "16", "128", "0")):
        """The median of the two rounds' `key` (ms or tflops) of `step` at configuration `cfg`."""
        vals = [float(r[key]) for r in self.rows if r["step"] == step and config(r) == cfg]
        assert len(vals) == 2, (step, cfg)                     # one per round
        return statistics.median(vals)

    def configs(self, step):
        """The configurations `step` ran, by head_dim, then the longest first, dtype, causal."""
        return sorted({config(r) for r in self.rows if r["step"] == step},
                      key=lambda c: (int(c[6]), -int(c[2]), c[0], c[7]))

    def has(self, step, cfg):
        """Whether `step` (e.g. sdpa-flash) ran configuration `cfg` in these rounds."""
        return any(r["step"] == step and config(r) == cfg for r in self.rows)

    def speedup(self, new, old, cfgs):
        """old's ms over new's, per configuration."""
        return {c: self.median(old, "ms", c) / self.median(new, "ms", c) for c in cfgs}

    def step_table(self, old, new, cfgs, show=True):
        """Median ms of steps old and new and FA2 per configuration; old's ms over new's, FA2's over new's."""
        if show:
            print(f"\n{'':38} | {old:>2} ms   | {new:>2} ms   | FA2 ms  | {old} / {new} | FA2 / {new}")
        x_old, x_fa2 = {}, {}
        for c in cfgs:
            ms = {s: self.median(s, "ms", c) for s in (old, new)}
            x_old[c] = ms[old] / ms[new]
            line = f"{label(c)} | {ms[old]:7.4f} | {ms[new]:7.4f} | "
            if self.has("sdpa-flash", c):
                x_fa2[c] = self.median("sdpa-flash", "ms", c) / ms[new]
                line += f"{self.median('sdpa-flash', 'ms', c):7.4f} | {x_old[c]:6.3f}x | {x_fa2[c]:7.3f}x"
            else:
                line += f"{'-':>7} | {x_old[c]:6.3f}x | {'-':>7}"
            if show:
                print(line)
        return x_old, x_fa2


@functools.lru_cache(maxsize=None)
def _stall_sections():
    # Nsight Compute, H100, B=4 N=4096 H=16 f16 non-causal: one section per kernel
    with open(os.path.join(REPO, "docs/results/profiles/h100-2026-11-25-backward-stalls.txt")) as f:
        return dict(re.findall(r"^== (.+?)\n(.*?)(?=^==|\Z)", f.read(), re.M | re.S))


def stall_metric(kernel, name):
    """Metric `name` of the kernel whose section starts with `kernel` ("step 30 d=128") in the Nsight Compute
    profile of steps 29 to 31 (docs/results/profiles/h100-2026-11-25-backward-stalls.txt)."""
    kernels = _stall_sections()
    kernel = next(k for k in kernels if k.startswith(kernel))
    return float(re.search(rf"^{re.escape(name)} ([\d.,]+)$", kernels[kernel], re.M)[1].replace(",", ""))


def opcodes(path):
    """A bench/ncu_opcodes.py listing: instructions per kernel (M), then executed M and stall % per opcode."""
    with open(os.path.join(REPO, path)) as f:
        lines = [l for l in f.read().splitlines() if not l.startswith("#")]
    total = {k: float(v) for k, v in re.findall(r"(\w+) ([\d.]+) M instructions", lines[0])}
    head = next(i for i, l in enumerate(lines) if l.startswith("opcode"))
    assert lines[head].split()[1::2][:len(total)] == list(total)          # columns in the kernels' order
    count, stall = {}, {}
    for l in itertools.takewhile(str.strip, lines[head + 1:]):
        op, *v = l.split()
        count[op] = dict(zip(total, map(float, v[:len(total)])))
        stall[op] = dict(zip(total, map(float, v[len(total):])))
    return total, count, stall, lines


def metrics(lines):
    """The "metric" table of an opcodes() listing: {metric: {kernel: value as written}}."""
    head = next(i for i, l in enumerate(lines) if l.startswith("metric"))
    names = lines[head].split()[1:]
    out = {}
    for l in itertools.takewhile(str.strip, lines[head + 1:]):
        *words, = re.split(r"\s{2,}", l.strip())
        out[words[0]] = dict(zip(names, words[1:]))
    return out


def stall_shares(lines):
    """The sampled stalls of an opcodes() listing: {kernel: {reason: % of the samples}}."""
    head = next(i for i, l in enumerate(lines) if l.startswith("kernel ") and "samples" in l)
    reasons = lines[head].split()[2:]
    return {l.split()[0]: dict(zip(reasons, (float(v.rstrip("%")) for v in l.split()[2:])))
            for l in itertools.takewhile(str.strip, lines[head + 1:])}


def warp_tiles(Br):
    """(warp, Q tile) pairs of one K/V-tile kernel at B=4 N=4096 H=16: blocks of 128 keys x Q tiles of Br rows x 8 warps."""
    return 4 * 16 * 4096 // 128 * (4096 // Br) * 8
