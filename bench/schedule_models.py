#!/usr/bin/env python3
"""Scheduling models for steps 10-13: which work waits for what, in time units of a model.

These are *models*, not measurements: every latency and cost is a parameter, every
result is arithmetic on those parameters. The notebooks that go with the steps
(notebooks/09_async_pipeline, 11_boundary_masking, 12_causal_order) import this
module, derive closed forms or bounds by hand and check them against what the model
computes.

* ``simulate_sm`` runs the K/V loop of one or more resident blocks on one SM. A
  block is a *program*, the sequence of operations its kernel issues, read off the
  source (step 09's tensor_cores.cu, step 10's async_pipeline.cu):

      ("load", name, latency)     start a copy global -> shared (cp.async, or a plain load)
      ("commit",)                 cp.async.commit_group: close the group of loads started so far
      ("wait", n)                 cp.async.wait_group n: until at most the n newest groups are in flight
      ("compute", name, time)     work that needs the SM's arithmetic units

  Assumptions: a load takes its latency and nothing else (no bandwidth limit, loads
  never delay each other or compute); compute of all resident blocks shares one
  compute unit, one operation at a time, and when several blocks are ready it
  serves them round robin. A block runs as one unit (its warps in step), so
  __syncthreads is implicit. A plain synchronous load (step 09) is a load, a
  commit and a wait(0).

* ``kv_tiles`` is the number of K/V tiles a block of steps 10-13 visits, exactly
  as the kernels compute Tc.

* ``list_schedule`` is a GPU launch as a list schedule: S slots (SMs x resident
  blocks per SM), blocks taken in a given order, each freed slot taking the next
  block (greedy). A slot runs at a fixed speed whatever else runs on its SM.
  ``causal_launch_costs`` gives the blocks of a causal launch in blockIdx order,
  as step 12 maps them to Q tiles or reversed per head as step 13 does.

Only numpy; import it (``import schedule_models``) from notebooks/tests.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

#: Tile sizes of steps 10-13 (steps/1x_*/*.cu): keys per K/V tile, query rows per warp,
#: warps per block, and query rows per block (Br = 16 * kWarps).
BC = 64
ROWS_PER_WARP = 16
WARPS = 4
BR = ROWS_PER_WARP * WARPS


def ceil_div(a, b):
    """Integer ceil(a / b) for non-negative a and positive b (works elementwise on numpy arrays)."""
    return -(-a // b)


def kv_tiles(q_tile, q_len, kv_len, causal, br=BR, bc=BC):
    """K/V tiles visited by the block of Q tile `q_tile`, as the kernels compute Tc:

        rows_end = min(i0 + Br, q_len); kv_end = causal ? min(kv_len, rows_end) : kv_len
        Tc = ceil(kv_end / Bc)

    (for a full tile, causal: ceil(min(kv_len, (q_tile + 1) * Br) / Bc)). Elementwise on arrays.
    """
    q_tile = np.asarray(q_tile)
    rows_end = np.minimum(q_tile * br + br, q_len)
    kv_end = np.minimum(kv_len, rows_end) if causal else np.full_like(q_tile, kv_len)
    return ceil_div(kv_end, bc)


# --------------------------------------------------------------------------- one SM, resident blocks


@dataclass
class Bar:
    """One interval of a timeline: a load in flight or a compute operation."""
    block: int
    kind: str      # "load" or "compute"
    name: str
    start: float
    end: float


@dataclass
class Timeline:
    """What ``simulate_sm`` returns: every bar, and the time each block finished."""
    bars: list = field(default_factory=list)
    block_end: list = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return max(self.block_end) if self.block_end else 0.0

    def compute_busy(self) -> float:
        """Total time the compute unit was busy."""
        return sum(b.end - b.start for b in self.bars if b.kind == "compute")


class _Block:
    def __init__(self, index, program, start):
        self.index, self.program, self.pc, self.t = index, list(program), 0, float(start)
        self.open_group = []       # end times of loads started since the last commit
        self.groups = []           # ready time of every committed group, oldest first

    def run_until_compute(self, bars):
        """Do every load/commit/wait up to the next compute op (they take no compute)."""
        while self.pc < len(self.program) and self.program[self.pc][0] != "compute":
            op = self.program[self.pc]
            if op[0] == "load":
                _, name, latency = op
                bars.append(Bar(self.index, "load", name, self.t, self.t + latency))
                self.open_group.append(self.t + latency)
            elif op[0] == "commit":
                self.groups.append(max(self.open_group, default=self.t))  # an empty group is complete
                self.open_group = []
            elif op[0] == "wait":
                n = op[1]
                done = self.groups[:len(self.groups) - n] if n else self.groups
                self.t = max([self.t, *done])
                self.groups = self.groups[len(done):]
            else:
                raise ValueError(f"unknown op {op!r}")
            self.pc += 1

    @property
    def done(self):
        return self.pc >= len(self.program)


def simulate_sm(programs, starts=None) -> Timeline:
    """Runs the programs (one per resident block) on one SM; see the module doc.

    Block i starts at starts[i] (default: all at time 0, as the blocks of a launch's first wave do).
    """
    starts = [0.0] * len(programs) if starts is None else list(starts)
    blocks = [_Block(i, p, t0) for i, (p, t0) in enumerate(zip(programs, starts))]
    timeline = Timeline(block_end=[float(t) for t in starts])
    unit_free, last_served = 0.0, -1
    while True:
        for b in blocks:
            b.run_until_compute(timeline.bars)
            if b.done:
                timeline.block_end[b.index] = b.t
        waiting = [b for b in blocks if not b.done]
        if not waiting:
            return timeline
        ready = [b for b in waiting if b.t <= unit_free]
        if ready:   # round robin: the first ready block after the one served last
            b = min(ready, key=lambda b: (b.index - last_served - 1) % len(blocks))
        else:       # the unit is idle until the earliest block is ready
            b = min(waiting, key=lambda b: (b.t, b.index))
        _, name, duration = b.program[b.pc]
        start = max(unit_free, b.t)
        timeline.bars.append(Bar(b.index, "compute", name, start, start + duration))
        unit_free = b.t = start + duration
        last_served = b.index
        b.pc += 1


# --------------------------------------------------------------------------- a launch on S slots


def list_schedule(costs, slots):
    """Greedy list schedule: blocks in the given order, each taken by the slot that frees first.

    Returns (makespan, start times). `costs` in launch order, `slots` = SMs x blocks per SM.
    """
    costs = np.asarray(costs, dtype=np.float64)
    free = [0.0] * min(slots, len(costs))
    heapq.heapify(free)
    starts = np.empty_like(costs)
    makespan = 0.0
    for k, c in enumerate(costs):
        t = heapq.heappop(free)
        starts[k] = t
        heapq.heappush(free, t + c)
        makespan = max(makespan, t + c)
    return makespan, starts


def causal_launch_costs(batch, heads, q_len, kv_len, reverse, br=BR, bc=BC):
    """Cost (K/V tiles visited) of every block of a causal launch, in blockIdx order.

    The grid is (Tr, heads, batch) and blocks are numbered x fastest, so the launch is
    batch x heads repetitions of the Tr Q tiles. Step 13 maps block x to Q tile Tr - 1 - x
    (`reverse=True`): each head's tiles heaviest first.
    """
    tr = ceil_div(q_len, br)
    x = np.arange(tr)
    q_tile = tr - 1 - x if reverse else x
    per_head = kv_tiles(q_tile, q_len, kv_len, causal=True, br=br, bc=bc)
    return np.tile(per_head, batch * heads)
