#!/usr/bin/env python3
"""fa_course.flash_attn's choice of steps and its refusals, without a GPU or PyTorch: the registry's list (through
fa_course.steps()) against problems on the GPUs the course names (Turing, Ampere, Hopper, Blackwell).

Each expected step is the registry's own fact for that GPU, checked two ways: the label `choose` returns, and a
search of the list by what each entry says (pass, dtypes, head dims, min_gpu, cache forms, features) that must find
no higher-numbered step taking the problem. The refusals are checked by the need they name.
Usage: test_flash_attn_choose.py BUILD/python. Plain asserts, no pytest.
"""
import sys

sys.path.insert(0, sys.argv[1])
import fa_course  # noqa: E402
from fa_course.flash_attn import Refusal  # noqa: E402  (no PyTorch: the package loads its API lazily)
from fa_course.flash_attn.choose import (Problem, choose, one_new_token, padded_head_dim,  # noqa: E402
                                         refuse_unimplemented, runs_on, window_of, windowed)

assert "torch" not in sys.modules, "fa_course.flash_attn.choose must not need PyTorch"
steps = fa_course.steps()
by_label = {s["label"]: s for s in steps}
HOPPER, AMPERE, ADA, BLACKWELL, TURING = (9, 0), (8, 0), (8, 9), (10, 0), (7, 5)

# Which GPUs a step's min_gpu admits: an arch-specific target (sm_90a) only its own architecture.
assert runs_on("any", TURING) and runs_on("sm_80", ADA) and runs_on("sm_80", BLACKWELL) and not runs_on("sm_80", TURING)
assert runs_on("sm_90a", HOPPER) and not runs_on("sm_90a", BLACKWELL) and not runs_on("sm_90a", ADA)
assert runs_on("sm_90", BLACKWELL) and not runs_on("sm_90", ADA)


def refused(problem, capability):
    try:
        label = choose(steps, problem, capability, "the test's call")
    except Refusal as e:
        assert isinstance(e, NotImplementedError)
        return str(e)
    raise AssertionError(f"{problem} on {capability}: chose step {label}, expected a refusal")


def chosen(problem, capability):
    label = choose(steps, problem, capability, "the test's call")
    step = by_label[label]
    # What the entry says must take the problem ...
    assert step["pass"] == problem.pass_ and not step["variant"], (label, step)
    assert runs_on(step["min_gpu"], capability) and problem.dtype in step["dtypes"], (label, step)
    assert problem.head_dim in step["head_dims"], (label, step)
    for need in ("window", "softcap", "sinks", "varlen"):
        assert step[need] or not getattr(problem, need), (label, need)
    assert step["kv_lens"] or not problem.cache, label
    assert step["paged"] or not problem.paged, label
    assert not step["max_q_len"] or problem.q_len <= step["max_q_len"], label
    assert step["bottom_right"] or not (problem.bottom_right and (problem.causal or problem.window)), label
    return label


def forward(dtype="bf16", d=128, q=4096, kv=4096, **needs):
    return Problem("forward", dtype, d, q, kv, **needs)


def backward(dtype="bf16", d=128, q=4096, kv=4096, **needs):
    return Problem("backward", dtype, d, q, kv, **needs)


def ids(kind, **fields):
    """The ids of the plain steps of a pass whose entries say each field."""
    return sorted(int(s["id"]) for s in steps
                  if s["pass"] == kind and not s["variant"] and all(s[k] == v for k, v in fields.items()))


# The Hopper forward: the highest-numbered step of the features part, which takes every feature and head_dim 256.
hopper_forward = chosen(forward(), HOPPER)
assert by_label[hopper_forward]["min_gpu"] == "sm_90a", hopper_forward
for needs in (dict(causal=True), dict(window=True), dict(softcap=True), dict(sinks=True), dict(varlen=True),
              dict(causal=True, window=True, softcap=True, sinks=True, varlen=True)):
    assert chosen(forward(**needs), HOPPER) == hopper_forward, needs
