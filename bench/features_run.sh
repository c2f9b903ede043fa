#!/usr/bin/env bash
# Issue 58's one run: the models' features in the Hopper steps against FlashAttention-4 with the same feature and
# against the same steps without it, forward and backward, each in alternating rounds (bench/hopper_rounds.sh), and
# every row in one CSV, $OUT/features.csv. Five runs of hopper_rounds.sh, each the measurement of a few bars:
#
#   forward       steps 25, 49-52 at 1 x 16k and 4 x 4k, causal: none, a window (1024, 0), a cap of 50, sinks
#   forward pack  step 52, a pack of 100 sequences of 1 .. 4096 tokens (131,072 in all) against 32 x 4096
#   backward      steps 53-55 and 61 at 1 x 16k, causal: none, the window, the cap, sinks
#   backward pack step 56, the same pack against 32 x 4096, causal
#   head_dim 256  steps 57, 58, 60, 61 at 4 x 4096, forward and backward, causal and not
#
# all bf16, H = 16, d = 128 but the last; FlashAttention-4 where FA_PEER_SITE names its install (bench/fa4_wheels.sh),
# cuDNN and FlashAttention-2 through SDPA where they take the problem. FA_FEATURES_GPUS="0 1 2 3" deals the five
# runs over those GPUs, the longest first, each GPU's runs one after another ($OUT/run<k>/ keeps each run's files);
# the default, one GPU, runs them in turn. `python3 tools/tables.py features --csv $OUT/features.csv [--pass backward]`
# prints the features against none and FA4, `tools/tables.py feature-bars --csv …` checks issue 58's bars.
#
#   FA_PEER_SITE=/tmp/fa4-site FA_FEATURES_GPUS="0 1 2 3" bash bench/features_run.sh [ROUNDS]     (default 2)
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
rounds=${1:-2}
[ -x build/bench/fa-bench ] || { echo "build/bench/fa-bench is missing: build this tree first"; exit 1; }
read -r -a gpus <<< "${FA_FEATURES_GPUS:-0}"
for g in "${gpus[@]}"; do
  [[ "$g" =~ ^[0-9]+$ ]] ||
    { echo "FA_FEATURES_GPUS: '$g' is not a GPU's index (0, 1, ... as CUDA_VISIBLE_DEVICES takes them)"; exit 2; }
done
pack=$(python3 bench/pack_lengths.py 100 131072 4096) || exit 1
features="none;--window 1024,0;--softcap 50;--sinks"

# The runs, the longest first (session 17's and 21's times): each one line of hopper_rounds.sh's settings.
runs=(
  "FA_ROUND_STEPS=25,49,50,51,52 FA_ROUND_PASS=forward FA_ROUND_CAUSAL=yes FA_ROUND_SHAPES='1,16384,16384,16,16,128 4,4096,4096,16,16,128' FA_ROUND_FEATURES='$features'"
  "FA_ROUND_STEPS=53,54,55,61 FA_ROUND_PASS=backward FA_ROUND_CAUSAL=yes FA_ROUND_SHAPES=1,16384,16384,16,16,128 FA_ROUND_FEATURES='$features'"
  "FA_ROUND_STEPS=52 FA_ROUND_PASS=forward FA_ROUND_CAUSAL=both FA_ROUND_SHAPES=32,4096,4096,16,16,128 FA_ROUND_FEATURES='none;--varlen $pack'"
  "FA_ROUND_STEPS=56 FA_ROUND_PASS=backward FA_ROUND_CAUSAL=yes FA_ROUND_SHAPES=32,4096,4096,16,16,128 FA_ROUND_FEATURES='none;--varlen $pack'"
  "FA_ROUND_STEPS=57,58,60,61 FA_ROUND_PASS=both FA_ROUND_CAUSAL=both FA_ROUND_SHAPES=4,4096,4096,16,16,256 FA_ROUND_FEATURES=none"
)
share=()
for i in "${!runs[@]}"; do share[i % ${#gpus[@]}]+="$i "; done
status=0; pids=()
for i in "${!gpus[@]}"; do
  [ -n "${share[i]:-}" ] || continue
  (
    for k in ${share[i]}; do
      echo "== $(date +%T) run $k on GPU ${gpus[i]}: ${runs[k]}"
      env CUDA_VISIBLE_DEVICES="${gpus[i]}" OUT="$OUT/run$k" FA_ROUND_DTYPES=bf16 \
        bash -c "export ${runs[k]}; exec bash bench/hopper_rounds.sh $rounds" > "$OUT/run$k.log" 2>&1 ||
        echo "run $k failed: $(tail -1 "$OUT/run$k.log")"
    done
  ) > "$OUT/gpu${gpus[i]}.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
# One CSV: fa-bench's header once, then every run's rows (each with its round in the suite column).
first=1
for k in "${!runs[@]}"; do
  f=$OUT/run$k/rounds.csv
  [ -f "$f" ] || { echo "run $k left no rounds.csv ($OUT/run$k.log)"; status=1; continue; }
  if [ $first = 1 ]; then head -1 "$f"; first=0; fi
  tail -n +2 "$f"
done > "$OUT/features.csv"
cat "$OUT"/gpu*.log
echo "$(($(wc -l < "$OUT/features.csv") - 1)) rows in $OUT/features.csv"
exit $status
