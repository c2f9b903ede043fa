"""Which of the course's steps runs a FlashAttention call: the problem's needs against the registry's list.

Torch-free, so that CI checks every choice and every refusal without a GPU (tests/python/test_flash_attn_choose.py):
`fa_course.flash_attn` describes its call as a `Problem`, hands it here with `fa_course.steps()` and the GPU's
compute capability, and runs the step it gets back, or raises the `Refusal` it gets instead, before any GPU work.

The rule: among the steps of the call's pass that take every need of the problem (dtype, head_dim, the mask's
alignment, a window, a soft-cap, sinks, a pack, a cache and its pages, the number of new tokens) and run on this GPU,
the highest-numbered one, a decode step first where the new tokens are few enough for one. Within a part each step is the one before it with one change that made it faster on the
GPU it targets (the parts' tables in the README measure it), and the later parts grow from the fastest step of the
earlier ones, so the highest-numbered step that takes a problem is the course's fastest for it: step 52 (or 57) for
a Hopper forward, 56 for its backward, 48 for a decode of at most 8 new tokens on a cache, 18 for an Ampere forward.
"""
from __future__ import annotations

from dataclasses import dataclass, replace


class Refusal(NotImplementedError):
    """A call the course does not compute: an argument it does not implement (dropout, ALiBi, a deterministic
    backward, ...) or a problem no step takes on this GPU. Raised before any GPU work, with the need named. A
    NotImplementedError, as a library's missing feature is, so that code can tell it from a malformed argument
    (RuntimeError or ValueError, as FlashAttention's and the kit's own checks raise)."""


@dataclass(frozen=True)
class Problem:
    """What a call needs of a step. Lengths are the longest of the batch (of a pack: of its sequences)."""
    pass_: str                       # "forward" or "backward"
    dtype: str                       # the course's name: "f16", "bf16", "f32"
    head_dim: int
    q_len: int
    kv_len: int
    causal: bool = False
    bottom_right: bool = False       # the mask's or window's diagonal at the last key (q_len != kv_len, a cache)
    window: bool = False             # a sliding window (window_size other than (-1, -1))
    softcap: bool = False
    sinks: bool = False
    varlen: bool = False             # a pack (cu_seqlens_q, cu_seqlens_k)
    cache: bool = False              # each sequence's length in kv_lens (a KV cache)
    paged: bool = False              # the cache in pages (a block table)

    def needs(self) -> list[str]:
        """The problem's needs, in the words of a refusal."""
        out = [self.dtype, f"head_dim {self.head_dim}"]
        if self.causal or self.window:
            out.append("the diagonal at the last key (bottom-right)" if self.bottom_right else "the diagonal at the first key")
        for flag, word in ((self.window, "a sliding window"), (self.softcap, "soft-capping"), (self.sinks, "sinks"),
                           (self.varlen, "a pack (varlen)"), (self.cache, "a KV cache's lengths"),
                           (self.paged, "a paged KV cache")):
            if flag:
                out.append(word)
        return out


def runs_on(min_gpu: str, capability: tuple[int, int]) -> bool:
    """Whether a step whose registry entry says min_gpu ("any", "sm_80", "sm_90", "sm_90a") runs on a GPU of this
    compute capability. An arch-specific target ("sm_90a": wgmma, setmaxnreg) runs on that architecture alone."""
    if min_gpu == "any":
        return True
    digits = min_gpu[3:].rstrip("a")
    need = (int(digits[:-1]), int(digits[-1]))
    return tuple(capability) == need if min_gpu.endswith("a") else tuple(capability) >= need


def why_not(step: dict, p: Problem, capability: tuple[int, int]) -> str | None:
    """The first need of `p` that `step` (an entry of fa_course.steps()) does not meet, in words; None if it takes
    the problem."""
    if step["pass"] != p.pass_:
        return f"a {step['pass']} step"
    if not runs_on(step["min_gpu"], capability):
        return f"needs {step['min_gpu']}"
    if p.dtype not in step["dtypes"]:
        return f"takes {', '.join(step['dtypes'])}"
    if p.head_dim not in step["head_dims"]:
        return f"takes head_dim {', '.join(map(str, step['head_dims']))}"
    if (p.causal or p.window) and p.bottom_right and not step["bottom_right"]:
        return "aligns the mask at the first key"
    if p.cache and not step["kv_lens"]:
        return "takes no KV cache"
    if p.paged and not step["paged"]:
        return "takes no paged cache"
    if step["max_q_len"] and p.q_len > step["max_q_len"]:
        return f"takes at most {step['max_q_len']} new tokens"
    for need, flag in (("window", p.window), ("softcap", p.softcap), ("sinks", p.sinks), ("varlen", p.varlen)):
        if flag and not step[need]:
            return f"takes no {need}"
    return None


def _ranges(ids: list[int]) -> str:
    """1, 2, 3, 5 -> '1-3, 5'."""
    out, start = [], None
    for i, n in enumerate(ids):
        if start is None:
            start = n
        if i + 1 == len(ids) or ids[i + 1] != n + 1:
            out.append(f"{start:02d}" if start == n else f"{start:02d}-{n:02d}")
            start = None
    return ", ".join(out)


