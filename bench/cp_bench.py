#!/usr/bin/env python3
"""Context parallelism's scaling (issue 60): one long sequence's forward + backward across the GPUs of one host,
against one GPU and against PyTorch's own context parallelism, every number from the same run.

Forms, each timed on the same problem (B = 1 unless --batch, N tokens, Hq query and Hkv KV heads of d, bf16):
  one        the course's steps on one GPU, the whole sequence (rank 0 alone, the others wait)
  ring       fa_course.context_parallel.ring on every GPU (the zigzag share when causal)
  ulysses    fa_course.context_parallel.ulysses_torch on every GPU (where the heads divide)
  torch_cp   PyTorch's torch.distributed.tensor.experimental.context_parallel: its ring over SDPA (the flash
             backend, or --torch-backend cudnn), the sequence sharded by its own load balancer
Each is timed with CUDA events around forward + backward (dQ, dK, dV), after --warmup calls, the median of --reps,
with a barrier before each call so that every rank starts together; the slowest rank's time is the form's. Throughput
per GPU = the problem's FLOPs (forward 4 B H N^2 d, halved when causal; backward 2.5 times that: the kit's count) /
(time x GPUs). One row a form in --csv, with the ratio to `one`'s throughput and to torch_cp's time.

    PYTHONPATH=build/python torchrun --nproc-per-node 2 bench/cp_bench.py --tokens 131072 --csv cp.csv

--tokens, --causal and --kv-heads take comma-separated lists: every combination is a problem, and --rounds R times
every problem R times, round after round (round 1 of every problem, then round 2, ...), so that drift shows as a
difference between rounds rather than between problems. Each row names its round.

NVLink multicast is off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1), set before
NCCL starts. Run on 2 H200s in session 19 at 131072 and 262144 tokens (one round each, every form in one process
group): docs/results/context_parallel/h200x2-2026-11-29.csv; in session 20 over 32768 and 131072 tokens, both masks,
16 and 2 KV heads, two rounds: docs/results/context_parallel/h200x2-2026-11-30-rounds.csv.
"""
import argparse
import contextlib
import csv
import os
import statistics
import sys

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", default="131072", help="the whole sequence's length N (a comma-separated list)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16, help="query heads Hq")
    p.add_argument("--kv-heads", default="16", help="KV heads Hkv (a comma-separated list)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", default="yes", help="yes, no, or both as yes,no (a comma-separated list)")
    p.add_argument("--forms", default="one,ring,ulysses,torch_cp")
    p.add_argument("--torch-backend", choices=("flash", "cudnn", "efficient"), default="flash")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=1, help="times every problem is timed, round after round")
    p.add_argument("--csv", default=None, help="rows appended (header when new); rank 0 writes")
    a = p.parse_args()
    def counts(option, text, example):
        try:
            values = [int(t) for t in text.split(",")]
        except ValueError:
            values = []
        if not values or min(values) < 1:
            p.error(f"{option} {text}: takes positive integers, comma-separated (e.g. {example})")
        return values
    a.tokens_list = counts("--tokens", a.tokens, "32768,131072")
    a.kv_heads_list = counts("--kv-heads", a.kv_heads, "16,2")
    a.causal_list = a.causal.split(",")
    if any(c not in ("yes", "no") for c in a.causal_list):
        p.error(f"--causal {a.causal}: takes yes, no or a comma-separated list of them")
    return a


def problems(a):
    """Every combination of the listed lengths, masks and KV heads, as one argparse.Namespace each."""
    for tokens in a.tokens_list:
        for causal in a.causal_list:
            for kv_heads in a.kv_heads_list:
                yield argparse.Namespace(**{**vars(a), "tokens": tokens, "causal": causal, "kv_heads": kv_heads})


def flops(a) -> float:
    """Forward + backward of the whole problem, the kit's count (AttentionProblem::flops)."""
    forward = 4.0 * a.batch * a.heads * a.tokens * a.tokens * a.head_dim / (2 if a.causal == "yes" else 1)
    return 3.5 * forward


def timed(fn, a, device) -> float:
    """The median over --reps of one forward + backward, ms, the slowest rank's."""
    times = []
    for i in range(a.warmup + a.reps):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= a.warmup:
            times.append(start.elapsed_time(end))
    ms = torch.tensor([statistics.median(times)], device=device)
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return ms.item()


def main() -> int:
    args = parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    for round_ in range(1, args.rounds + 1):
        for a in problems(args):
            a.round = round_
            run_problem(a, device)
    dist.destroy_process_group()
    return 0


