#!/usr/bin/env python3
"""Ring attention (fa_course.context_parallel.ring) and its all-to-all form (Ulysses, .ulysses_torch) on the GPUs of
one host against one GPU's attention of the same problem (issue 60). Needs 2 or more CUDA devices and PyTorch; exits
77 ("skipped: ...") otherwise.

Every rank runs the whole problem on its own GPU too: a float32 reference and PyTorch in bf16 (attention_reference.py,
beside this script), and the course's single-GPU steps. The ring's O, dQ, dK and dV of the rank's rows (the zigzag
share when causal, the contiguous one when not) are held to FlashAttention's error rule: the error against the float32
computation at most twice PyTorch's own in bf16. The single-GPU steps' error is printed beside it. Ulysses, on the
same shares, is held to the same rule where the heads divide (Hq = 8, Hkv = 2: 2, 4 or 8 GPUs; on others it is
skipped with the refusal printed).

    PYTHONPATH=build/python python3 python/tests/ring_attention.py           # one process per GPU (spawned)
    PYTHONPATH=build/python torchrun --nproc-per-node 2 python/tests/ring_attention.py

Passed on 2 H200s (session 19: docs/results/runs/h200-2026-11-29-session-19.txt); in ctest with the module's other
GPU scripts (skipped on a host of one GPU).
"""
import os
import socket
import sys

# NVLink multicast off before NCCL or PyTorch's symmetric memory starts: a program that uses it can put shared GPUs
# out of service (issue 60). Spawned processes inherit these.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_reference import reference  # noqa: E402


def steps_for(q_len, kv_len):
    """The course's fastest forward and backward steps for this GPU that take a q_len x kv_len block (bf16, d = 128,
    causal top-left; the ring's blocks: chunk x 2 chunk; Ulysses': the whole sequence), by fa_course.flash_attn's own
    choice."""
    import fa_course
    from fa_course.flash_attn.choose import Problem, choose
    capability = torch.cuda.get_device_capability()
    return tuple(choose(fa_course.steps(), Problem(pass_, "bf16", 128, q_len, kv_len, causal=True), capability,
                        "a context-parallel block") for pass_ in ("forward", "backward"))


def check(rank, world, n, causal, steps, device, form="ring"):
    """One problem: returns the number of failures on this rank, and prints its line."""
    from fa_course import torch as fat
    from fa_course.context_parallel import plan
    from fa_course.context_parallel.ring import ring_attention
    from fa_course.context_parallel.ulysses_torch import ulysses_attention
    gen = torch.Generator().manual_seed(n * 10 + causal)  # the same whole problem on every rank
    q = torch.randn(2, n, 8, 128, generator=gen).to(device, torch.bfloat16)
    k, v = (torch.randn(2, n, 2, 128, generator=gen).to(device, torch.bfloat16) for _ in range(2))
    g = torch.randn(2, n, 8, 128, generator=gen).to(device, torch.bfloat16)
    rows = torch.tensor(plan.split_indices(n, world, "zigzag" if causal else "contiguous")[rank], device=device)

    local = [x[:, rows].clone().requires_grad_() for x in (q, k, v)]
    out = (ring_attention if form == "ring" else ulysses_attention)(*local, causal, steps[0], steps[1])
    got = (out,) + torch.autograd.grad(out, local, g[:, rows])

    def whole(fn, **kw):  # O and the gradients of the whole problem, at this rank's rows
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        o = fn(*leaves, **kw)
        return tuple(t[:, rows] for t in (o,) + torch.autograd.grad(o, leaves, g))
    ref = whole(reference, causal=causal)
    pt = whole(reference, causal=causal, upcast=False)
    one = whole(fat.attention, forward_step=steps[0], backward_step=steps[1], causal=causal)

    err = lambda a, r: (a.float() - r.float()).abs().max().item()  # noqa: E731
    worst = [(name, err(a, r), err(p, r), err(o, r)) for name, a, r, p, o in zip(("O", "dQ", "dK", "dV"), got, ref,
                                                                                   pt, one)]
    ok = all(e == e and e <= 2 * e_pt for _, e, e_pt, _ in worst)  # e == e: not NaN
    print(f"{form}: rank {rank}/{world}, n {n}, {'causal zigzag' if causal else 'not causal'}, "
          f"steps {steps[0]}/{steps[1]}: "
          f"{'passed' if ok else 'FAILED'} (" + ", ".join(f"{name} {e:.2g} vs PyTorch {p:.2g}, one GPU {o:.2g}"
                                                           for name, e, p, o in worst) + ")", flush=True)
    return 0 if ok else 1


def worker(local_rank, world):
    """One rank: its GPU, the process group, every problem; exits 1 if any rank failed any."""
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    if world is None:  # torchrun: the environment names the rank, the world and the rendezvous
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("nccl", rank=local_rank, world_size=world)
    rank, world = dist.get_rank(), dist.get_world_size()
    from fa_course.context_parallel.ulysses import head_split
    failures = 0
    for chunk in (97, 256):  # tokens a chunk (2 chunks a rank): an odd one leaves every block a tail
        n = 2 * world * chunk
        steps = steps_for(chunk, 2 * chunk)
        for causal in (True, False):
            failures += check(rank, world, n, causal, steps, device)
        try:
            head_split(8, 2, world)
        except ValueError as e:
            if rank == 0:
                print(f"ulysses: skipped on {world} GPUs: {e}", flush=True)
            continue
        steps = steps_for(n, n)
        for causal in (True, False):
            failures += check(rank, world, n, causal, steps, device, "ulysses")
    total = torch.tensor([failures], device=device)
    dist.all_reduce(total)
    dist.destroy_process_group()
    if rank == 0:
        verdict = "passed" if total.item() == 0 else f"{total.item()} FAILED"
        print(f"ring attention and Ulysses on {world} GPUs: {verdict}")
    if total.item():
        sys.exit(1)


def main() -> int:
    if torch.cuda.device_count() < 2:
        print(f"skipped: ring attention needs 2 or more CUDA devices, found {torch.cuda.device_count()}")
        return 77
    if "WORLD_SIZE" in os.environ:  # launched by torchrun
        if int(os.environ["WORLD_SIZE"]) < 2:
            print("skipped: torchrun started one process; ring attention needs 2 or more")
            return 77
        worker(int(os.environ["LOCAL_RANK"]), None)
        return 0
    world = torch.cuda.device_count()
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(s.getsockname()[1]))
    try:
        mp.spawn(worker, args=(world,), nprocs=world)
    except mp.ProcessExitedException:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
