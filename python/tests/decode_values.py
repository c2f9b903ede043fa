#!/usr/bin/env python3
"""The module checks values, not only shapes, without a host sync on the decode path (issue 55). Needs a GPU and
PyTorch; exits 77 (ctest: skipped) without them.

- A page-table entry past the pool (of a page the sequence's length reaches) is never read: a ValueError naming
  page_table[b][i] comes at the next call on the device, or at fa_course.check(); the CUDA context still works and a
  right call after it gives the right answer. Entries past a sequence's length may hold anything (-1, 2^31 - 1).
- A length past the capacity, or negative: a ValueError naming kv_lens[b], the same way.
- A misaligned workspace (a uint8 tensor's slice [1:]) and an output over an input are refused before the launch;
  a workspace full of garbage gives the right answer (the module zeroes it), forward and backward.
- The caller's current device is given back after a call on another device (needs 2 GPUs).
- A decode step (46 and 45, paged and contiguous, with kv_lens) captured once in a CUDA graph through
  fa_course.torch and replayed on new values written in place (new q, new lengths): the same bits as the eager
  call, and the float64 reference.
- A call from a side stream whose kernel writing kv_lens was queued on that stream: the kernel reads what that
  kernel wrote (no read-back that races it).

    PYTHONPATH=build/python python3 python/tests/decode_values.py      # or: decode_values.py BUILD/python
    FA_CHECKS="graph" python3 python/tests/decode_values.py             # only the checks whose names contain it

Prints PASS, SKIP or FAIL per check and a summary; exits 1 if any failed.
"""
from __future__ import annotations

import math
import os
import sys
import traceback

if len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch
except ImportError:
    print("skipped: PyTorch is not installed")
    sys.exit(77)
if not torch.cuda.is_available():
    print("skipped: no CUDA device")
    sys.exit(77)

import fa_course  # noqa: E402
import fa_course.torch as fat  # noqa: E402
from flash_attn_shapes import forward_for, runs_here  # noqa: E402

B, HQ, HKV, D, CAPACITY, PAGE = 4, 8, 2, 128, 256, 16
PER_SEQ = CAPACITY // PAGE
DTYPE = torch.bfloat16
LENS = [100, 256, 1, 37]
STEPS = ["46", "45"]


class Skip(Exception):
    """A check that cannot run here, with the reason."""


def make(paged: bool, lens: list[int], seed: int = 0, device="cuda") -> dict:
    """A decode case: q [B, 1, HQ, D]; the keys and values k_src, v_src valid at every place; the cache (k, v, or
    the pools kp, vp and the page table: pages in a shuffled order, as many unused again) holding them up to each
    length and NaN past it, so that a read past a length shows."""
    gen = torch.Generator(device=device).manual_seed(seed)
    c = dict(device=device, paged=paged)
    c["q"] = torch.randn(B, 1, HQ, D, device=device, dtype=DTYPE, generator=gen)
    c["k_src"] = torch.randn(B, CAPACITY, HKV, D, device=device, dtype=DTYPE, generator=gen)
    c["v_src"] = torch.randn(B, CAPACITY, HKV, D, device=device, dtype=DTYPE, generator=gen)
    c["k"], c["v"] = torch.empty_like(c["k_src"]), torch.empty_like(c["v_src"])
    c["lens"] = torch.tensor(lens, dtype=torch.int32, device=device)
    if paged:
        order = torch.randperm(2 * B * PER_SEQ, generator=torch.Generator().manual_seed(seed + 1))[: B * PER_SEQ]
        c["table"] = order.view(B, PER_SEQ).to(torch.int32).to(device)
        c["kp"] = torch.full((2 * B * PER_SEQ, PAGE, HKV, D), float("nan"), device=device, dtype=DTYPE)
        c["vp"] = torch.full_like(c["kp"], float("nan"))
    fill(c, lens)
    return c


def fill(c: dict, lens: list[int]) -> None:
    """Writes the cache in place for these lengths (the tensors keep their memory: a captured graph reads them)."""
    for name in ("k", "v"):
        c[name].copy_(c[name + "_src"])
        for b, n in enumerate(lens):
            c[name][b, n:] = float("nan")
        if c["paged"]:
            c[name + "p"][c["table"].long().flatten()] = c[name].reshape(B * PER_SEQ, PAGE, HKV, D)


