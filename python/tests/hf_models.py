#!/usr/bin/env python3
"""Hugging Face transformers models on the course (issue 59): small models built from configs in code, random
weights (nothing downloaded), attn_implementation="fa_course" against "sdpa" and "eager" on the same weights.

For each model: one training step's loss and every parameter's gradient by FlashAttention's rule (the course's
error against the model in float32 with eager attention at most twice the peer's own in bfloat16, plus the float32
answer's own rounding to the gradient's dtype, plus 1e-5 of the reference's size), and generate() with the cache
giving the peer's greedy tokens, from one prompt and from left-padded prompts. Where the two part (a rounding
difference that turned a near-tie the other way), the logits both gave for that token, after the same tokens, must
meet the same rule against the float32 model's logits after those tokens: a course that computed attention wrong
gives logits the rule rejects, wherever it parts. The peer is
transformers' SDPA where the model takes it, else its eager attention in bfloat16 (gpt-oss takes no SDPA; Gemma 2's
soft-cap is the eager path's own). Models: a Llama-style one (GQA, RoPE); a Gemma-2-style one (soft-cap, sliding
window, head_dim 256); a gpt-oss-style one (sinks, sliding window). A part (training, generating, generating from a
padded batch) whose call the course refuses by name (fa_course.flash_attn.Refusal: a feature no step takes yet) is
reported as skipped with the refusal; the model's other parts still run. gpt-oss routes each token to every one of
its experts here: a top-k choice of experts flips on a rounding difference, and a flip moves the router's gradient
and the logits by more than any attention error would, whichever attention computed it.
Needs a CUDA GPU, PyTorch and transformers.

    PYTHONPATH=build/python python3 python/tests/hf_models.py
"""
import argparse
import sys

import torch

if __name__ == "__main__" and not torch.cuda.is_available():
    print("skipped: no CUDA device")  # ctest: exit 77 reads as skipped
    sys.exit(77)

import transformers  # noqa: E402

import fa_course.transformers  # noqa: E402,F401  (registers "fa_course")
from fa_course.flash_attn import Refusal, last_choice  # noqa: E402

dev = "cuda"


def configs():
    """The models, small: (name, config class, model class, config arguments, the bfloat16 peer)."""
    common = dict(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                  max_position_embeddings=1024)
    yield ("llama", transformers.LlamaConfig, transformers.LlamaForCausalLM,
           dict(common, num_attention_heads=8, num_key_value_heads=2, head_dim=64), "sdpa")
    yield ("gemma2", transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
           dict(common, num_attention_heads=4, num_key_value_heads=2, head_dim=256, query_pre_attn_scalar=256,
                attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=64), "eager")
    yield ("gpt_oss", transformers.GptOssConfig, transformers.GptOssForCausalLM,
           dict(common, num_attention_heads=8, num_key_value_heads=2, head_dim=64, sliding_window=64,
                num_local_experts=4, num_experts_per_tok=4), "eager")


def build(config_class, model_class, arguments, implementation, state, dtype):
    config = config_class(**arguments)
    model = model_class._from_config(config, attn_implementation=implementation)
    if state is not None:
        model.load_state_dict(state)
    return model.to(device=dev, dtype=dtype)


def rule(name, got, ref32, own):
    """FlashAttention's rule on one tensor: (error, bound). The bound is twice the peer's own error, plus the error of
    the float32 answer itself once rounded to the tensor's dtype (a parameter's gradient is kept in bfloat16, and no
    answer kept there is nearer than that; FlashAttention-3's tests add a rounding floor too), plus 1e-5 of the
    reference's size."""
    err = (got.float() - ref32.float()).abs().max().item()
    rounding = (ref32.to(got.dtype).float() - ref32.float()).abs().max().item()
    bound = (2 * (own.float() - ref32.float()).abs().max().item() + rounding
             + 1e-5 * ref32.float().abs().max().item())
    return err, bound


def parting(ours, theirs, new_from):
    """The index of the first new token where two greedy generations part, or None."""
    parted = (ours.sequences != theirs.sequences).any(dim=0).nonzero()
    return None if not len(parted) else int(parted[0]) - new_from


def logits_after(model, tokens, mask):
    """The float32 model's logits for the token after `tokens` [B, n] (left-padded where mask [B, n] is 0), in one
    forward without a cache, at the positions generate() gives them (a padded row's first token at 0)."""
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return model(input_ids=tokens, attention_mask=mask, position_ids=positions).logits[:, -1].float()


