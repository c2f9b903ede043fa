"""The module's GPU scripts' one PyTorch reference: attention with the models' features, in float32 (upcast) or in
the inputs' dtype (PyTorch's own error, the measure of FlashAttention's rule)."""
import math

import torch


def reference(q, k, v, *, causal=False, window=(-1, -1), softcap=0.0, sinks=None, upcast=True, bottom_right=False,
              with_lse=False):
    """O (and, with_lse, the LSE [B, Hq, Nq]) of q [B, Nq, Hq, d], k and v [B, Nkv, Hkv, d]: row i's diagonal at
    key i (top-left) or i + Nkv - Nq (bottom_right, FlashAttention's); a window (left, right) around it, -1 an open
    side, causal its right side 0; the cap c tanh(s / c) after the scale; a sink logit a head (float32 [Hq]) in every
    row's denominator. A row that sees no key: O = 0."""
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
        sinks = None if sinks is None else sinks.float()
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q * (1 / math.sqrt(q.shape[-1])), k)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    n_q, n_k = q.shape[1], k.shape[1]
    diagonal = torch.arange(n_q, device=q.device)[:, None] + (n_k - n_q if bottom_right else 0)
    j = torch.arange(n_k, device=q.device)[None, :]
    seen = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
    left, right = window[0], 0 if causal else window[1]
    if left >= 0:
        seen &= j >= diagonal - left
    if right >= 0:
        seen &= j <= diagonal + right
    scores = scores.masked_fill(~seen, float("-inf"))
    if sinks is not None:  # one more column, the sink's logit, with no value
        sink_column = sinks.to(scores.dtype)[None, :, None, None].expand(scores.shape[0], -1, n_q, 1)
        scores = torch.cat([scores, sink_column], dim=-1)
    lse = torch.logsumexp(scores.float(), dim=-1)
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)[..., :n_k]
    out = torch.einsum("bhts,bshd->bthd", p.to(v.dtype), v).to(dtype)
    return (out, lse) if with_lse else out
