"""The FlashAttention course's steps from Python.

`fa_course._ext` (built by the course's CMake with nanobind) runs any registered step on DLPack tensors -- PyTorch,
CuPy, JAX -- in place and on the stream it is given, with the kit's checks and messages (ValueError for a refusal,
RuntimeError for a CUDA error). Tensors are [batch, seq, heads, head_dim], contiguous, in GPU memory, as
FlashAttention's API takes them. `fa_course.torch` wraps it for PyTorch (autograd, the current stream).

    import fa_course
    fa_course.steps()                       # what each step is and takes
    fa_course.forward("11", q, k, v, out)   # O written into out
"""
from ._ext import backward, forward, steps, workspace_bytes

__all__ = ["backward", "forward", "steps", "workspace_bytes"]