def run_problem(a, device) -> None:
    """Every form of --forms on one problem; rank 0 reports."""
    rank, world = dist.get_rank(), dist.get_world_size()
    causal = a.causal == "yes"

    import fa_course
    from fa_course import torch as fat
    from fa_course.context_parallel import plan
    from fa_course.context_parallel.ring import ring_attention
    from fa_course.context_parallel.ulysses_torch import ulysses_attention
    from fa_course.flash_attn.choose import Problem, choose

    def steps_for(q_len, kv_len, block_causal):
        need = lambda pass_: Problem(pass_, "bf16", a.head_dim, q_len, kv_len, causal=block_causal)  # noqa: E731
        cap = torch.cuda.get_device_capability(device)
        return tuple(choose(fa_course.steps(), need(p), cap, "a context-parallel block") for p in ("forward", "backward"))

    gen = torch.Generator().manual_seed(0)
    shape_q = (a.batch, a.tokens, a.heads, a.head_dim)
    shape_kv = (a.batch, a.tokens, a.kv_heads, a.head_dim)
    q, k, v, g = (torch.randn(s, generator=gen).to(device, torch.bfloat16) for s in (shape_q, shape_kv, shape_kv, shape_q))
    rows = torch.tensor(plan.split_indices(a.tokens, world, "zigzag" if causal else "contiguous")[rank], device=device)
    n_local = a.tokens // world
    results = {}

    def run_form(name, body):
        try:
            results[name] = timed(body, a, device)
        except (ValueError, NotImplementedError) as e:  # a refusal: the form does not take this problem
            results[name] = None
            if rank == 0:
                print(f"{name}: skipped: {e}", flush=True)

    for form in a.forms.split(","):
        if form == "one":
            fwd, bwd = steps_for(a.tokens, a.tokens, causal)
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]

            def body():
                if rank == 0:
                    out = fat.attention(*leaves, forward_step=fwd, backward_step=bwd, causal=causal)
                    torch.autograd.grad(out, leaves, g)
            run_form("one", body)
        elif form in ("ring", "ulysses"):
            if form == "ring":  # the ring's blocks: a chunk by two chunks, or the whole share
                fwd, bwd = steps_for(n_local, n_local, causal)
                attention = ring_attention
            else:
                fwd, bwd = steps_for(a.tokens, a.tokens, causal)
                attention = ulysses_attention
            local = [x[:, rows].clone().requires_grad_() for x in (q, k, v)]
            d_local = g[:, rows].contiguous()

            def body(attention=attention, fwd=fwd, bwd=bwd, local=local, d_local=d_local):
                out = attention(*local, causal, fwd, bwd)
                torch.autograd.grad(out, local, d_local)
            run_form(form, body)
        elif form == "torch_cp":
            with torch_cp(a, q, k, v, g, world, causal) as body:
                run_form("torch_cp", body)
        else:
            raise SystemExit(f"cp_bench: --forms: {form!r}: takes one, ring, ulysses, torch_cp")

    if rank == 0:
        report(a, world, results)


@contextlib.contextmanager
def torch_cp(a, q, k, v, g, world, causal):
    """PyTorch's context parallelism, entered once: context_parallel(mesh, buffers=...) shards q, k, v and dO along
    the sequence (dim 2 of SDPA's [B, H, N, d], its own load balancer) on entry, and inside it SDPA runs its ring;
    q, k, v enter whole on every rank, as its documentation shows. Yields the timed body: SDPA's forward + backward on
    the shards. GQA through SDPA's enable_gqa."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel
    try:  # its load balancer (the causal shards' reordering) takes only the causal mask: off without it
        from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options
    except ImportError:  # torch before 2.9
        from torch.distributed.tensor.experimental._attention import _cp_options
    _cp_options.enable_load_balance = causal
    mesh = init_device_mesh("cuda", (world,))
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}[a.torch_backend]
    qq, kk, vv, gg = (x.transpose(1, 2).contiguous() for x in (q, k, v, g))
    with sdpa_kernel(backend), context_parallel(mesh, buffers=[qq, kk, vv, gg], buffer_seq_dims=[2, 2, 2, 2],
                                                 no_restore_buffers={qq, kk, vv, gg}):
        leaves = [x.requires_grad_() for x in (qq, kk, vv)]

        def body():
            out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal,
                                                                   enable_gqa=a.kv_heads != a.heads)
            torch.autograd.grad(out, leaves, gg)
        yield body


def report(a, world, results):
    gpu = torch.cuda.get_device_name()
    total = flops(a)
    one = results.get("one")
    theirs = results.get("torch_cp")
    rows = []
    for form, ms in results.items():
        gpus = 1 if form == "one" else world
        per_gpu = None if ms is None else total / (ms * 1e-3) / gpus / 1e12
        row = dict(gpu=gpu, round=a.round, form=form, gpus=gpus, batch=a.batch, tokens=a.tokens, heads=a.heads, kv_heads=a.kv_heads,
                   head_dim=a.head_dim, causal=a.causal, dtype="bf16", ms=ms, tflops_per_gpu=per_gpu,
                   of_one_gpu=None if ms is None or one is None else (total / ms / gpus) / (total / one),
                   torch_cp_time_over_this=None if ms is None or theirs is None else theirs / ms)
        rows.append(row)
        cells = ", ".join(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
                          for key, value in row.items() if key not in ("gpu", "dtype"))
        print(f"cp_bench: {cells}", flush=True)
    if a.csv:
        new = not os.path.exists(a.csv)
        with open(a.csv, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            if new:
                writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