def choose(steps: list[dict], p: Problem, capability: tuple[int, int], call: str = "the call") -> str:
    """The label of the highest-numbered step (no variant) that takes `p` on a GPU of `capability`; else Refusal,
    naming the problem's needs and, for each need some step of the pass meets, which steps meet it."""
    plain = [s for s in steps if not s["variant"] and s["pass"] == p.pass_]
    # Few enough new tokens for a decode step: the decode steps first (their split of the keys reads a long cache
    # at the memory's speed, where a prefill tile of 64 or 128 rows would hold one); then by number.
    for step in sorted(plain, key=lambda s: (bool(s["max_q_len"]) and p.q_len <= s["max_q_len"], int(s["id"])),
                       reverse=True):
        if why_not(step, p, capability) is None:
            return step["label"]
    gpu = f"sm_{capability[0]}{capability[1]}"
    takers = []
    for need, test in (
            ("this GPU", lambda s: runs_on(s["min_gpu"], capability)),
            (p.dtype, lambda s: p.dtype in s["dtypes"]),
            (f"head_dim {p.head_dim}", lambda s: p.head_dim in s["head_dims"]),
            ("the bottom-right diagonal", lambda s: s["bottom_right"] or not (p.bottom_right and (p.causal or p.window))),
            ("a sliding window", lambda s: s["window"] or not p.window),
            ("soft-capping", lambda s: s["softcap"] or not p.softcap),
            ("sinks", lambda s: s["sinks"] or not p.sinks),
            ("a pack", lambda s: s["varlen"] or not p.varlen),
            ("a KV cache", lambda s: s["kv_lens"] or not p.cache),
            ("a paged cache", lambda s: s["paged"] or not p.paged),
            (f"{p.q_len} new tokens", lambda s: not s["max_q_len"] or p.q_len <= s["max_q_len"])):
        ids = sorted(int(s["id"]) for s in plain if test(s))
        if len(ids) < len(plain):  # a need that narrows the steps
            takers.append(f"{need}: {_ranges(ids) if ids else 'none'}")
    raise Refusal(f"fa_course.flash_attn: no {p.pass_} step of the course takes {call} on this GPU ({gpu}): it needs "
                  + ", ".join(p.needs()) + ". The " + p.pass_ + " steps that take each need: " + "; ".join(takers))


def padded_head_dim(steps: list[dict], p: Problem, capability: tuple[int, int], passes=("forward",)) -> int | None:
    """A head_dim no step takes, rounded up as FlashAttention rounds its own to the kernels it has: the smallest
    head_dim above p's at which a step of each of `passes` takes p's other needs on this GPU, or None when p's own is
    taken or none above it is. Zero columns appended to q, k and v change no score (q.k gains 0 x 0 terms), so the
    softmax (its scale kept at 1/sqrt of p's head_dim), the LSE and O's first head_dim columns are p's own, and the
    appended columns of O, dQ, dK and dV are zero: sliced off, they leave p's answer and gradients."""
    def taken(head_dim):
        for pass_ in passes:
            try:
                choose(steps, replace(p, head_dim=head_dim, pass_=pass_), capability)
            except Refusal:
                return False
        return True
    if taken(p.head_dim):
        return None
    wider = sorted({d for s in steps for d in s["head_dims"] if d > p.head_dim})
    return next((d for d in wider if taken(d)), None)


def refuse_unimplemented(dropout_p=0.0, alibi_slopes=None, deterministic=False, needs_grad=False, **others):
    """The arguments the course does not implement, refused by name (before anything else looks at the call)."""
    if dropout_p:
        raise Refusal(f"fa_course.flash_attn: dropout_p = {dropout_p}: the course's steps implement no dropout "
                      "(pass dropout_p=0.0, as FlashAttention asks for evaluation)")
    if alibi_slopes is not None:
        raise Refusal("fa_course.flash_attn: alibi_slopes: the course's steps implement no ALiBi bias")
    if deterministic and needs_grad:
        raise Refusal("fa_course.flash_attn: deterministic=True: the course's backward steps from 27 on add each "
                      "K/V tile's share of dQ with atomics (or, from 39, TMA reduce-adds) in the order the blocks "
                      "finish, so none promises the same bits twice (the forward is deterministic)")
    for name, value in others.items():
        if value is not None:
            raise Refusal(f"fa_course.flash_attn: {name}: not implemented by the course")


def window_of(window_size, causal: bool) -> tuple[int, int]:
    """FlashAttention's window_size, with its rule: causal makes the right side 0; a side < 0 is open."""
    left, right = (-1 if side is None or side < 0 else int(side) for side in window_size)
    return (left, 0) if causal else (left, right)


def windowed(left: int, right: int, causal: bool) -> bool:
    """Whether (left, right) bounds a row beyond the causal mask: a left side, or a right side without causal (the
    kit's AttentionProblem::windowed()). Causal alone, (-1, 0), is no window."""
    return left >= 0 or (right >= 0 and not causal)


def one_new_token(q_len: int, kv_len: int, left: int, right: int, causal: bool, varlen: bool):
    """A call of one new token a sequence, simplified: (the first key it needs, causal, left, right). Its diagonal at
    the bottom right is the last key, so causal hides nothing; a window's left side keeps the last left + 1 keys, its
    right side none past the last (there are none). Of a batch (not a pack) those keys are one slice, so the call
    runs on the slice with no mask at all, on any step, bottom-right or not (a Gemma 2 or gpt-oss decoding step);
    a pack's sequences would each need their own slice, so its window stays. Anything else is returned as it is."""
    window = windowed(left, right, causal)
    if q_len > 1 or (window and varlen):
        return 0, causal, left, right
    first = kv_len - 1 - left if window and 0 <= left < kv_len - 1 else 0
    return first, False, -1, -1
