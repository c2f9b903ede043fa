#!/usr/bin/env python3
"""Hugging Face transformers models on the course (issue 59): small models built from configs in code, random
weights (nothing downloaded), attn_implementation="fa_course" against "sdpa" and "eager" on the same weights.

For each model: one training step's loss and every parameter's gradient by FlashAttention's rule (the course's
error against the model in float32 with eager attention at most twice SDPA's own in bfloat16, plus 1e-5 of the
reference's size), and generate() with the cache giving SDPA's greedy tokens (where they part, it must be at a
near-tie: SDPA's top two logits within --tie). Models: a Llama-style one (GQA, RoPE); a Gemma-2-style one (soft-cap,
sliding window, head_dim 256); a gpt-oss-style one (sinks, sliding window). A model whose call the course refuses
by name (fa_course.flash_attn.Refusal: a feature no step takes yet) is reported as skipped with the refusal.
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
    """The models, small: (name, config class, model class, config arguments)."""
    common = dict(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                  max_position_embeddings=1024)
    yield ("llama", transformers.LlamaConfig, transformers.LlamaForCausalLM,
           dict(common, num_attention_heads=8, num_key_value_heads=2, head_dim=64))
    yield ("gemma2", transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
           dict(common, num_attention_heads=4, num_key_value_heads=2, head_dim=256, query_pre_attn_scalar=256,
                attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=64))
    yield ("gpt_oss", transformers.GptOssConfig, transformers.GptOssForCausalLM,
           dict(common, num_attention_heads=8, num_key_value_heads=2, head_dim=64, sliding_window=64,
                num_local_experts=4, num_experts_per_tok=2))


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
    """Where two greedy generations part: None if they do not, else (the new token's index, SDPA's smallest top-two
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
    failures, skipped = [], []
    for name, config_class, model_class, arguments in configs():
        torch.manual_seed(0)
        seed_model = build(config_class, model_class, arguments, "eager", None, torch.float32)
        state = {k: v.detach().cpu() for k, v in seed_model.state_dict().items()}
        del seed_model
        ids = torch.randint(0, arguments["vocab_size"], (2, 192), device=dev)
        ref = build(config_class, model_class, arguments, "eager", state, torch.float32)
        loss32, grads32 = train_step(ref, ids)
        sdpa = build(config_class, model_class, arguments, "sdpa", state, torch.bfloat16)
        loss_sdpa, grads_sdpa = train_step(sdpa, ids)
        course = build(config_class, model_class, arguments, "fa_course", state, torch.bfloat16)
        try:
            loss, grads = train_step(course, ids)
            train_choice = last_choice()
            prompt = ids[:, :16]
            kwargs = dict(max_new_tokens=24, do_sample=False, return_dict_in_generate=True, output_logits=True)
            ours = course.generate(prompt, **kwargs)
            decode_choice = last_choice()
            # Prompts of different lengths, left-padded (the padded batch runs as a pack).
            padded, mask = prompt.clone(), torch.ones_like(prompt)
            padded[0, :5], mask[0, :5] = 0, 0
            ours_padded = course.generate(padded, attention_mask=mask, **kwargs)
        except Refusal as e:
            skipped.append(f"{name}: skipped, the course refuses: {e}")
            print(skipped[-1])
            continue
        theirs = sdpa.generate(prompt, **kwargs)
        theirs_padded = sdpa.generate(padded, attention_mask=mask, **kwargs)
        err, bound = rule("loss", loss, loss32, loss_sdpa)
        worst = (err / bound if bound else float("inf"), "loss", err, bound)
        for param, g32 in grads32.items():
            e, b = rule(param, grads[param], g32, grads_sdpa[param])
            worst = max(worst, (e / b if b else float("inf"), param, e, b))
        if worst[0] > 1:
            failures.append(f"{name}: {worst[1]}'s error {worst[2]:.3g} > bound {worst[3]:.3g}")
        tokens = []
        for label, (x, y) in (("unpadded", (ours, theirs)), ("left-padded", (ours_padded, theirs_padded))):
            where = parting(x, y, prompt.shape[1], args.tie)
            if where is None:
                tokens.append(f"{label}: SDPA's greedy tokens")
                continue
            tokens.append(f"{label}: tokens part at new token {where[0]}, SDPA's top-two gap {where[1]:.3f}")
            if where[1] >= args.tie:
                failures.append(f"{name}, {label}: greedy tokens part at new token {where[0]} where SDPA's top two "
                                f"are {where[1]:.3f} apart (a near-tie is below {args.tie})")
        tokens = "; ".join(tokens)
        print(f"{name}: loss {loss.item():.5f} (SDPA {loss_sdpa.item():.5f}, float32 eager {loss32.item():.5f}); "
              f"worst of loss and {len(grads32)} gradients {worst[0]:.2f} of FlashAttention's bound ({worst[1]}); "
              f"{tokens}; training through forward {train_choice['forward']} / backward {train_choice['backward']}, "
              f"decoding through {decode_choice['forward']}")
    if failures:
        print(f"{len(failures)} failure(s):\n  " + "\n  ".join(failures))
        return 1
    print(f"transformers models on the course: {3 - len(skipped)} run, {len(skipped)} skipped with a refusal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
