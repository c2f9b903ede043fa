"""The merge of two partial results of the same rows through their LSE: the kit of the context-parallel steps (62-64),
written once. Step 62's ring merges each block's partial O into its rows' with it; the arithmetic is step 42's
combine_kernel (steps/42_split_kv_decode/split_kv.cuh) for two splits, in natural log.

Torch-free and numpy-free: it takes the array module (numpy or torch) as `xp`, so the GPU driver (ring.py) and the
CPU test (tests/python/test_context_parallel_plan.py) run the same lines.
"""
from __future__ import annotations


def merge(o_a, lse_a, o_b, lse_b, xp):
    """O and LSE of rows that saw the keys of a and the keys of b, from each one's partial O [B, N, H, d] and LSE
    [B, H, N] (natural log); xp is the arrays' module (numpy or torch: both have maximum, where, exp, log, swapaxes).
    The same arithmetic as step 42's combine_kernel (steps/42_split_kv_decode/split_kv.cuh), for two splits and in
    natural log: weights exp(LSE - M) with M the larger LSE, O the weighted mean, LSE = M + log(sum of weights).
    A row neither part saw a key of (both LSE -inf) gets O = 0 and LSE = -inf, with no NaN: M is replaced by 0 where
    it is -inf, and the sum of weights by 1 where it is 0. The weights are in the LSE's type (float32 on the GPU,
    where O may be bf16: the products and the sum are float32)."""
    m = xp.maximum(lse_a, lse_b)
    m_finite = xp.where(m == float("-inf"), xp.zeros_like(m), m)
    w_a, w_b = xp.exp(lse_a - m_finite), xp.exp(lse_b - m_finite)  # exp(-inf) = 0: a part that saw no key
    total = w_a + w_b
    seen = total > 0
    total_or_1 = xp.where(seen, total, xp.ones_like(total))
    lse = m + xp.log(total_or_1)  # where nothing was seen: m = -inf, log(1) = 0
    per_row = lambda x: xp.swapaxes(x, -1, -2)[..., None]  # [B, H, N] -> [B, N, H, 1], to scale O's rows  # noqa: E731
    out = (per_row(w_a) * o_a + per_row(w_b) * o_b) / per_row(total_or_1)
    return out, lse
