"""Context parallelism (issue 60): one long sequence across several GPUs, attention through a ring of K/V blocks or
through an all-to-all that swaps sequence shards for head shards (DeepSpeed-Ulysses).

plan (the split, the ring's schedule, the LSE merge), loop (one rank's ring loops, forward and backward) and ulysses
(the head split, the layout on each side of the all-to-all, one rank's forward and backward) need neither PyTorch nor
numpy and are tested on the CPU (tests/python/test_context_parallel_plan.py, test_context_parallel_ulysses.py); ring
and ulysses_torch (the torch.distributed drivers over NCCL and the course's kernels) need PyTorch and GPUs: import them
as fa_course.context_parallel.ring and fa_course.context_parallel.ulysses_torch.
"""
