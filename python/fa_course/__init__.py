"""The FlashAttention course's steps from Python.

`fa_course._ext` (built by the course's CMake with nanobind) runs any registered step on DLPack tensors -- PyTorch,
CuPy, JAX -- in place and on the stream it is given, with q's device current, with the kit's checks and messages
(ValueError for a refusal, RuntimeError for a CUDA error). Tensors are [batch, seq, heads, head_dim], contiguous,
in GPU memory, as FlashAttention's API takes them. `fa_course.torch` wraps it for PyTorch (autograd, q's device's
current stream).

A decode call never reads kv_lens or page_table back to the host: the kernel checks each value it reads, never
reads outside the cache, and records a value it refused. Such an error surfaces later, as CUDA's asynchronous
errors do: the next call on that device raises it (ValueError), or check(), which first waits for the device.

    import fa_course
    fa_course.steps()                       # what each step is and takes
    fa_course.forward("11", q, k, v, out)   # O written into out
    fa_course.check()                       # waits; raises what a decode kernel refused
"""
from ._ext import backward, forward, steps, workspace_bytes
from ._ext import check as _check


def check(device=None) -> None:
    """Waits for every call in flight on `device` (a CUDA device index, "cuda:1" or a torch.device; default: the
    current device), then raises ValueError for a value of kv_lens or page_table that a decode kernel refused since
    the last report, naming it ("attention problem: kv_lens[1] = 900 is outside 0 .. kv_len = 512 ..."), and
    RuntimeError for a CUDA error. A decode call does not wait for its kernel, so without check() such a value is
    raised by the next call on the device, as CUDA reports a kernel's errors at a later call.
    """
    if isinstance(device, str):  # "cuda", "cuda:1"
        device = int(device.split(":")[1]) if ":" in device else None
    elif device is not None and not isinstance(device, int):  # torch.device("cuda", 1); its index None: current
        device = device.index
    _check(device)


__all__ = ["backward", "check", "forward", "steps", "workspace_bytes"]
