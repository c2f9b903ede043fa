#!/usr/bin/env bash
# The decode roofline of this GPU, in one command: the effective bandwidth (K and V read once, over the time) of the
# decode steps over batch x cache length x new tokens x page size, with the HBM read ceiling measured in the same run
# (bench/ceilings.py) and the peers on the same caches: cuDNN through SDPA (contiguous caches) and FlashAttention-4
# (contiguous and paged, where FA_PEER_SITE names the folder bench/fa4_wheels.sh installed it into). Alternating
# rounds (the steps, then the peers, per page size), as bench/hopper_rounds.sh times the training kernels.
#
#   bash bench/decode_roofline.sh [ROUNDS]      (default 2; this tree built in build/ already)
# (Written in session 13, 2026-11-29; first run on the H200 in session 14, one round over one cache: the smoke run in
# docs/results/h200-2026-11-29-decode-roofline-smoke.csv.)
#
# Every round's rows go to $OUT/roofline.csv (fa-bench's columns; the suite column round<k>, or round<k>-pages<N>
# on pages of N tokens), the ceilings' too (suite ceiling); the medians over the rounds:
#   python3 tools/tables.py roofline --csv $OUT/roofline.csv
# With several new tokens each configuration is timed without the mask and with the bottom-right causal mask.
# FA_ROOFLINE_STEPS: decode steps (default 46); FA_ROOFLINE_CACHES: B,Nkv pairs (default below: 1 to 64 sequences,
# 2,048 to 131,072 keys, at most 2^18 keys in all: fa-bench draws each configuration's inputs on the host), or
# B,Nkv,Hq,Hkv,d for a cache with heads of its own; either form may end in :T1/T2/... for new tokens of its own
# (issue 57's four: "8,8192 1,131072 64,2048 8,8192,16,16,64:1");
# FA_ROOFLINE_TOKENS: new tokens (default 1 2 4 8);
# FA_ROOFLINE_PAGES: page sizes, 0 for a contiguous cache (default 0 16 64 256); FA_ROOFLINE_HEADS: Hq,Hkv,d
# (default 32,8,128), for the caches that name none; FA_ROOFLINE_DTYPES (default f16; f16,bf16 for both).
# The peers: cuDNN and FlashAttention-2 through SDPA on the contiguous caches; FlashAttention-4 on every cache where
# FA_PEER_SITE is set, its compiled kernels kept on disk (FLASH_ATTENTION_CUTE_DSL_CACHE_DIR, default /tmp/fa4-cache)
# and compiled before round 1 by one process a page size at once (FA4 compiles each kind of call once, seconds each:
# without that, round 1's FA4 rows would wait on the compiler and each later process would compile again).
# FA_ROOFLINE_GPUS="0 1": the (cache, dtype) pairs dealt out over those GPUs in turn, each GPU's share one run a dtype
# (its read ceiling, its alternating rounds), the GPUs at the same time, their rows then one CSV ($OUT/gpu<N>-<dtype>/
# keeps each run's files).
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
rounds=${1:-2}
steps=${FA_ROOFLINE_STEPS:-46}
read -r -a caches <<< "${FA_ROOFLINE_CACHES:-1,8192 1,32768 1,131072 8,2048 8,8192 8,32768 64,2048 64,4096}"
read -r -a tokens <<< "${FA_ROOFLINE_TOKENS:-1 2 4 8}"
read -r -a pages <<< "${FA_ROOFLINE_PAGES:-0 16 64 256}"
IFS=, read -r q_heads kv_heads head_dim <<< "${FA_ROOFLINE_HEADS:-32,8,128}"
dtypes=${FA_ROOFLINE_DTYPES:-f16}
work=$OUT/roofline
[ -x build/bench/fa-bench ] || { echo "build/bench/fa-bench is missing: build this tree first"; exit 1; }

