"""The course as a Hugging Face transformers attention implementation: after `import fa_course.transformers`, a
model built with `attn_implementation="fa_course"` runs its attention on the course's steps (issue 59).

    import fa_course.transformers  # registers "fa_course"
    model = LlamaForCausalLM(config)  # config._attn_implementation = "fa_course", or from_pretrained(...,
                                      # attn_implementation="fa_course")

The attention goes through fa_course.flash_attn (FlashAttention's API and conventions: the causal mask at the bottom
right, so a decoding step's one new token sees the whole cache through a decode step), with the models' features
transformers hands an attention function: `scaling`, `sliding_window` (transformers counts the row's own key in
it: keys j with i - sliding_window < j <= i, FlashAttention's window_size (sliding_window - 1, 0)), `softcap`
(Gemma 2) and `s_aux` (gpt-oss's sinks, a logit a head, differentiated). The mask is FlashAttention's kind
(transformers' flash_attention_mask): None without padding, else [B, kv_len] with zeros at the padding; a padded
batch runs as a pack (FlashAttention's varlen, as transformers' own flash-attention path does): the tokens unpadded,
each sequence's queries over its own keys, the output padded back with zeros. Dropout and attention weights
(`output_attentions`) are refused by name before any GPU work.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

from .flash_attn.bert_padding import pad_input, unpad_input
from .flash_attn.choose import Refusal
from .flash_attn.flash_attn_interface import _attention

NAME = "fa_course"


def fa_course_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        is_causal: bool | None = None, sliding_window: int | None = None,
                        softcap: float | None = None, s_aux: torch.Tensor | None = None, **kwargs):
    """transformers' attention function: query [B, Hq, Nq, d], key and value [B, Hkv, Nkv, d] (transformers'
    layout) -> (output [B, Nq, Hq, d], None)."""
    if kwargs.get("output_attentions"):
        raise Refusal("fa_course.transformers: output_attentions: the course's steps never form the attention weights")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = (sliding_window - 1, -1) if sliding_window else (-1, -1)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    features = dict(softmax_scale=scaling, causal=bool(causal), window_size=window, softcap=softcap or 0.0,
                    dropout_p=dropout if module.training else 0.0, sinks=s_aux)
    if attention_mask is None or bool(attention_mask.all()):
        return _attention("transformers attention", q, k, v, **features), None
    # A padded batch: keys where the mask says (its last kv_len columns), queries where its last q_len columns say.
    batch, q_len = q.shape[0], q.shape[1]
    key_mask = attention_mask[:, -k.shape[1]:].bool()
    query_mask = key_mask[:, -q_len:]
    q_packed, q_index, cu_q, _, _ = unpad_input(q, query_mask)
    k_packed, _, cu_k, _, _ = unpad_input(k, key_mask)
    v_packed = unpad_input(v, key_mask)[0]
    out = _attention("transformers attention (padded)", q_packed, k_packed, v_packed, cu_seqlens_q=cu_q,
                     cu_seqlens_k=cu_k, **features)
    return pad_input(out, q_index, batch, q_len), None


AttentionInterface.register(NAME, fa_course_attention)
AttentionMaskInterface.register(NAME, flash_attention_mask)
