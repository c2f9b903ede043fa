#!/usr/bin/env bash
# The Hopper steps against the libraries, in one call and in alternating rounds (ours, peers, ours,
# peers): the peers drift by about 5 % from call to call and within one, so each side gets the same
# stretches of time. Peers: PyTorch SDPA's cuDNN and FlashAttention-2 backends (bench/sdpa_peers.py)
# and FlashAttention-3 (bench/fa3_peer.py, from the flash-attn3-jax wheel in .whl/, d = 128 only), and
# FlashAttention-4 (sdpa_peers.py --backends fa4) where FA_PEER_SITE names the folder it was installed into
# (bench/fa4_wheels.sh install).
# Every round's rows go to $OUT/rounds.csv, each with its round in the suite column (round1, round2, ...);
# `python3 tools/tables.py rounds --csv $OUT/rounds.csv --steps 24,25` prints the medians over rounds.
#
#   bash bench/hopper_rounds.sh [ROUNDS]      (default 2; this tree built in build/ already)
# FA_ROUND_STEPS: the steps to time (default 20,21,22,23,24); FA_ROUND_SHAPES: B,Nq,Nkv,Hq,Hkv,d list;
# FA_ROUND_DTYPES (default f16,bf16); FA_ROUND_BENCH: another fa-bench to time the same way (an
# earlier tree's, for an ablation), its rows tagged old; FA_ROUND_PASS: forward (default), backward, both or
# decode, the peers' pass (fa-bench times each step's own; FlashAttention-3 is not timed for decode); FA3_WHEEL:
# the flash-attn3-jax wheel where it is not in .whl/ (a call that carries the FA4 wheels has no room for it).
# FA_ROUND_CAUSAL: yes, no or both (default both). FA_ROUND_FEATURES: the model features' runs of each round and
# shape, separated by ';', each `none` or the flags fa-bench and sdpa_peers.py both take (`--window 1024,0`,
# `--softcap 50`, `--sinks`, `--varlen L1,L2,..`), e.g. "none;--window 1024,0;--softcap 50;--sinks"; a step that
# does not take a feature is skipped with its reason, SDPA's backends refuse them all (FlashAttention-4 takes them);
# `python3 tools/tables.py features --csv $OUT/rounds.csv` prints each feature against none and FA4.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT/rounds"
rounds=${1:-2}
steps=${FA_ROUND_STEPS:-20,21,22,23,24}
dtypes=${FA_ROUND_DTYPES:-f16,bf16}
pass=${FA_ROUND_PASS:-forward}
causal=${FA_ROUND_CAUSAL:-both}
IFS=';' read -r -a features <<< "${FA_ROUND_FEATURES:-none}"
read -r -a shapes <<< "${FA_ROUND_SHAPES:-4,4096,4096,16,16,128 1,16384,16384,16,16,128 16,1024,1024,16,16,128 4,4096,4096,16,16,64}"
[ -x build/bench/fa-bench ] || { echo "build/bench/fa-bench is missing: build this tree first"; exit 1; }

fa3=0
fa3_wheel=${FA3_WHEEL:-$(ls .whl/flash_attn3_jax-*.whl 2> /dev/null | head -1)}
if [ -n "$fa3_wheel" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/fa3-site \
    "$fa3_wheel" > "$OUT/rounds/fa3-install.log" 2>&1 && fa3=1
fi
[ "$fa3" = 1 ] || echo "FlashAttention-3 not timed: no flash-attn3-jax wheel in .whl/ (see bench/fa3_peer.py)"
backends=flash,cudnn
if [ -n "${FA_PEER_SITE:-}" ] && [ "$pass" != decode ]; then
  backends=flash,cudnn,fa4
else
  echo "FlashAttention-4 not timed: FA_PEER_SITE is not set (see bench/fa4_wheels.sh)"
fi

for round in $(seq 1 "$rounds"); do
  for shape in "${shapes[@]}"; do
    for f in "${!features[@]}"; do
      feature=${features[$f]}
      flags=(); [ "$feature" = none ] || read -r -a flags <<< "$feature"
      tag=${shape//,/x}; [ "$feature" = none ] || tag="${tag}_feature$f"  # a pack's list is too long for a name
      echo "== $(date +%T) round $round: steps $steps at $shape${flags[*]:+ with ${flags[*]}}"
      build/bench/fa-bench --shape "$shape" --steps "$steps" --dtypes "$dtypes" --causal "$causal" --reps 30 \
        --no-baseline "${flags[@]}" --csv "$OUT/rounds/ours-$round-$tag.csv" > "$OUT/rounds/ours-$round-$tag.txt" 2>&1
      if [ -n "${FA_ROUND_BENCH:-}" ]; then
        "$FA_ROUND_BENCH" --shape "$shape" --steps "${FA_ROUND_OLD_STEPS:-$steps}" --dtypes "$dtypes" --causal "$causal" \
          --reps 30 --no-baseline "${flags[@]}" --csv "$OUT/rounds/old-$round-$tag.csv" > "$OUT/rounds/old-$round-$tag.txt" 2>&1
      fi
      echo "== $(date +%T) round $round: peers at $shape${flags[*]:+ with ${flags[*]}}"
      python3 bench/sdpa_peers.py --pass "$pass" --shape "$shape" --dtypes "$dtypes" --causal "${causal/both/no,yes}" \
        --backends "$backends" --reps 30 "${flags[@]}" \
        --csv "$OUT/rounds/peers-$round-$tag.csv" > "$OUT/rounds/peers-$round-$tag.txt" 2>&1
      if [ "$fa3" = 1 ] && [ "${shape##*,}" = 128 ] && [ "$pass" != decode ] && [ "$feature" = none ]; then
        PYTHONPATH=/tmp/fa3-site XLA_PYTHON_CLIENT_PREALLOCATE=false python3 bench/fa3_peer.py --pass "$pass" \
          --shape "$shape" --dtypes "$dtypes" --csv "$OUT/rounds/fa3-$round-$tag.csv" > "$OUT/rounds/fa3-$round-$tag.txt" 2>&1 ||
          tail -5 "$OUT/rounds/fa3-$round-$tag.txt"
      fi
    done
  done
done

# One CSV: fa-bench's header once, each row with its round in the suite column (round1, round2, ...).
python3 bench/merge_rounds.py "$OUT/rounds" "$OUT/rounds.csv"
