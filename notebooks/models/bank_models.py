#!/usr/bin/env python3
"""Which shared-memory bank each lane of a warp touches in steps 04 and 05.

Shared memory has 32 banks of 4-byte words; word w lives in bank w % 32. A warp's
access is served in wavefronts: lanes that hit *different words of one bank*
are serialised, lanes that read the *same word* share it (a broadcast). A
4-byte access is served for the whole warp at once; a 16-byte (float4) access
is served a quarter-warp (8 lanes) at a time.

This module models the two shared-memory accesses of the K/V tile that steps 04
and 05 differ in, for every K/V tile layout they use (see
steps/05_bank_conflicts/bank_conflicts.cu, TileLayout):

* the tile read in the score loop, lane x reads K_j[x][k] (the P.V loop reads
  V_j[x][c] with the same pattern);
* the tile store of the loader, thread e of the block writes element
  (row = e / d, col = e % d), so consecutive threads write consecutive columns.

It derives, from the word addresses alone, the conflict degree (the most
distinct words one bank is asked for in one wavefront) and draws the lane-to-bank
map. Command line:

    python3 notebooks/models/bank_models.py [--head-dim 64] [--out docs/figures/banks.png]

Only numpy and matplotlib; import it (``import bank_models``) from notebooks/tests.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import numpy as np

#: Banks of shared memory, and lanes of a warp.
BANKS = 32
WARP = 32
#: Keys per K/V tile in steps 04-05 (one per lane).
BC = 32

#: The K/V tile layouts of steps 04 and 05, in the order the course shows them.
LAYOUTS = ("step04", "pad1", "pad4", "pad4_vec4", "transpose")

#: One line per layout, for legends and the notebook.
DESCRIPTIONS = {
    "step04": "step 04: [Bc][d], row stride d, scalar reads",
    "pad1": "05 pad1: row stride d+1, scalar reads",
    "pad4": "05 pad4: row stride d+4, scalar reads",
    "pad4_vec4": "05 pad4_vec4: row stride d+4, float4 reads",
    "transpose": "05 transpose: [d][Bc], K_j[x][k] at k*Bc + x",
}


def row_stride(layout: str, head_dim: int) -> int:
    """Words between consecutive keys of a row-major tile (or consecutive columns of the transposed one)."""
    if layout == "step04":
        return head_dim
    if layout == "pad1":
        return head_dim + 1
    if layout in ("pad4", "pad4_vec4"):
        return head_dim + 4
    if layout == "transpose":
        return BC
    raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")


def word_of(layout: str, head_dim: int, key, col):
    """Shared-memory word of tile element (key, col), as TileLayout::at computes it."""
    stride = row_stride(layout, head_dim)
    if layout == "transpose":
        return np.asarray(col) * stride + np.asarray(key)
    return np.asarray(key) * stride + np.asarray(col)


@dataclass
class Access:
    """One warp-wide shared-memory instruction: the first word and the width of every lane's access."""

    layout: str
    kind: str  # "read" or "store"
    words: np.ndarray  # shape (WARP,): first 4-byte word each lane touches
    width: int  # words per lane: 1 (float) or 4 (float4)

    @property
    def lanes_per_wavefront(self) -> int:
        """Lanes served together: one wavefront carries 32 words, so 32 lanes of floats, 8 of float4s."""
        return WARP // self.width

    def lane_words(self) -> np.ndarray:
        """Every word each lane touches, shape (WARP, width)."""
        return self.words[:, None] + np.arange(self.width)[None, :]

    def lane_banks(self) -> np.ndarray:
        """Bank of every word each lane touches, shape (WARP, width)."""
        return self.lane_words() % BANKS

    def phases(self) -> list[np.ndarray]:
        """Lane indices of each group the hardware serves together (1 for scalar, 4 quarter-warps for float4)."""
        n = self.lanes_per_wavefront
        return [np.arange(start, start + n) for start in range(0, WARP, n)]

    def degree_per_phase(self) -> list[int]:
        """Most distinct words any one bank is asked for within each phase (1 = conflict-free)."""
        degrees = []
        for lanes in self.phases():
            words = np.unique(self.lane_words()[lanes].ravel())  # same word twice is a broadcast
            degrees.append(int(np.bincount(words % BANKS, minlength=BANKS).max()))
        return degrees

    @property
    def degree(self) -> int:
        """Conflict degree: the worst phase's degree (n-way conflict)."""
        return max(self.degree_per_phase())

    @property
    def wavefronts(self) -> int:
        """Wavefronts the instruction takes: the sum of its phases' degrees."""
        return sum(self.degree_per_phase())

    @property
    def ideal_wavefronts(self) -> int:
        """Wavefronts without any conflict: one per phase."""
        return len(self.phases())


