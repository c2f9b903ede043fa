#!/usr/bin/env python3
"""The lengths of a mixed pack of sequences (issue 58's varlen shape), for fa-bench --varlen and
sdpa_peers.py --varlen, which take the same list:

    python3 bench/pack_lengths.py 100 131072 4096        # 100 sequences, 131072 tokens, each 1 .. 4096
    build/bench/fa-bench --shape 1,1,1,16,16,128 --varlen $(python3 bench/pack_lengths.py 100 131072 4096)

COUNT lengths, each 1 .. LONGEST, that sum to TOTAL: drawn log-uniform over 1 .. LONGEST (short documents as
likely per octave as long ones, as a training pack mixes them) from SEED, scaled to the total, and the rounding's
remainder shared out one token at a time. The shortest is set to 1 and the longest to LONGEST when COUNT >= 2, so
every pack holds both ends. Deterministic: the same arguments give the same list on every machine.
"""
import argparse
import math
import random


def pack_lengths(count: int, total: int, longest: int, seed: int = 1) -> list:
    """COUNT lengths in 1 .. LONGEST summing to TOTAL (ValueError when no such list exists)."""
    if count < 1 or longest < 1 or not count <= total <= count * longest:
        raise ValueError(f"no {count} lengths of 1 .. {longest} sum to {total}: the total must be "
                         f"{count} .. {count * longest}")
    rng = random.Random(seed)
    draws = [math.exp(rng.uniform(0.0, math.log(longest))) for _ in range(count)]
    if count >= 2:  # both ends of the range in every pack
        draws[rng.randrange(count)] = 1.0
        draws[max(range(count), key=lambda i: (draws[i], -i))] = float(longest)
    fixed = {i for i, d in enumerate(draws) if count >= 2 and d in (1.0, float(longest))}
    free = [i for i in range(count) if i not in fixed]
    lengths = [int(d) for d in draws]
    # Scale the others to the total, within 1 .. LONGEST, then share out what rounding left, one token at a time.
    want = total - sum(lengths[i] for i in fixed)
    if free:
        scale = want / sum(draws[i] for i in free)
        for i in free:
            lengths[i] = min(longest, max(1, int(draws[i] * scale)))
    order = free or list(range(count))
    step = 0
    while sum(lengths) != total:
        i = order[step % len(order)]
        if sum(lengths) < total and lengths[i] < longest:
            lengths[i] += 1
        elif sum(lengths) > total and lengths[i] > 1:
            lengths[i] -= 1
        step += 1
        if step > 4 * total + 4 * count:  # only the ends are free to move: let them
            order = list(range(count))
    return lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("count", type=int, help="sequences in the pack")
    parser.add_argument("total", type=int, help="tokens in all")
    parser.add_argument("longest", type=int, help="the longest sequence's length (the shortest is 1)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    try:
        print(",".join(str(n) for n in pack_lengths(args.count, args.total, args.longest, args.seed)))
    except ValueError as e:
        parser.error(str(e))


if __name__ == "__main__":
    main()
