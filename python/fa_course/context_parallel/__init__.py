"""Context parallelism (issue 60): one long sequence across several GPUs, attention through a ring of K/V blocks.

plan (the split, the ring's schedule, the LSE merge) and loop (one rank's forward and backward loops) need neither
PyTorch nor numpy and are tested on the CPU (tests/python/test_context_parallel_plan.py); ring (the torch.distributed
driver over NCCL and the course's kernels) needs PyTorch and GPUs: import it as fa_course.context_parallel.ring.
"""