def read_access(layout: str, head_dim: int = 64, k: int = 0) -> Access:
    """The score loop's K tile read at column k: lane x reads K_j[x][k] (float4 K_j[x][k..k+3] for pad4_vec4)."""
    lanes = np.arange(WARP)
    width = 4 if layout == "pad4_vec4" else 1
    return Access(layout, "read", word_of(layout, head_dim, lanes, k), width)


def store_access(layout: str, head_dim: int = 64, warp: int = 0) -> Access:
    """The loader's store of one warp: thread e = 32*warp + lane writes element (e / d, e % d)."""
    e = warp * WARP + np.arange(WARP)
    return Access(layout, "store", word_of(layout, head_dim, e // head_dim, e % head_dim), 1)


def conflict_degrees(head_dim: int = 64) -> dict[str, dict[str, int]]:
    """Worst conflict degree of the read (over every k) and the store (over every warp of the tile), per layout.

    Also returns the read's worst wavefronts per instruction ("read_wavefronts") and the
    minimum possible ("read_ideal"): a float4 read needs 4 wavefronts even without conflicts.
    """
    result = {}
    for layout in LAYOUTS:
        step = 4 if layout == "pad4_vec4" else 1
        reads = [read_access(layout, head_dim, k) for k in range(0, head_dim, step)]
        stores = [store_access(layout, head_dim, w) for w in range(BC * head_dim // WARP)]
        result[layout] = {
            "read": max(a.degree for a in reads),
            "store": max(a.degree for a in stores),
            "read_wavefronts": max(a.wavefronts for a in reads),
            "read_ideal": reads[0].ideal_wavefronts,
        }
    return result


def _draw_access(ax, access: Access, title: str) -> None:
    """Lane x bank grid: a filled cell where the lane touches the bank, coloured by phase."""
    grid = np.full((WARP, BANKS), np.nan)
    for phase, lanes in enumerate(access.phases()):
        for lane in lanes:
            grid[lane, access.lane_banks()[lane]] = phase
    n_phases = len(access.phases())
    cmap = "tab10" if n_phases > 1 else "Blues"
    ax.imshow(grid, cmap=cmap, vmin=0 if n_phases > 1 else -1, vmax=9 if n_phases > 1 else 0,
              interpolation="nearest", aspect="equal")
    for boundary in range(access.lanes_per_wavefront, WARP, access.lanes_per_wavefront):
        ax.axhline(boundary - 0.5, color="black", lw=0.8)
    ax.set_xticks(range(0, BANKS, 8))
    ax.set_yticks(range(0, WARP, 8))
    ax.set_xlabel("bank")
    ax.set_ylabel("lane")
    degree = access.degree
    phases = "" if n_phases == 1 else " per quarter-warp"
    verdict = "conflict-free" if degree == 1 else f"{degree}-way conflict"
    plural = "" if access.wavefronts == 1 else "s"
    ax.set_title(f"{title}\n{verdict}{phases}, {access.wavefronts} wavefront{plural}", fontsize=9)


def draw_banks(head_dim: int = 64):
    """Draw, for every layout, which bank each lane touches on the K tile read (top) and the tile store (bottom).

    Returns the matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(LAYOUTS), figsize=(3.2 * len(LAYOUTS), 7.4), constrained_layout=True)
    for col, layout in enumerate(LAYOUTS):
        name = DESCRIPTIONS[layout]
        read = read_access(layout, head_dim)
        _draw_access(axes[0, col], read, f"{name}\nread K_j[x][0" + ("..3]" if read.width > 1 else "]"))
        _draw_access(axes[1, col], store_access(layout, head_dim), f"{layout}: tile store, warp 0")
    fig.suptitle(f"Shared-memory banks touched by the 32 lanes of a warp, head_dim = {head_dim} "
                 "(one colour per group of lanes served together)")
    return fig


def main(argv=None) -> int:
    """Command line: print the conflict degrees and write the figure."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dim", type=int, default=64, help="d: 32, 64 or 128 (default 64)")
    parser.add_argument("--out", default=os.path.join("docs", "figures", "banks.png"), help="PNG to write")
    args = parser.parse_args(argv)

    print(f"head_dim = {args.head_dim}: conflict degree (1 = conflict-free)")
    print(f"{'layout':<10} {'read':>5} {'read wavefronts':>16} {'store':>6}")
    for layout, d in conflict_degrees(args.head_dim).items():
        wavefronts = f"{d['read_wavefronts']} (min {d['read_ideal']})"
        print(f"{layout:<10} {d['read']:>5} {wavefronts:>16} {d['store']:>6}")

    import matplotlib

    matplotlib.use("Agg")
    fig = draw_banks(args.head_dim)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
