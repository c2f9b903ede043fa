"""Context parallelism (issue 60): one long sequence across several GPUs, attention through a ring of K/V blocks or
through an all-to-all that swaps sequence shards for head shards (DeepSpeed-Ulysses).

The course's steps 62-64 are this package's lessons, and their files are its modules: loop (step 62: one rank's ring
loops, forward and backward, and the schedule without a mask), plan (step 63: the zigzag split and the causal
schedule) and ulysses (step 64: the head split, the layout on each side of the all-to-all, one rank's forward and
backward) live in steps/NN_name/ (steps/python_steps.tsv lists them). The build copies them here
(build/python/fa_course/context_parallel/); imported from the source tree, the package finds them in steps/ (below).
merge (the LSE merge, step 42's combine) is the part's kit. These need neither PyTorch nor numpy and are tested on the
CPU (tests/python/test_context_parallel_plan.py, test_context_parallel_ulysses.py); ring and ulysses_torch (the
torch.distributed drivers over NCCL and the course's kernels) need PyTorch and GPUs: import them as
fa_course.context_parallel.ring and fa_course.context_parallel.ulysses_torch.
"""
import os as _os

# From the source tree (python/fa_course/context_parallel/), the steps' lesson files are modules of this package too:
# each step folder steps/python_steps.tsv lists joins the package's path. The build's copy has them beside it.
_steps = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "..", "..", "..", "steps")
if _os.path.isfile(_os.path.join(_steps, "python_steps.tsv")):
    with open(_os.path.join(_steps, "python_steps.tsv"), encoding="utf-8") as _f:
        for _line in _f:
            if _line.strip() and not _line.startswith("#"):
                __path__.append(_os.path.normpath(_os.path.join(_steps, _line.split("\t")[1])))