assert chosen(forward(d=64), HOPPER) == hopper_forward
# head_dim 256: the steps that list it.
d256 = chosen(forward(d=256), HOPPER)
assert 256 in by_label[d256]["head_dims"]
# The Hopper backward, with and without the features.
hopper_backward = chosen(backward(), HOPPER)
assert by_label[hopper_backward]["min_gpu"] == "sm_90a"
assert chosen(backward(causal=True, window=True, softcap=True, sinks=True, varlen=True), HOPPER) == hopper_backward
# A GPU without wgmma (Ampere, Ada, Blackwell: sm_90a is Hopper's alone) gets the fastest sm_80 step; no feature.
for gpu in (AMPERE, ADA, BLACKWELL):
    label = chosen(forward(dtype="f16"), gpu)
    assert by_label[label]["min_gpu"] in ("sm_80", "sm_90", "any") and not by_label[label]["max_q_len"], label
    assert chosen(backward(dtype="f16"), gpu) == chosen(backward(dtype="bf16"), gpu)
    message = refused(forward(dtype="f16", window=True), gpu)
    assert "a sliding window" in message and f"sm_{gpu[0]}{gpu[1]}" in message, message
assert chosen(forward(dtype="f16"), AMPERE) == "18" and chosen(backward(dtype="f16"), AMPERE) == "28"

# Few new tokens over many keys: a decode step, where its split of the keys is the fast way (on any GPU from sm_80).
decode = chosen(forward(q=1, kv=8192, cache=True), HOPPER)
assert by_label[decode]["kv_lens"] and by_label[decode]["max_q_len"] >= 1
assert chosen(forward(q=4, kv=8192, cache=True, paged=True, causal=True, bottom_right=True), AMPERE) == \
    max(str(i) for i in ids("forward", paged=True, bottom_right=True))
# Without a cache too, few new tokens go to a decode step first (on Hopper as on Ampere); nine do not.
assert by_label[chosen(forward(q=1, kv=8192), HOPPER)]["max_q_len"] >= 1
assert by_label[chosen(forward(q=9, kv=8192), HOPPER)]["max_q_len"] == 0
message = refused(forward(q=9, kv=8192, cache=True), HOPPER)
assert "at most" in message or "9 new tokens" in message, message

# FlashAttention's causal mask at the bottom right (seqlen_q != seqlen_k): only the steps that take that alignment.
# On Hopper the newest forward takes it at any q_len (step 60, not yet run on a GPU), with every feature and a pack.
br_forward = max(str(i) for i in ids("forward", bottom_right=True, max_q_len=0))
assert br_forward == hopper_forward == "60", (br_forward, hopper_forward)
assert chosen(forward(q=100, kv=300, causal=True, bottom_right=True), HOPPER) == br_forward
assert chosen(forward(q=300, kv=100, causal=True, window=True, softcap=True, sinks=True, varlen=True, bottom_right=True),
              HOPPER) == br_forward
assert chosen(forward(q=100, kv=300, window=True, bottom_right=True), HOPPER) == br_forward  # a window's diagonal too
assert chosen(forward(q=100, kv=300, bottom_right=True), HOPPER) == hopper_forward  # no mask: alignment moot
# Elsewhere (no sm_90a) only the decode steps take it, for at most their new tokens: 100 rows are refused.
message = refused(forward(dtype="f16", q=100, kv=300, causal=True, bottom_right=True), AMPERE)
assert "bottom-right" in message and "100 new tokens" in message, message
# The backward: the newest backward takes it too (step 61, not yet run on a GPU); on Ampere none does.
br_backward = max(str(i) for i in ids("backward", bottom_right=True))
assert br_backward == hopper_backward == "61", (br_backward, hopper_backward)
assert chosen(backward(q=100, kv=300, causal=True, bottom_right=True), HOPPER) == br_backward
assert chosen(backward(q=300, kv=100, causal=True, window=True, sinks=True, varlen=True, bottom_right=True),
              HOPPER) == br_backward
assert "bottom-right" in refused(backward(dtype="f16", q=100, kv=300, causal=True, bottom_right=True), AMPERE)

# A need no step meets names itself and the steps that meet each other need.
message = refused(backward(d=96), HOPPER)
assert "head_dim 96: none" in message, message
# float32: the CUDA-core steps take it (the shim itself refuses it, as FlashAttention does, before choosing).
assert "f32" in by_label[chosen(forward(dtype="f32"), HOPPER)]["dtypes"]
assert "f32" in refused(forward(dtype="f32", window=True), HOPPER)