def train_step(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    failures, skipped, ran = [], [], 0
    kwargs = dict(max_new_tokens=24, do_sample=False, return_dict_in_generate=True, output_logits=True)
    for name, config_class, model_class, arguments, peer_name in configs():
        torch.manual_seed(0)
        seed_model = build(config_class, model_class, arguments, "eager", None, torch.float32)
        state = {k: v.detach().cpu() for k, v in seed_model.state_dict().items()}
        del seed_model
        ids = torch.randint(0, arguments["vocab_size"], (2, 192), device=dev)
        course = build(config_class, model_class, arguments, "fa_course", state, torch.bfloat16)
        peer = build(config_class, model_class, arguments, peer_name, state, torch.bfloat16)
        said = []
        try:  # training: the loss and every gradient by FlashAttention's rule
            loss, grads = train_step(course, ids)
            choice = last_choice()
            ref = build(config_class, model_class, arguments, "eager", state, torch.float32)
            loss32, grads32 = train_step(ref, ids)
            loss_peer, grads_peer = train_step(peer, ids)
            err, bound = rule("loss", loss, loss32, loss_peer)
            worst = (err / bound if bound else float("inf"), "loss", err, bound)
            for param, g32 in grads32.items():
                e, b = rule(param, grads[param], g32, grads_peer[param])
                worst = max(worst, (e / b if b else float("inf"), param, e, b))
            if worst[0] > 1:
                failures.append(f"{name}: {worst[1]}'s error {worst[2]:.3g} > bound {worst[3]:.3g}")
            said.append(f"loss {loss.item():.5f} ({peer_name} {loss_peer.item():.5f}, float32 eager "
                        f"{loss32.item():.5f}); worst of loss and {len(grads32)} gradients {worst[0]:.2f} of "
                        f"FlashAttention's bound ({worst[1]}); through forward {choice['forward']} / backward "
                        f"{choice['backward']}")
            ran += 1
        except Refusal as e:
            skipped.append(f"{name}, training: skipped, the course refuses: {e}")
            ref = build(config_class, model_class, arguments, "eager", state, torch.float32)
        prompt = ids[:, :16]
        padded, mask = prompt.clone(), torch.ones_like(prompt)  # prompts of different lengths, left-padded
        padded[0, :5], mask[0, :5] = 0, 0
        for label, extra in (("unpadded", {}), ("left-padded", dict(attention_mask=mask))):
            inputs = prompt if label == "unpadded" else padded
            try:  # generating with the cache: the peer's greedy tokens, or a part at a near-tie
                ours = course.generate(inputs, **extra, **kwargs)
                choice = last_choice()
            except Refusal as e:
                skipped.append(f"{name}, generating {label}: skipped, the course refuses: {e}")
                continue
            ran += 1
            theirs = peer.generate(inputs, **extra, **kwargs)
            t = parting(ours, theirs, prompt.shape[1])
            if t is None:
                said.append(f"{label}: {peer_name}'s greedy tokens (the last through {choice['forward']})")
                continue
            # The same tokens so far: the logits for token t by the rule, against the float32 model's after them.
            so_far = theirs.sequences[:, :prompt.shape[1] + t]
            mask_so_far = torch.cat([extra.get("attention_mask", torch.ones_like(prompt)),
                                     torch.ones_like(so_far[:, prompt.shape[1]:])], dim=1)
            ref32 = logits_after(ref, so_far, mask_so_far)
            err, bound = rule("logits", ours.logits[t], ref32, theirs.logits[t])
            top2 = theirs.logits[t].float().topk(2, dim=-1).values
            gap = (top2[:, 0] - top2[:, 1]).min().item()
            said.append(f"{label}: tokens part at new token {t} ({peer_name}'s top-two gap {gap:.3f}), where the "
                        f"logits' error is {err / bound if bound else float('inf'):.2f} of FlashAttention's bound")
            if err > bound:
                failures.append(f"{name}, {label}: greedy tokens part at new token {t}, where the logits' error "
                                f"{err:.3g} against float32 is over the bound {bound:.3g} (twice {peer_name}'s "
                                f"own, and the rounding floor)")
        print(f"{name}: " + "; ".join(said))
        del course, peer, ref
    for line in skipped:
        print(line)
    if failures:
        print(f"{len(failures)} failure(s):\n  " + "\n  ".join(failures))
        return 1
    print(f"transformers models on the course: {ran} parts run, {len(skipped)} skipped with a refusal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
