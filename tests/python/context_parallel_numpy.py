"""The context-parallel CPU tests' common parts (test_context_parallel_plan.py, test_context_parallel_ulysses.py):
fa_course.context_parallel loaded from the source tree without the compiled module, and the "kernel", attention in
float64 numpy with its backward, checked against central differences. Needs numpy, not PyTorch.
"""
import os
import sys
import types

import numpy as np

# fa_course's __init__ loads the compiled extension; the context_parallel subpackage needs none of it, so it is
# loaded from the source tree under an empty fa_course package.
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
_package = types.ModuleType("fa_course")
_package.__path__ = [os.path.join(REPO, "python", "fa_course")]
sys.modules.setdefault("fa_course", _package)

# FA_LESSON_DIR: a folder whose lesson files (loop.py, plan.py, ulysses.py) replace the steps' own, found first on the
# package's path: a student's exercise or a mutant, run by tests/python/python_step_check.py against this same test.
if os.environ.get("FA_LESSON_DIR"):
    import fa_course.context_parallel as _cp  # noqa: E402  (its modules are not imported yet: the folder comes first)
    _cp.__path__.insert(0, os.environ["FA_LESSON_DIR"])


# --- The "kernel": attention of one block in float64, and its backward from the global O and LSE ----------------------

def scores(q, k, causal):
    """S [B, H, n, m] of q [B, n, H, d], k [B, m, H, d], scaled by 1/sqrt(d); top-left causal: row i sees keys
    0 .. i."""
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(q.shape[-1])
    if causal:
        n, m = s.shape[-2:]
        s = np.where(np.arange(m)[None, :] > np.arange(n)[:, None], -np.inf, s)
    return s


def attend(q, k, v, causal):
    """O [B, n, H, d] and LSE [B, H, n] (natural log) of one block."""
    s = scores(q, k, causal)
    m = s.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True)))[..., 0]
    p = np.exp(s - lse[..., None])
    return np.einsum("bhij,bjhd->bihd", p, v), lse


def attend_backward(q, k, v, out, lse, d_out, causal):
    """dQ, dK, dV of one block, from the global O and LSE of its rows (FlashAttention-2's Algorithm 2):
    P = exp(S - LSE), dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d)."""
    p = np.exp(scores(q, k, causal) - lse[..., None])
    d_v = np.einsum("bhij,bihd->bjhd", p, d_out)
    delta = np.einsum("bihd,bihd->bhi", d_out, out)
    d_s = p * (np.einsum("bihd,bjhd->bhij", d_out, v) - delta[..., None])
    scale = 1 / np.sqrt(q.shape[-1])
    return np.einsum("bhij,bjhd->bihd", d_s, k) * scale, np.einsum("bhij,bihd->bjhd", d_s, q) * scale, d_v


def random(shape, rng):
    return rng.standard_normal(shape)


def check_gradients(attend, attend_backward, q_shape, kv_shape, rng):
    """The backward's gradients against central differences of sum(O * G) on a tiny problem, causal and not."""
    for causal in (False, True):
        q, k, v, g = random(q_shape, rng), random(kv_shape, rng), random(kv_shape, rng), random(q_shape, rng)
        o, lse = attend(q, k, v, causal)
        analytic = attend_backward(q, k, v, o, lse, g, causal)
        for which, grad in zip(range(3), analytic):
            numeric = np.zeros_like(grad)
            for idx in np.ndindex(grad.shape):
                loss = []
                for h in (1e-6, -1e-6):
                    args = [q.copy(), k.copy(), v.copy()]
                    args[which][idx] += h
                    loss.append((attend(*args, causal)[0] * g).sum())
                numeric[idx] = (loss[0] - loss[1]) / 2e-6
            assert np.abs(numeric - grad).max() < 1e-7, (causal, "QKV"[which], np.abs(numeric - grad).max())
