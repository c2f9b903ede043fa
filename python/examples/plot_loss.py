#!/usr/bin/env python3
"""The loss curves of python/examples/gpt.py's runs, from its loss.csv: each run's loss a step (faint) and its
25-step moving average. Needs matplotlib, not PyTorch or a GPU.

    python3 python/examples/plot_loss.py docs/results/h100-…-gpt-loss.csv docs/figures/gpt-loss.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {"loss_sdpa": "SDPA", "loss_course": "the course's steps (same seed)",
          "loss_sdpa_seed_plus_1": "SDPA, seed + 1 (run-to-run noise)", "loss_sdpa_seed_plus_2": "SDPA, seed + 2"}


def main(argv) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        rows = list(csv.DictReader(f))
    steps = [int(r["step"]) for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4), constrained_layout=True)
    for column, label in LABELS.items():
        if column not in rows[0]:
            continue
        losses = [float(r[column]) for r in rows]
        w = 25
        smooth = [sum(losses[i - w + 1:i + 1]) / w for i in range(w - 1, len(losses))]
        line, = ax.plot(steps[w - 1:], smooth, label=label, lw=1.5)
        ax.plot(steps, losses, color=line.get_color(), alpha=0.2, lw=0.6)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy loss (25-step moving average)")
    ax.set_title("A small GPT trained with SDPA and with the course's steps")
    ax.legend()
    fig.savefig(argv[2], dpi=120)
    print(f"wrote {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