# Refusals by name, before any problem: dropout, ALiBi, a deterministic backward, a cache's batch index.
for kwargs, word in ((dict(dropout_p=0.1), "dropout_p"), (dict(alibi_slopes=[0.5]), "alibi_slopes"),
                     (dict(deterministic=True, needs_grad=True), "deterministic"),
                     (dict(cache_batch_idx=[0]), "cache_batch_idx")):
    try:
        refuse_unimplemented(**kwargs)
    except Refusal as e:
        assert word in str(e), (kwargs, str(e))
    else:
        raise AssertionError(f"{kwargs}: not refused")
refuse_unimplemented(deterministic=True)  # the forward is deterministic: nothing to refuse without a gradient
refuse_unimplemented(dropout_p=0.0, alibi_slopes=None, cache_batch_idx=None)

# FlashAttention's window_size: -1 (or any negative) an open side; causal makes the right side 0.
assert window_of((-1, -1), False) == (-1, -1) and window_of((128, -1), True) == (128, 0)
assert window_of((16, 3), False) == (16, 3) and window_of((-5, 7), True) == (-1, 0)
# Causal alone is no window (the steps without one take it); a left side, or a right side without causal, is one.
assert not windowed(*window_of((-1, -1), True), True) and windowed(*window_of((128, -1), True), True)
assert windowed(-1, 5, False) and not windowed(-1, -1, False)
# One new token a sequence: no mask; a batch's window keeps its last left + 1 keys (a slice), a pack's stays.
assert one_new_token(1, 300, 63, 0, True, False) == (236, False, -1, -1)      # Gemma 2 decoding: keys 236-299
assert one_new_token(1, 300, 40, 17, False, False) == (259, False, -1, -1)    # the right side: no key past the last
assert one_new_token(1, 300, 299, 0, True, False) == (0, False, -1, -1)       # the window holds every key
assert one_new_token(1, 300, 500, 0, True, False) == (0, False, -1, -1)
assert one_new_token(1, 300, -1, 0, True, True) == (0, False, -1, -1)         # causal alone: a pack too
assert one_new_token(1, 300, 63, 0, True, True) == (0, True, 63, 0)           # a pack's window: kept
assert one_new_token(2, 300, 63, 0, True, False) == (0, True, 63, 0)          # two new tokens: kept
assert one_new_token(1, 1, -1, -1, False, False) == (0, False, -1, -1)
# A head_dim no step takes: the next one up at which a step of each pass takes the problem (None when its own is
# taken, or none above it is). Each answer checked against the list: every head_dim between is refused.
def padded(problem, capability, passes=("forward",)):
    wider = padded_head_dim(steps, problem, capability, passes)
    if wider is not None:
        for pass_ in passes:
            chosen(Problem(**{**problem.__dict__, "head_dim": wider, "pass_": pass_}), capability)
        for between in range(problem.head_dim, wider):
            for pass_ in passes:
                try:
                    choose(steps, Problem(**{**problem.__dict__, "head_dim": between, "pass_": pass_}), capability)
                except Refusal:
                    break
            else:
                raise AssertionError(f"{problem}: padded to {wider}, but head_dim {between} is taken")
    return wider


assert padded(forward(d=128), HOPPER) is None and padded(forward(d=64), AMPERE, ("forward", "backward")) is None
assert padded(forward(d=96), HOPPER, ("forward", "backward")) == 128
assert padded(forward(d=80, causal=True, window=True, softcap=True), HOPPER, ("forward", "backward")) == 128
assert padded(forward(d=40, dtype="f16"), AMPERE, ("forward", "backward")) == 64
assert padded(forward(d=200), HOPPER, ("forward", "backward")) == 256
assert padded(forward(d=300), HOPPER) is None                       # none above it: refused by its head_dim
assert padded(forward(d=96, window=True), AMPERE) is None           # the window refuses it at every head_dim
print(f"fa_course.flash_attn chooses: Hopper forward {hopper_forward} (d = 256: {d256}), backward {hopper_backward}, "
      f"decode {decode}; Ampere 18 and 28; refusals named")
