"""FlashAttention's padding helpers (flash_attn.bert_padding), written for the course in plain PyTorch: a padded
batch [B, N, ...] with its mask to a pack [total, ...] and back. The pack's offsets are what
flash_attn_varlen_func takes."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def index_first_axis(x, indices):
    """x [N, ...] -> x[indices] [len(indices), ...], differentiable."""
    return x.reshape(x.shape[0], -1)[indices].reshape(len(indices), *x.shape[1:])


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states [B, N, ...], attention_mask [B, N] (1 or True: a token) -> the tokens packed [total, ...],
    their flat indices into B x N, cu_seqlens int32 [B + 1], the longest sequence (an int), and each sequence's
    count of tokens the attention mask alone selects, int32 [B]. With unused_mask (tokens kept in the pack but
    not attended), the pack holds both masks' tokens, as FlashAttention's does."""
    all_masks = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen, used


def pad_input(hidden_states, indices, batch, seqlen):
    """The pack [total, ...] back to [batch, seqlen, ...], zeros where no token was, differentiable."""
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out = out.index_put((indices,), hidden_states)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
