"""Runs FlashAttention's own tests/test_flash_attn.py, unmodified, on the course (issue 59).

The test file is FlashAttention's, not the course's: it is not committed. Copy it beside this conftest (from a
checkout of Dao-AILab/flash-attention) and run pytest here on the GPU:

    cp flash-attention/tests/test_flash_attn.py python/tests/flash_attn_upstream/
    PYTHONPATH=build/python python3 -m pytest python/tests/flash_attn_upstream -q -p no:cacheprovider \\
        --counts docs/results/python/flash-attn-tests.csv [--sample N] [-n WORKERS]

The file's parameter grids multiply to about half a million tests (test_flash_attn_kvcache alone about 300,000),
days of one GPU. --sample N keeps N of each test function's parameter combinations, drawn at random with the
function's name as the seed (the same N on every run and every pytest-xdist worker), before the tests are made; a
function with N or fewer keeps them all. The counts then say how many of how many ran.

This conftest points the test file's imports (flash_attn, flash_attn.flash_attn_interface, flash_attn.bert_padding,
flash_attn.layers.rotary) at fa_course.flash_attn, reports a test whose call the course refuses by name
(fa_course.flash_attn.Refusal: dropout, ALiBi, a deterministic backward, a problem no step takes) as skipped with
the refusal as its reason, as it does a test that imports one of FlashAttention's internals from its interface
module (the compiled extension flash_attn_gpu, a private _function: not its API, and not in the shim), and writes the pass, fail and skip counts per test function with --counts.
"""
import collections
import csv
import random
import re
import sys

import pytest

import fa_course.flash_attn as _shim
from fa_course.flash_attn import bert_padding, flash_attn_interface
from fa_course.flash_attn.layers import rotary

sys.modules["flash_attn"] = _shim
sys.modules["flash_attn.flash_attn_interface"] = flash_attn_interface
sys.modules["flash_attn.bert_padding"] = bert_padding
sys.modules["flash_attn.layers"] = sys.modules["fa_course.flash_attn.layers"]
sys.modules["flash_attn.layers.rotary"] = rotary

_counts = collections.defaultdict(collections.Counter)  # test function -> outcome -> count
_reasons = collections.defaultdict(collections.Counter)  # test function -> the first line of a refusal -> count


def pytest_addoption(parser):
    parser.addoption("--counts", default=None, help="write per-function pass/fail/skip counts to this CSV")
    parser.addoption("--sample", type=int, default=0, help="keep this many parameter combinations of each function")


_grid = {}  # test function -> (combinations kept, combinations in its grid)


@pytest.hookimpl(hookwrapper=True)
def pytest_generate_tests(metafunc):
    """After pytest has multiplied a function's parametrize marks: keep --sample of the combinations."""
    yield
    calls, keep = metafunc._calls, metafunc.config.getoption("--sample")
    name = metafunc.function.__name__
    if keep and len(calls) > keep:
        chosen = sorted(random.Random(name).sample(range(len(calls)), keep))
        metafunc._calls = [calls[i] for i in chosen]
    _grid[name] = (max(len(metafunc._calls), 1), max(len(calls), 1))  # no parameters: one test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A refusal by name is a skip, its message the reason (in the process that ran the test)."""
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(_shim.Refusal):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, "Skipped: fa_course refuses: " + str(call.excinfo.value))
    elif call.excinfo is not None and call.excinfo.errisinstance(ImportError) and _internal(call.excinfo.value):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, "Skipped: fa_course refuses: the test imports "
                           f"FlashAttention's internal {_internal(call.excinfo.value)!r} (its compiled extension or a private "
                           "function), not part of its Python API")


def _internal(error: ImportError) -> str | None:
    """The name, when the import that failed asked FlashAttention's interface (the shim, here) for one it keeps to
    itself: its compiled extension (flash_attn_gpu) or a private function (_flash_attn_varlen_forward, ...). Any
    other import error stays a failure."""
    found = re.match(r"cannot import name '([^']+)' from '([^']+)'", str(error))
    if found and found.group(2).startswith("fa_course.flash_attn") and (
            found.group(1).startswith("_") or found.group(1) == "flash_attn_gpu"):
        return found.group(1)
    return None


_raw = []  # (function, outcome, reason) of each report, flushed to --counts + ".raw" as they come


def pytest_runtest_logreport(report):
    """Counted where the reports gather (the controller under pytest-xdist's -n, else this process)."""
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        function = report.nodeid.split("::")[-1].split("[")[0]
        reason = ""
        if report.outcome == "skipped":
            text = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            text = text.split("fa_course refuses: ")[-1]
            if ": it needs " in text:  # no step takes the problem: its needs are the reason
                text = "no step takes: " + text.split(": it needs ")[1].split(". The ")[0]
            reason = text[:160]
        _count(function, report.outcome, reason)
        _raw.append((function, report.outcome, reason))
        if _counts_path and len(_raw) >= 200:  # a run cut short by its time keeps what it counted
            _flush_raw()


def _count(function, outcome, reason):
    _counts[function][outcome] += 1
    if outcome == "skipped":
        _reasons[function][reason] += 1


_counts_path = None


def pytest_configure(config):
    global _counts_path
    if not hasattr(config, "workerinput"):
        _counts_path = config.getoption("--counts")
        if _counts_path:
            open(_counts_path + ".raw", "w").close()


def _flush_raw():
    with open(_counts_path + ".raw", "a", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(_raw)
    _raw.clear()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: a worker's grid sizes (the workers collect, the controller does not)."""
    _grid.update(getattr(node, "workeroutput", {}).get("grid", {}))


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller writes
        session.config.workeroutput["grid"] = dict(_grid)
        return
    path = session.config.getoption("--counts")
    if not path:
        return
    _flush_raw()
    _write(path)


def _write(path):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["test", "grid", "sampled", "passed", "failed", "skipped", "skip reasons (count: reason)"])
        for function in sorted(_counts):
            c = _counts[function]
            sampled, grid = _grid.get(function, ("", ""))
            reasons = "; ".join(f"{n}: {r}" for r, n in _reasons[function].most_common())
            writer.writerow([function, grid, sampled, c["passed"], c["failed"], c["skipped"], reasons])


if __name__ == "__main__":  # python3 conftest.py COUNTS.csv: the table from COUNTS.csv.raw (a run cut short)
    with open(sys.argv[1] + ".raw", newline="") as f:
        for function, outcome, reason in csv.reader(f):
            _count(function, outcome, reason)
    _write(sys.argv[1])
