#!/usr/bin/env python3
"""Scheduling models for steps 10-13 and 22-24: which work waits for what, in time units of a model.

These are *models*, not measurements: every latency and cost is a parameter, every
result is arithmetic on those parameters. The notebooks that go with the steps
(notebooks/10_async_pipeline, 12_boundary_masking, 13_causal_order) import this
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

* ``SM`` is a cycle model of one SM running the consumer warpgroups of steps 22-24
  (notebooks 23_pingpong and 24_intra_warpgroup_overlap). Each warpgroup is a Python
  generator of operations, in the order the kernel issues them:

  * ``("wgmma", label, n, cycles)``: n wgmmas of ``cycles`` each, one commit group, issued to the tensor
    cores (unit ``tc``), which run them in issue order; the warpgroup goes on at once.
  * ``("wait_group", N)`` or ``("wait_group", N, latency)``: wait until at most the N newest of its groups
    are unfinished (``wgmma.wait_group N``), plus an optional latency after the last one lands.
  * ``("softmax", label, cycles)``: softmax work on the exponential/FP32 pipes (unit ``sfu``, shared by the
    warpgroups unless ``SM(shared_softmax=False)``), split into pieces of ``quantum`` cycles.
  * ``("sync", id)``, ``("arrive", id)``, ``("syncthreads",)``: named barrier ``id`` (``bar.sync`` /
    ``bar.arrive`` of 256 threads) or barrier 0.

  ``SM().run(programs)`` returns "done" or "deadlock: ..."; ``sm.log`` holds what ran when,
  ``sm.busy()`` the tensor cores' busy fraction, and ``draw(ax, sm, title)`` draws it as a Gantt chart
  on a matplotlib axis. Its costs are the notebooks' stated assumptions.

Only numpy; import it (``import schedule_models``) from notebooks/tests.
"""
from __future__ import annotations

import heapq
from collections import deque
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


# ---- Steps 22-24: the consumer warpgroups of one SM, cycle by cycle (notebooks 23, 24) ----

kGroupThreads = 128                    # threads in a warpgroup
kConsumerThreads = 2 * kGroupThreads   # the two consumers: a turn barrier's phase counts them
kTurn = 1                              # named barrier kTurn + w is consumer w's turn (steps 23-24)


class ProtocolError(Exception):
    pass

class NamedBarrier:
    """bar.sync / bar.arrive with a thread count: a phase completes when `threads` threads have come; syncs wait."""
    def __init__(self, bid, threads=kConsumerThreads):
        self.bid, self.threads, self.count, self.members, self.phases = bid, threads, 0, [], []
    def come(self, wg, kind, threads=kGroupThreads):
        self.count += threads
        self.members.append((wg, kind))
        if self.count < self.threads:
            return None
        if self.count > self.threads:
            raise ProtocolError(f"barrier {self.bid}: {self.count} threads in one phase of {self.threads}")
        self.phases.append(tuple(self.members))
        released = [w for w, k in self.members if k == "sync"]
        self.count, self.members = 0, []
        return released

class Unit:
    """An execution unit of the SM in the model: one piece of work at a time, in issue order.
    `slots`: how many pieces may wait (None: any number); `per_wg`: pieces one warpgroup may have in it at once."""
    def __init__(self, name, slots=None, per_wg=None):
        self.name, self.slots, self.per_wg = name, slots, per_wg
        self.queue, self.current, self.busy, self.last = deque(), None, [], None
    def accepts(self, wg):
        if self.slots is not None and len(self.queue) >= self.slots:
            return False
        mine = sum(p[0].wg == wg for p in self.queue) + (self.current is not None and self.current[0].wg == wg)
        return self.per_wg is None or mine < self.per_wg

class Group:
    """A commit group of wgmmas, or one softmax: n pieces of `cycles` each."""
    def __init__(self, wg, unit, label, n, cycles):
        self.wg, self.unit, self.label, self.n, self.cycles = wg, unit, label, n, cycles
        self.issued, self.left, self.start, self.end = 0, n, None, None

