#!/usr/bin/env python3
"""The ctest suite over every GPU of the machine from one queue, resumable across device calls.

    python3 bench/gpu_suite.py [--build build] [--state DIR] [--deadline SECONDS] [--per-gpu N]
                               [--exclude REGEX] [--include REGEX] [--costs FILE] [--keep-logs REGEX]

`ctest -j` runs every test on the GPU the driver picks first, and splitting the suite by ctest's stride (`-I g,,n`)
leaves one GPU idle while the other finishes its longer half. Here every test's command, as
`ctest --show-only=json-v1` gives it, runs with CUDA_VISIBLE_DEVICES set to one GPU, N at a time on each, pulled
from one queue, the longest first (times from --costs, a results file of an earlier run, else the names' hints).
ctest's verdict rules are kept: PASS_REGULAR_EXPRESSION, FAIL_REGULAR_EXPRESSION, SKIP_REGULAR_EXPRESSION (CMake's
regular expressions: `.` matches a newline), SKIP_RETURN_CODE, WILL_FAIL, TIMEOUT, ENVIRONMENT, WORKING_DIRECTORY;
a RUN_SERIAL test runs alone on its GPU, and a test labelled `all-gpus` (ring attention) alone at the end with every
GPU visible. Each verdict is appended to STATE/results.tsv (name, GPU, seconds, passed|failed|skipped|cut): run it
again with the same --state (a later call on the same machine) and only the tests without a verdict, or cut by the
last --deadline, run. A failed or cut test's output goes to STATE/logs/, and a passed one's where its name matches
--keep-logs (the mutation table's first failing case of each mutant, which docs/instructors.md quotes).

Exit status: 0 when every test passed or was skipped, 1 when one failed, 2 when none failed but some are left.
Used by bench/device_session.sh; FA_SUITE_GPUS=n stands in for nvidia-smi's count (0: no CUDA_VISIBLE_DEVICES set).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time

VERDICTS = ("passed", "failed", "skipped")


def load_tests(build: str) -> list[dict]:
    out = subprocess.check_output(["ctest", "--test-dir", build, "--show-only=json-v1"])
    tests = []
    for t in json.loads(out)["tests"]:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        if "command" not in t:  # a test whose executable was not built (ctest reports it as not run)
            props["NOT_BUILT"] = True
        tests.append({"name": t["name"], "command": t.get("command", []), "props": props})
    return tests


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def matches(patterns, text: str) -> bool:
    return any(re.search(p, text, re.DOTALL) for p in as_list(patterns))


def verdict(props: dict, rc: int, out: str) -> str:
    """ctest's verdict of one finished test (cmCTestRunTest::EndTest's order)."""
    fail = False
    if "PASS_REGULAR_EXPRESSION" in props and not matches(props["PASS_REGULAR_EXPRESSION"], out):
        fail = True
    if "FAIL_REGULAR_EXPRESSION" in props and matches(props["FAIL_REGULAR_EXPRESSION"], out):
        fail = True
    if "SKIP_REGULAR_EXPRESSION" in props and matches(props["SKIP_REGULAR_EXPRESSION"], out):
        return "skipped"
    if "SKIP_RETURN_CODE" in props and rc == int(props["SKIP_RETURN_CODE"]):
        return "skipped"
    success = not fail and (rc == 0 or "PASS_REGULAR_EXPRESSION" in props)
    if props.get("WILL_FAIL") in (True, "TRUE", "ON", "1", 1):
        success = not success
    return "passed" if success else "failed"


class Gate:
    """One GPU's tests: many at once, or one RUN_SERIAL test alone (it waits for the GPU to drain, and holds it)."""

    def __init__(self):
        self.cv = threading.Condition()
        self.active = 0
        self.serial = False
        self.waiting = 0

    def enter(self, serial: bool):
        with self.cv:
            if serial:
                self.waiting += 1
                while self.active or self.serial:
                    self.cv.wait()
                self.waiting -= 1
                self.serial = True
            else:
                while self.serial or self.waiting:
                    self.cv.wait()
                self.active += 1

    def leave(self, serial: bool):
        with self.cv:
            if serial:
                self.serial = False
            else:
                self.active -= 1
            self.cv.notify_all()


