"""FlashAttention's Python API on the course's steps: `from fa_course.flash_attn import flash_attn_func` runs code
written for `flash_attn` on the course (see flash_attn_interface, which needs PyTorch). `choose`, which picks the
steps and refuses what the course does not compute, does not need PyTorch: the API's names load on first use."""
from .choose import Refusal

_API = ("flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
        "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache",
        "last_choice", "set_debug")


def __getattr__(name):
    if name in _API:
        from . import flash_attn_interface
        return getattr(flash_attn_interface, name)
    raise AttributeError(f"module 'fa_course.flash_attn' has no attribute '{name}'")


__all__ = ["Refusal", *_API]