class SM:
    def __init__(self, tc_slots=None, quantum=32, shared_softmax=True):
        self.units = {"tc": Unit("tc", slots=tc_slots), "sfu": Unit("sfu", per_wg=1),
                      "sfu0": Unit("sfu0", per_wg=1), "sfu1": Unit("sfu1", per_wg=1)}
        self.quantum, self.shared_softmax, self.now = quantum, shared_softmax, 0.0
        self.bars = {0: NamedBarrier(0), kTurn: NamedBarrier(kTurn), kTurn + 1: NamedBarrier(kTurn + 1)}
        self.log = []                                  # (wg, what, label, start, end): pieces run, waits, softmaxes
        self.turns = []                                # (time, wg): a sync on a turn barrier released wg
        self.timers = []                               # moments something happens outside the units (notebook 24, sec. 5)

    def _op(self, w, op):
        kind = op[0]
        if kind == "wgmma":                            # issue n wgmmas, one commit group; async
            g = Group(w["id"], "tc", op[1], op[2], op[3])
            w["groups"].append(g)
            w["state"] = ("issue", g)
        elif kind == "softmax":
            n = max(1, round(op[2] / self.quantum))
            unit = "sfu" if self.shared_softmax else f"sfu{w['id']}"
            w["state"] = ("issue", Group(w["id"], unit, op[1], n, op[2] / n))
        elif kind == "wait_group":                     # ("wait_group", N) or ("wait_group", N, latency)
            need = w["groups"][:len(w["groups"]) - op[1]]
            latency = op[2] if len(op) > 2 else 0.0               # notebook 23 gives none
            w["state"] = ("wait", lambda need=need: all(g.left == 0 for g in need), "wgmma", self.now, need, latency)
        elif kind in ("sync", "arrive", "syncthreads"):
            b = 0 if kind == "syncthreads" else op[1]
            if kind != "arrive":
                w["state"] = ("barrier", b, self.now)
            released = self.bars[b].come(w["id"], "arrive" if kind == "arrive" else "sync")
            for x in released or []:
                x = self.wgs[x]
                if x["state"][2] < self.now:
                    self.log.append((x["id"], "wait", "turn" if b else "sync", x["state"][2], self.now))
                if b:
                    self.turns.append((self.now, x["id"]))
                x["state"] = None

    def run(self, programs):
        """programs[w]: a generator of warpgroup w's operations. Returns "done" or "deadlock: ..."."""
        self.wgs = wgs = [dict(id=i, gen=p, state=None, groups=[], done=False) for i, p in enumerate(programs)]
        while True:
            moved = True
            while moved:                               # everything that happens at this moment
                moved = False
                for w in wgs:
                    st = w["state"]
                    if w["done"]:
                        continue
                    if st is None:
                        op = next(w["gen"], None)
                        if op is None:
                            w["done"] = True
                        else:
                            self._op(w, op)
                        moved = True
                    elif st[0] == "wait" and st[1]():
                        if st[3] < self.now:
                            self.log.append((w["id"], "wait", st[2], st[3], self.now))
                        ready = max([g.end for g in st[4]] + [self.now - st[5]]) + st[5]
                        w["state"], moved = ("delay", ready, "latency", self.now) if ready > self.now else None, True
                    elif st[0] == "softmax" and st[1].left == 0:
                        self.log.append((w["id"], "softmax", st[1].label, st[1].start, self.now))
                        w["state"], moved = None, True
                    elif st[0] == "delay" and st[1] <= self.now:
                        if st[3] < self.now:
                            self.log.append((w["id"], "delay", st[2], st[3], self.now))
                        w["state"], moved = None, True
                for u in self.units.values():          # issue, round robin among the warpgroups issuing
                    while True:
                        who = [w for w in wgs if w["state"] and w["state"][0] == "issue"
                               and w["state"][1].unit == u.name and u.accepts(w["id"])]
                        if not who:
                            break
                        w = min(who, key=lambda w: (w["id"] == u.last, w["id"]))
                        g = w["state"][1]
                        u.queue.append((g, self.now))
                        g.issued, u.last, moved = g.issued + 1, w["id"], True
                        if g.start is None:
                            g.start = self.now
                        if g.issued == g.n:            # wgmmas: go on; softmax: wait until its last piece ran
                            w["state"] = None if u.name == "tc" else ("softmax", g)
                    if u.current is None and u.queue:
                        g, _ = u.queue.popleft()
                        u.current, moved = (g, self.now, self.now + g.cycles), True
            if all(w["done"] for w in wgs):
                return "done"
            running = [u.current[2] for u in self.units.values() if u.current]
            running += [w["state"][1] for w in wgs if w["state"] and w["state"][0] == "delay"]
            running += [t for t in self.timers if t > self.now]
            if not running:
                stuck = [f"warpgroup {w['id']} waits on barrier {w['state'][1]}" for w in wgs
                         if not w["done"] and w["state"] and w["state"][0] == "barrier"]
                return "deadlock: " + ", ".join(stuck)
            self.now = min(running)
            for u in self.units.values():
                if u.current and u.current[2] <= self.now:
                    g, a, b = u.current
                    u.busy.append((a, b))
                    self.log.append((g.wg, u.name, g.label, a, b))
                    g.left -= 1
                    if g.left == 0:
                        g.end = b
                    u.current = None

    def busy(self, unit="tc", t0=0.0, t1=None):
        t1 = self.now if t1 is None else t1
        return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in self.units[unit].busy) / (t1 - t0)


COLORS = {"S": "tab:green", "PV": "tab:purple", "sm": "tab:red", "rs": "tab:orange", "wait": "lightgray",
          "delay": "khaki"}

def merged(log, wg, unit):
    """Runs of consecutive pieces of one group on a unit, as (label, start, end)."""
    out = []
    for w, u, label, a, b in sorted((x for x in log if x[0] == wg and x[1] == unit), key=lambda x: x[3]):
        if out and out[-1][0] == label and abs(out[-1][2] - a) < 1e-9:
            out[-1][2] = b
        else:
            out.append([label, a, b])
    return out

def draw(ax, sm, title, t1=None):
    n = len(sm.wgs)
    for wg in range(n):
        y = n + 1 - wg
        for w, what, label, a, b in sm.log:
            if w != wg or what not in ("wait", "softmax", "delay"):
                continue
            key = {"wait": "wait", "delay": "delay"}.get(what, label.rstrip("0123456789"))
            ax.broken_barh([(a, b - a)], (y - 0.35, 0.7), color=COLORS[key], edgecolor="k" if what == "softmax" else None,
                           lw=0.4)
            if what == "softmax" and key == "sm":
                ax.text((a + b) / 2, y, f"softmax {label[2:]}", ha="center", va="center", fontsize=7)
        for label, a, b in merged(sm.log, wg, "tc"):
            ax.broken_barh([(a, b - a)], (1 - 0.35, 0.7), color=COLORS[label.rstrip("0123456789")],
                           edgecolor="k", lw=0.4, alpha=1.0 if wg == 0 else 0.55, hatch=None if wg == 0 else "//")
            if b - a >= 256:
                ax.text((a + b) / 2, 1, f"{wg}:{label}" if n > 1 else label, ha="center", va="center", fontsize=7)
    ax.set_yticks(list(range(n + 1, 0, -1)), [f"warpgroup {w}" for w in range(n)] + ["tensor cores"], fontsize=8)
    ax.set_xlim(0, t1 or sm.now)
    ax.set_title(title, fontsize=10)