def call(c: dict, step: str):
    """O and LSE of decode step `step` on case c, through fa_course.torch."""
    if c["paged"]:
        return fat.forward(step, c["q"], c["kp"], c["vp"], kv_lens=c["lens"], page_table=c["table"])
    return fat.forward(step, c["q"], c["k"], c["v"], kv_lens=c["lens"])


def reference(c: dict, lens: list[int]) -> torch.Tensor:
    """O in float64 from the valid keys and values: sequence b attends to its first lens[b]."""
    q = c["q"].double()
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for b, n in enumerate(lens):
        k = c["k_src"][b, :n].double().repeat_interleave(HQ // HKV, dim=1)
        v = c["v_src"][b, :n].double().repeat_interleave(HQ // HKV, dim=1)
        p = (torch.einsum("thd,shd->hts", q[b], k) / math.sqrt(D)).softmax(-1)
        out[b] = torch.einsum("hts,shd->thd", p, v)
    return out


def assert_right(out: torch.Tensor, c: dict, lens: list[int], what: str) -> None:
    """out against the float64 reference: a few bfloat16 roundings of O's size (NaN fails)."""
    ref = reference(c, lens)
    error = (out.double() - ref).abs().max().item()
    bound = 4 * 2.0 ** -8 * max(1.0, ref.abs().max().item())
    assert error <= bound, f"{what}: O max error {error:.3g} > {bound:.3g}"


def refused(call_it, *words: str) -> str:
    """The ValueError's message of call_it(), which must refuse with every one of `words` in it."""
    try:
        call_it()
    except ValueError as error:
        message = str(error)
        for w in words:
            assert w in message, f"expected {w!r} in: {message}"
        return message
    raise AssertionError(f"no ValueError (expected {words})")


def next_call_reports(c: dict, step: str, *words: str) -> None:
    """After the faulty call's kernel has finished (a plain torch sync, not fa_course.check), the next call on the
    device raises the fault: fa_course.torch.forward's first module call (workspace_bytes) reads the record."""
    torch.cuda.synchronize(c["device"])
    refused(lambda: call(c, step), *words, "reported by the next call on it")


# -- the checks ---------------------------------------------------------------------------------------------------

def page_past_the_pool(step: str) -> None:
    c = make(True, LENS)
    pages = c["kp"].shape[0]
    right = c["table"].clone()
    c["table"][0, 3] = pages + 13  # sequence 0 (100 keys) reaches page 3 (keys 48 .. 63)
    call(c, step)
    refused(fa_course.check, f"page_table[0][3] = {pages + 13} is outside the pool's pages 0 .. {pages - 1}",
            "reported by fa_course.check()")
    fa_course.check()  # the record was cleared
    c["table"].copy_(right)
    c["table"][1, 0] = -1  # sequence 1 (256 keys) reaches every page
    call(c, step)
    next_call_reports(c, step, f"page_table[1][0] = -1 is outside the pool's pages 0 .. {pages - 1}")
    c["table"].copy_(right)
    out, _ = call(c, step)  # the context still works: the right call, the right answer
    torch.cuda.synchronize()
    fa_course.check()
    assert_right(out, c, LENS, "after the faults")


def garbage_past_the_length(step: str) -> None:
    c = make(True, LENS)
    c["table"][0, 7:] = -1           # sequence 0: 100 keys, pages 0 .. 6
    c["table"][0, -1] = 2 ** 31 - 1
    c["table"][2, 1:] = -5           # sequence 2: 1 key, page 0
    c["table"][3, 3:] = 2 ** 31 - 1  # sequence 3: 37 keys, pages 0 .. 2
    out, _ = call(c, step)
    fa_course.check()  # no fault: entries past a length are never a key's
    assert_right(out, c, LENS, "garbage past the lengths")


def lengths_out_of_range(step: str) -> None:
    for paged in (False, True):
        c = make(paged, LENS)
        c["lens"].copy_(torch.tensor([CAPACITY + 1, 5, 5, 5], dtype=torch.int32))
        call(c, step)
        refused(fa_course.check, f"kv_lens[0] = {CAPACITY + 1} is outside 0 .. kv_len = {CAPACITY}")
        c["lens"].copy_(torch.tensor([5, -1, 5, 5], dtype=torch.int32))
        call(c, step)
        next_call_reports(c, step, f"kv_lens[1] = -1 is outside 0 .. kv_len = {CAPACITY}")
        c["lens"].copy_(torch.tensor(LENS, dtype=torch.int32))
        out, _ = call(c, step)
        torch.cuda.synchronize()
        fa_course.check()
        assert_right(out, c, LENS, f"after the faults ({'paged' if paged else 'contiguous'})")


def workspace_misaligned_or_dirty() -> None:
    c = make(False, LENS)
    q, k, v, lens = c["q"], c["k"], c["v"], c["lens"]
    size = fa_course.workspace_bytes("46", q, k, v, kv_lens=lens)
    stream = torch.cuda.current_stream().cuda_stream
    raw = torch.empty(size + 1, dtype=torch.uint8, device="cuda")
    out = torch.empty_like(q)
    refused(lambda: fa_course.forward("46", q, k, v, out, workspace=raw[1:], kv_lens=lens, stream=stream),
            "(workspace)", "aligned")
    refused(lambda: fa_course.forward("46", q, k, v, out, workspace=raw[: size - 1], kv_lens=lens, stream=stream),
            f"needs {size} bytes; got {size - 1}")
    dirty = torch.full((size,), 0x7F, dtype=torch.uint8, device="cuda")  # 3.4e38 as float
    fa_course.forward("46", q, k, v, out, workspace=dirty, kv_lens=lens, stream=stream)
    torch.cuda.synchronize()
    fa_course.check()
    assert_right(out, c, LENS, "a dirty workspace, then the context after a misaligned one")
    # The backward: dQ is summed into the workspace; garbage there must not reach dQ.
    arch = 10 * torch.cuda.get_device_capability()[0] + torch.cuda.get_device_capability()[1]
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(2, 96, h, 64, device="cuda", dtype=torch.float16, generator=gen) for h in (4, 2, 2))
    o, lse = fat.forward(forward_for("f16", 64, arch, fa_course.steps()), q, k, v)
    g = torch.randn(o.shape, device="cuda", dtype=torch.float16, generator=gen)
    dq0, dk0, dv0 = fat.backward("27", q, k, v, o, lse, g)
    dirty = torch.full((fa_course.workspace_bytes("27", q, k, v),), 0x7F, dtype=torch.uint8, device="cuda")
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    fa_course.backward("27", q, k, v, o, lse, g, dq, dk, dv, workspace=dirty, stream=stream)
    torch.cuda.synchronize()
    for name, ours, clean in (("dQ", dq, dq0), ("dK", dk, dk0), ("dV", dv, dv0)):
        error = (ours.float() - clean.float()).abs().max().item()  # atomics may sum in another order
        assert error <= 1e-2 * max(1.0, clean.float().abs().max().item()), f"{name} with a dirty workspace: {error}"


def outputs_over_inputs() -> None:
    c = make(False, LENS)
    q, k, v, lens = c["q"], c["k"], c["v"], c["lens"]
    stream = torch.cuda.current_stream().cuda_stream
    refused(lambda: fa_course.forward("46", q, k, v, q, kv_lens=lens, stream=stream), "out overlaps q")
    lse_over_lens = torch.empty(B * HQ, dtype=torch.float32, device="cuda")
    refused(lambda: fa_course.forward("46", q, k, v, torch.empty_like(q), lse=lse_over_lens.view(B, HQ, 1),
                                      kv_lens=lse_over_lens[:B].view(torch.int32), stream=stream),
            "lse overlaps kv_lens")
    gen = torch.Generator(device="cuda").manual_seed(4)
    q, k, v, o, g = (torch.randn(2, 64, h, 64, device="cuda", dtype=torch.float16, generator=gen)
                     for h in (4, 2, 2, 4, 4))
    lse = torch.zeros(2, 4, 64, device="cuda")
    dk_over_q = q.view(-1)[: k.numel()].view(k.shape)
    refused(lambda: fa_course.backward("27", q, k, v, o, lse, g, torch.empty_like(q), dk_over_q,
                                       torch.empty_like(v), stream=stream), "dk overlaps q")
    out, _ = call(make(False, LENS), "46")  # the context still works
    torch.cuda.synchronize()


def device_given_back() -> None:
    if torch.cuda.device_count() < 2:
        raise Skip("needs 2 GPUs; this machine has 1")
    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda:0")  # device 0's context exists: PyTorch sets it for real
    c = make(False, LENS, device="cuda:1")
    out, _ = call(c, "46")
    assert torch.cuda.current_device() == 0, f"after a call on device 1: current device {torch.cuda.current_device()}"
    assert out.device == torch.device("cuda:1")
    torch.cuda.synchronize("cuda:1")
    assert_right(out, c, LENS, "on device 1")
    raw = torch.empty(1 << 20, dtype=torch.uint8, device="cuda:1")
    refused(lambda: fa_course.forward("46", c["q"], c["k"], c["v"], torch.empty_like(c["q"]), workspace=raw[1:],
                                      kv_lens=c["lens"], stream=torch.cuda.current_stream(1).cuda_stream),
            "(workspace)")
    assert torch.cuda.current_device() == 0, "after a refused call on device 1"
    fa_course.check(torch.device("cuda:1"))
    assert torch.cuda.current_device() == 0, "after fa_course.check(cuda:1)"


def graph_replay(step: str, paged: bool) -> None:
    c = make(paged, LENS)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up PyTorch asks for (it also makes the device's status record)
        for _ in range(2):
            call(c, step)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_lse = call(c, step)
    new_lens = [200, 3, 64, 255]
    c["q"].copy_(torch.randn(c["q"].shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(9)))
    c["lens"].copy_(torch.tensor(new_lens, dtype=torch.int32))
    fill(c, new_lens)
    graph.replay()
    torch.cuda.synchronize()
    fa_course.check()
    eager_out, eager_lse = call(c, step)
    torch.cuda.synchronize()
    assert torch.equal(static_out, eager_out), "the replay's O differs from the eager call's"
    assert torch.equal(static_lse, eager_lse), "the replay's LSE differs from the eager call's"
    assert_right(static_out, c, new_lens, "the replay")
    graph.replay()  # a second replay, on the same values: the same bits
    torch.cuda.synchronize()
    assert torch.equal(static_out, eager_out), "a second replay differs"


def side_stream_writes_lengths() -> None:
    c = make(False, LENS)
    new_lens = [30, 200, 7, 256]
    fill(c, new_lens)
    c["lens"].fill_(-7)  # what a read that does not wait for the side stream would see (a refused length)
    new = torch.tensor(new_lens, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()  # PyTorch's streams do not wait for the legacy default stream
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time before the lengths are written
        c["lens"].copy_(new)
        out, _ = call(c, "46")
    torch.cuda.synchronize()
    fa_course.check()  # nothing refused: the kernel read the lengths the side stream wrote
    assert_right(out, c, new_lens, "a call from the side stream")


def main() -> int:
    arch = 10 * torch.cuda.get_device_capability()[0] + torch.cuda.get_device_capability()[1]
    listed = {s["label"]: s for s in fa_course.steps()}
    steps = [s for s in STEPS if runs_here(listed[s], arch)]
    if not steps:
        print(f"skipped: steps {', '.join(STEPS)} need {listed[STEPS[0]]['min_gpu']}; this GPU is sm_{arch}")
        return 77
    checks = [(f"page past the pool, step {s}", page_past_the_pool, (s,)) for s in steps]
    checks += [(f"garbage past the lengths, step {s}", garbage_past_the_length, (s,)) for s in steps]
    checks += [(f"lengths out of range, step {s}", lengths_out_of_range, (s,)) for s in steps]
    checks += [("outputs over inputs", outputs_over_inputs, ()),
               ("the caller's device given back", device_given_back, ())]
    checks += [(f"CUDA graph replay, step {s} {'paged' if paged else 'contiguous'}", graph_replay, (s, paged))
               for s in steps for paged in (False, True)]
    checks += [("a side stream writes kv_lens", side_stream_writes_lengths, ()),
               ("workspace misaligned, small or dirty", workspace_misaligned_or_dirty, ())]
    wanted = os.environ.get("FA_CHECKS", "")
    checks = [c for c in checks if wanted in c[0]]
    failed = skipped = 0
    for name, check, args in checks:
        try:
            fa_course.check()  # a fault left by an earlier check would be this one's
            check(*args)
            fa_course.check()
            print(f"PASS {name}", flush=True)
        except Skip as reason:
            skipped += 1
            print(f"SKIP {name}: {reason}", flush=True)
        except Exception:  # noqa: BLE001 -- report and go on
            failed += 1
            print(f"FAIL {name}:\n{traceback.format_exc()}", flush=True)
    print(f"{len(checks)} checks, {failed} failed, {skipped} skipped (steps {', '.join(steps) or 'none'} run here)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
