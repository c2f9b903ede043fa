#!/usr/bin/env python3
"""A Hugging Face transformers model trained and sampled on the course (issue 59): `attn_implementation="fa_course"`.

    import fa_course.transformers                    # registers "fa_course" with transformers' AttentionInterface
    model = LlamaForCausalLM._from_config(config, attn_implementation="fa_course")
    # or AutoModelForCausalLM.from_pretrained(name, attn_implementation="fa_course")

A small Llama (4 layers, 8 query heads over 2 KV heads of 64, RoPE) is built from a config with random weights
(nothing is downloaded) and trained for --train steps on gpt.py's generated sentences ("seven plus twelve is
nineteen.", character by character), bfloat16, its attention's forward and backward on the course's steps; then
generate() completes a few prompts greedily with the cache, its decoding steps on the course's decode step. The same
model from the same seed is trained with SDPA beside it: the losses side by side, and each completion of both.

Needs a CUDA GPU (Hopper for bf16's training steps), PyTorch, transformers and fa_course.

    PYTHONPATH=build/python python3 python/examples/hf_train_generate.py [--train 300]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import batches, corpus  # noqa: E402  (the sentences and their windows)


def build(implementation, vocab):
    import transformers
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                                      max_position_embeddings=512)
    torch.manual_seed(0)  # the same weights for both
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation=implementation)
    return model.to("cuda", torch.bfloat16)


def train(model, data, steps):
    """AdamW over the same windows for both models; the loss every 50 steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step, (x, _) in enumerate(batches(data, 256, 16, steps, seed=1)):
        x = x.cuda()
        loss = model(input_ids=x, labels=x).loss  # transformers moves the labels by one itself
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            losses.append((step, loss.item()))
    return losses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=int, default=300, help="training steps")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 77
    import fa_course.transformers  # noqa: F401  (registers "fa_course")
    from fa_course.flash_attn import last_choice

    text = corpus(20000, seed=0)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    models = {name: build(name, len(chars)) for name in ("fa_course", "sdpa")}
    curves = {}
    for name, model in models.items():
        curves[name] = train(model, data, args.train)
        if name == "fa_course":
            trained_on = dict(last_choice())
    for (step, ours), (_, theirs) in zip(curves["fa_course"], curves["sdpa"]):
        print(f"step {step:4d}: loss {ours:.4f} on the course, {theirs:.4f} with SDPA")
    print(f"training ran forward {trained_on['forward']} and backward {trained_on['backward']}")

    newline = chars.index("\n")
    for prompt in ("seven plus twelve is ", "forty-one minus three is ", "nine plus nine is "):
        ids = torch.tensor([[chars.index(c) for c in prompt]], device="cuda")
        said = {}
        for name, model in models.items():
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=newline,
                                     pad_token_id=newline)
            said[name] = "".join(chars[i] for i in out[0, ids.shape[1]:].tolist()).split("\n")[0]
        print(f"{prompt!r}: the course {said['fa_course']!r}, SDPA {said['sdpa']!r}")
    print(f"decoding ran {last_choice()['forward']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
