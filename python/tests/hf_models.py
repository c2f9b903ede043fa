#!/usr/bin/env python3
"""Hugging Face transformers models on the course (issue 59): small models built from configs in code, random
weights (nothing downloaded), attn_implementation="fa_course" against "sdpa" and "eager" on the same weights.

For each model: one training step's loss and every parameter's gradient by FlashAttention's rule (the course's
error against the model in float32 with eager attention at most twice the peer's own in bfloat16, plus 1e-5 of the
reference's size), and generate() with the cache giving the peer's greedy tokens (where they part, it must be at a
near-tie: the peer's top two logits within --tie), from one prompt and from left-padded prompts. The peer is
transformers' SDPA where the model takes it, else its eager attention in bfloat16 (gpt-oss takes no SDPA; Gemma 2's
soft-cap is the eager path's own). Models: a Llama-style one (GQA, RoPE); a Gemma-2-style one (soft-cap, sliding
window, head_dim 256); a gpt-oss-style one (sinks, sliding window). A part (training, generating, generating from a
padded batch) whose call the course refuses by name (fa_course.flash_attn.Refusal: a feature no step takes yet) is
reported as skipped with the refusal; the model's other parts still run.
Needs a CUDA GPU, PyTorch and transformers.

    PYTHONPATH=build/python python3 python/tests/hf_models.py [--tie 0.125]
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
                num_local_experts=4, num_experts_per_tok=2), "eager")


def build(config_class, model_class, arguments, implementation, state, dtype):
    config = config_class(**arguments)
    model = model_class._from_config(config, attn_implementation=implementation)
    if state is not None:
        model.load_state_dict(state)
    return model.to(device=dev, dtype=dtype)


def rule(name, got, ref32, own):
    """FlashAttention's rule on one tensor: (error, bound)."""
    err = (got.float() - ref32.float()).abs().max().item()
    bound = 2 * (own.float() - ref32.float()).abs().max().item() + 1e-5 * ref32.float().abs().max().item()
    return err, bound


def parting(ours, theirs, new_from, tie):
    """Where two greedy generations part: None if they do not, else (the new token's index, the peer's smallest top-two
    gap there); a part at a gap of at least `tie` is a failure, below it a near-tie."""
    parted = (ours.sequences != theirs.sequences).any(dim=0).nonzero()
    if not len(parted):
        return None
    t = int(parted[0]) - new_from
    top2 = theirs.logits[t].float().topk(2, dim=-1).values
    return t, (top2[:, 0] - top2[:, 1]).min().item()


def train_step(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tie", type=float, default=0.125, help="top-two logit gap below which greedy may part")
    args = parser.parse_args()
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
            del ref
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
            where = parting(ours, theirs, prompt.shape[1], args.tie)
            if where is None:
                said.append(f"{label}: {peer_name}'s greedy tokens (the last through {choice['forward']})")
                continue
            said.append(f"{label}: tokens part at new token {where[0]}, {peer_name}'s top-two gap {where[1]:.3f}")
            if where[1] >= args.tie:
                failures.append(f"{name}, {label}: greedy tokens part at new token {where[0]} where {peer_name}'s top "
                                f"two are {where[1]:.3f} apart (a near-tie is below {args.tie})")
        print(f"{name}: " + "; ".join(said))
        del course, peer
    for line in skipped:
        print(line)
    if failures:
        print(f"{len(failures)} failure(s):\n  " + "\n  ".join(failures))
        return 1
    print(f"transformers models on the course: {ran} parts run, {len(skipped)} skipped with a refusal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