def gpu_count() -> int:
    if "FA_SUITE_GPUS" in os.environ:
        return int(os.environ["FA_SUITE_GPUS"])
    try:
        return subprocess.check_output(["nvidia-smi", "-L"], stderr=subprocess.DEVNULL).decode().count("GPU ")
    except (OSError, subprocess.CalledProcessError):
        return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--state", default="out/suite", help="folder of results.tsv and logs/ (kept between calls)")
    ap.add_argument("--deadline", type=float, default=None, help="seconds from now: no test starts after it, "
                    "and a test still running at it is stopped and recorded as cut")
    ap.add_argument("--per-gpu", type=int, default=6, help="tests at once on each GPU (default 6)")
    ap.add_argument("--exclude", default=None, help="a regular expression: tests whose name matches do not run")
    ap.add_argument("--include", default=None, help="a regular expression: only tests whose name matches run")
    ap.add_argument("--costs", default=None, help="a results.tsv of an earlier run: its seconds order the queue")
    ap.add_argument("--keep-logs", default=None, help="a regular expression: passed tests whose name matches keep "
                    "their output in STATE/logs/ too")
    args = ap.parse_args(argv)
    # Bad arguments are refused by name before any test runs.
    if not os.path.isfile(os.path.join(args.build, "CTestTestfile.cmake")):
        ap.error(f"--build {args.build}: no CTestTestfile.cmake there; configure and build the tree first "
                 f"(cmake -S . -B {args.build} ... && cmake --build {args.build})")
    if args.per_gpu < 1:
        ap.error(f"--per-gpu {args.per_gpu}: at least 1 test at a time on each GPU")
    if args.deadline is not None and args.deadline <= 0:
        ap.error(f"--deadline {args.deadline:g}: seconds from now, more than 0")
    if args.costs and not os.path.isfile(args.costs):
        ap.error(f"--costs {args.costs}: no such file (a results.tsv of an earlier run)")
    for option in ("include", "exclude", "keep_logs"):
        try:
            re.compile(getattr(args, option) or "")
        except re.error as e:
            ap.error(f"--{option.replace('_', '-')} {getattr(args, option)!r}: not a regular expression ({e})")
    start = time.time()
    deadline = start + args.deadline if args.deadline else float("inf")

    os.makedirs(os.path.join(args.state, "logs"), exist_ok=True)
    results = os.path.join(args.state, "results.tsv")
    final = {}
    if os.path.exists(results):
        for line in open(results):
            f = line.rstrip("\n").split("\t")
            if len(f) == 4:
                final[f[0]] = f[3]
    costs = {}
    if args.costs:
        for line in open(args.costs):
            f = line.rstrip("\n").split("\t")
            if len(f) == 4:
                costs[f[0]] = max(costs.get(f[0], 0.0), float(f[2]))

    every = load_tests(args.build)
    chosen = [t for t in every
              if (not args.include or re.search(args.include, t["name"]))
              and (not args.exclude or not re.search(args.exclude, t["name"]))]
    todo = [t for t in chosen if final.get(t["name"]) not in VERDICTS]

    def hint(t):  # without recorded times: the large problems, the backward's gradients and Python's scripts first
        n = t["name"]
        return 3 * ("large" in n) + 2 * ("backward" in n) + 2 * n.startswith("gpu/python") + n.startswith("step")

    todo.sort(key=lambda t: (-costs.get(t["name"], 0.0), -hint(t)))
    alone = [t for t in todo if "all-gpus" in as_list(t["props"].get("LABELS", []))]
    shared = [t for t in todo if t not in alone]
    gpus = gpu_count()
    groups = list(range(gpus)) if gpus else [None]
    print(f"{len(todo)} of {len(chosen)} tests to run ({len(chosen) - len(todo)} with a verdict already), "
          f"{gpus} GPU(s) x {args.per_gpu}", flush=True)

    lock = threading.Lock()
    tally = {}

    def record(t, where, seconds, result, out):
        with lock:
            with open(results, "a") as f:
                f.write(f"{t['name']}\t{where}\t{seconds:.1f}\t{result}\n")
            final[t["name"]] = result
            tally[result] = tally.get(result, 0) + 1
            bad = result in ("failed", "cut")
            if bad or (args.keep_logs and re.search(args.keep_logs, t["name"])):
                safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", t["name"])[:150]
                with open(os.path.join(args.state, "logs", safe + ".log"), "w") as f:
                    f.write(out)
            if bad:
                print(f"{result.upper()}: {t['name']} ({seconds:.0f} s)", flush=True)

    def run(t, gpu):
        props = t["props"]
        if props.get("NOT_BUILT"):
            return "failed", 0.0, "not built: its executable is missing"
        env = dict(os.environ)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        for kv in as_list(props.get("ENVIRONMENT", [])):
            key, _, value = kv.partition("=")
            env[key] = value
        limit = deadline - time.time()
        if "TIMEOUT" in props:
            limit = min(limit, float(props["TIMEOUT"]))
        t0 = time.time()
        try:
            p = subprocess.run(t["command"], cwd=props.get("WORKING_DIRECTORY", args.build), env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=None if limit == float("inf") else max(1.0, limit))
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace")
            # Past its own TIMEOUT a test fails, as in ctest; stopped by the deadline it is only cut.
            cut = time.time() >= deadline - 1
            return ("cut" if cut else "failed"), time.time() - t0, out + "\n[stopped: time limit]\n"
        out = p.stdout.decode(errors="replace")
        return verdict(props, p.returncode, out), time.time() - t0, out

    work = queue.Queue()
    for t in shared:
        work.put(t)
    gates = {g: Gate() for g in groups}

    def worker(gpu):
        while time.time() < deadline:
            try:
                t = work.get_nowait()
            except queue.Empty:
                return
            serial = bool(t["props"].get("RUN_SERIAL"))
            gates[gpu].enter(serial)
            try:
                result, seconds, out = run(t, gpu)
            finally:
                gates[gpu].leave(serial)
            record(t, "-" if gpu is None else str(gpu), seconds, result, out)

    threads = [threading.Thread(target=worker, args=(g,)) for g in groups for _ in range(args.per_gpu)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in alone:
        if time.time() >= deadline:
            break
        result, seconds, out = run(t, None)
        record(t, "all", seconds, result, out)

    counts = {v: 0 for v in VERDICTS}
    for t in chosen:
        counts[final.get(t["name"], "left")] = counts.get(final.get(t["name"], "left"), 0) + 1
    left = len(chosen) - sum(counts[v] for v in VERDICTS)
    print(f"suite: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, {left} left "
          f"(cut or not reached) of {len(chosen)} tests; this call ran {sum(tally.values())} in "
          f"{time.time() - start:.0f} s", flush=True)
    return 1 if counts["failed"] else 2 if left else 0


if __name__ == "__main__":
    sys.exit(main())
