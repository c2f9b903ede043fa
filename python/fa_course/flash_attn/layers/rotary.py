"""Rotary position embeddings as FlashAttention's flash_attn.layers.rotary.apply_rotary_emb computes them, written
for the course in plain PyTorch (float32 arithmetic, the input's dtype out): flash_attn_with_kvcache rotates the new
keys and queries with it, and FlashAttention's tests compute their reference with it."""
from __future__ import annotations

import torch


def _positions(x, seqlen_offsets, cu_seqlens):
    """Each token's position: [B, N] for x [B, N, H, D]; [total] for a pack [total, H, D] with cu_seqlens."""
    if cu_seqlens is None:
        b, n = x.shape[0], x.shape[1]
        pos = torch.arange(n, device=x.device).view(1, n).expand(b, n)
        off = seqlen_offsets.view(b, 1).long() if torch.is_tensor(seqlen_offsets) else int(seqlen_offsets)
        return pos + off
    total = x.shape[0]
    token = torch.arange(total, device=x.device)
    seq = torch.searchsorted(cu_seqlens[1:].long(), token, right=True)  # the sequence each token is in
    pos = token - cu_seqlens.long()[seq]
    return pos + (seqlen_offsets.long()[seq] if torch.is_tensor(seqlen_offsets) else int(seqlen_offsets))


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None):
    """x [B, N, H, D] (or a pack [total, H, D] with cu_seqlens), cos and sin [seqlen_ro, rotary_dim / 2]: the first
    rotary_dim features of each head rotated by the angle of the token's position (its index plus seqlen_offsets,
    an int or one a sequence [B]); the rest unchanged. Pairs are (i, i + rotary_dim / 2) (GPT-NeoX), or (2i, 2i + 1)
    with interleaved (GPT-J). inplace writes the result into x as well."""
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"apply_rotary_emb: rotary_dim {rotary_dim} (2 x cos's last dimension) is larger than the "
                         f"head dimension {x.shape[-1]}")
    # FlashAttention asks cos and sin to cover every position; one past them takes their last row here rather than
    # index outside them on the GPU (which would end the process's CUDA context).
    pos = _positions(x, seqlen_offsets, cu_seqlens).clamp(0, cos.shape[0] - 1)
    c = cos.float()[pos].unsqueeze(-2)  # [..., 1, rotary_dim / 2], broadcast over heads
    s = sin.float()[pos].unsqueeze(-2)
    xr = x[..., :rotary_dim].float()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :rotary_dim // 2], xr[..., rotary_dim // 2:]
        rotated = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    out = torch.cat((rotated.to(x.dtype), x[..., rotary_dim:]), dim=-1)
    if inplace:
        x.copy_(out)
        return x
    return out