shapes=""
for cache in "${caches[@]}"; do
  own_tokens=""; [ "${cache#*:}" = "$cache" ] || own_tokens=${cache#*:}
  IFS=, read -r b kv hq hkv d extra <<< "${cache%%:*}"
  if [ -z "$b" ] || [ -z "$kv" ] || [ -n "$extra" ] || { [ -n "$hq" ] && [ -z "$d" ]; } ||
     [[ ! "$b$kv$hq$hkv$d" =~ ^[0-9]+$ ]] || [[ -n "$own_tokens" && ! "$own_tokens" =~ ^[0-9]+(/[0-9]+)*$ ]]; then
    echo "FA_ROOFLINE_CACHES: '$cache' is neither B,Nkv nor B,Nkv,Hq,Hkv,d, with :T1/T2/... or without"; exit 2
  fi
  read -r -a these <<< "${own_tokens:+${own_tokens//\// }}"; [ -n "$own_tokens" ] || these=("${tokens[@]}")
  for n in "${these[@]}"; do shapes+="$b,$n,$kv,${hq:-$q_heads},${hkv:-$kv_heads},${d:-$head_dim} "; done
done

if [ -n "${FA_ROOFLINE_GPUS:-}" ]; then  # each GPU a share of the (cache, dtype) pairs, in turn; this script on each
  read -r -a gpus <<< "$FA_ROOFLINE_GPUS"
  for g in "${gpus[@]}"; do
    [[ "$g" =~ ^[0-9]+$ ]] ||
      { echo "FA_ROOFLINE_GPUS: '$g' is not a GPU's index (0, 1, ... as CUDA_VISIBLE_DEVICES takes them)"; exit 2; }
  done
  # A cache in each dtype is a pair of its own, so that one long cache (B = 1, 131,072 keys) is two GPUs' work, not
  # one's: list the caches longest first and the short ones fill in behind them.
  share=(); i=0
  for cache in "${caches[@]}"; do
    for dtype in ${dtypes//,/ }; do share[i % ${#gpus[@]}]+="$cache@$dtype "; i=$((i + 1)); done
  done
  status=0; pids=()
  for i in "${!gpus[@]}"; do
    [ -n "${share[i]:-}" ] || continue
    (  # one run a dtype of the share, one after another: each its own read ceiling and alternating rounds
      failed=0
      for dtype in $(tr ' ' '\n' <<< "${share[i]}" | sed -n 's/.*@//p' | awk '!seen[$0]++'); do
        mine=$(tr ' ' '\n' <<< "${share[i]}" | sed -n "s/@$dtype\$//p" | tr '\n' ' ')
        CUDA_VISIBLE_DEVICES=${gpus[i]} OUT=$OUT/gpu${gpus[i]}-$dtype FA_ROOFLINE_CACHES="$mine" FA_ROOFLINE_DTYPES=$dtype \
          FA_ROOFLINE_GPUS='' bash "$0" "$rounds" > "$OUT/gpu${gpus[i]}-$dtype.log" 2>&1 || failed=1
      done
      exit $failed
    ) &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  # One CSV: every run's ceilings first, then every run's rows (the header once).
  first=1
  for f in "$OUT"/gpu*/roofline.csv; do
    [ -f "$f" ] || { status=1; continue; }
    if [ $first = 1 ]; then head -1 "$f"; first=0; fi
    grep ',ceiling,' "$f"
  done > "$OUT/roofline.csv"
  for f in "$OUT"/gpu*/roofline.csv; do [ -f "$f" ] && tail -n +2 "$f" | grep -v ',ceiling,'; done >> "$OUT/roofline.csv"
  for i in "${!gpus[@]}"; do
    echo "GPU ${gpus[i]}: ${share[i]:-nothing}"
    for log in "$OUT/gpu${gpus[i]}"-*.log; do [ -f "$log" ] && tail -1 "$log"; done
  done
  echo "$(($(wc -l < "$OUT/roofline.csv") - 1)) rows in $OUT/roofline.csv"
  exit $status
fi
rm -rf "$work"; mkdir -p "$work"
backends=cudnn,flash
if [ -n "${FA_PEER_SITE:-}" ]; then
  backends=cudnn,flash,fa4
  export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=${FLASH_ATTENTION_CUTE_DSL_CACHE_DIR:-/tmp/fa4-cache}
else
  echo "FlashAttention-4 not timed: FA_PEER_SITE is not set"
fi

status=0
python3 bench/ceilings.py --csv "$OUT/roofline-ceilings.csv" > "$OUT/roofline-ceilings.txt" 2>&1 || { status=1; tail -3 "$OUT/roofline-ceilings.txt"; }
if [ "$backends" != "${backends%fa4}" ]; then  # FA4's compiles, one process a page size; their rows are not kept
  start=$(date +%s)
  for page in "${pages[@]}"; do
    paging=(); [ "$page" = 0 ] || paging=(--page-size "$page")
    python3 bench/sdpa_peers.py --pass decode --shape "$shapes" --dtypes "$dtypes" --causal no,yes --backends fa4 \
      "${paging[@]}" --csv "$work/compile-$page.csv" > "$work/compile-$page.txt" 2>&1 &
  done
  wait; rm -f "$work"/compile-*.csv
  echo "== FlashAttention-4 compiled in $(( $(date +%s) - start )) s"
fi
for round in $(seq 1 "$rounds"); do
  for page in "${pages[@]}"; do
    paging=(); [ "$page" = 0 ] || paging=(--page-size "$page")
    echo "== round $round: steps $steps, pages of ${page/#0/no}"
    build/bench/fa-bench --decode --shape "$shapes" --steps "$steps" --dtypes "$dtypes" --causal both --no-baseline \
      "${paging[@]}" --csv "$work/steps-$round-$page.csv" > "$work/steps-$round-$page.txt" 2>&1 ||
      { status=1; tail -3 "$work/steps-$round-$page.txt"; }
    echo "== round $round: peers, pages of ${page/#0/no}"
    peers=$backends; [ "$page" = 0 ] || peers=${backends/cudnn,flash/}; peers=${peers#,}
    [ -n "$peers" ] || continue  # SDPA takes no paged cache
    python3 bench/sdpa_peers.py --pass decode --shape "$shapes" --dtypes "$dtypes" --causal no,yes \
      --backends "$peers" "${paging[@]}" --csv "$work/peers-$round-$page.csv" > "$work/peers-$round-$page.txt" 2>&1 ||
      { status=1; tail -3 "$work/peers-$round-$page.txt"; }
  done
done
python3 bench/merge_rounds.py "$work" "$OUT/roofline.csv.tmp" > /dev/null || status=1
# The ceilings keep their suite (merge_rounds.py gives every file's rows a round): one CSV, the ceilings first.
{ cat "$OUT/roofline-ceilings.csv" 2> /dev/null || head -1 "$OUT/roofline.csv.tmp"; tail -n +2 "$OUT/roofline.csv.tmp"; } > "$OUT/roofline.csv"
rm -f "$OUT/roofline.csv.tmp"
echo "$(($(wc -l < "$OUT/roofline.csv") - 1)) rows in $OUT/roofline.csv"
exit $status
