#!/usr/bin/env bash
# The course's one recorded run: every step and variant of every part, and the peers, at the shapes where each
# part's lessons act (tools/tables.py's PART_SHAPES), into one CSV that the top README's part tables are printed
# from (`python3 tools/tables.py parts --write README.md` re-prints every block whose marker names the CSV).
#
#   bash bench/course_run.sh OUT.csv [SECTION ...]     (this tree built in build/ already)
#
# Sections, all by default, in this order; each appends its rows to OUT.csv, so a run split across calls
# (device time is lent in slices) still ends in one file:
#   forward   fa-bench: the teaching (B=4 H=8 N=1024) and headline (B=4 H=16 N=4096) shapes at d = 64 and
#             d = 128, f32 (the CUDA-core steps' chain) and f16, no mask, with the cuBLAS baseline
#   backward  fa-bench --suite backward (the teaching shape in f32 and f16, then B=4 N=4096 d = 64 and 128 and
#             B=1 N=16384 d = 128 in f16 and bf16, causal and not)
#   decode    fa-bench --suite decode (issue 32's four shapes, f16 and bf16), then the steps that take a paged cache
#             on pages of 16, 64 and 256 tokens in a shuffled order (fa-bench --page-size, f16; suite decode-pagesN)
#   peers     SDPA's FlashAttention-2 and cuDNN backends (bench/sdpa_peers.py) at the same shapes and passes, f16
#             (and bf16 for the backward and decode); FlashAttention-4 (sdpa_peers.py --backends fa4) where
#             FA_PEER_SITE names its install (bench/fa4_wheels.sh), forward and backward; FlashAttention-3
#             (bench/fa3_peer.py, the flash-attn3-jax wheel in .whl/ or FA3_WHEEL, d = 128) for the forward and the
#             backward; the GPU's ceilings (bench/ceilings.py: the HBM read that bounds decode, a copy, a bf16 GEMM;
#             pass ceiling)
# FA_COURSE_REPS sets fa-bench's --reps (default: its own, about 1 s of launches a measurement). Where device time
# is short: FA_COURSE_SHAPES picks the forward's shapes (default all four, as B,Nq,Nkv,Hq,Hkv,d), FA_COURSE_F32 the
# ones also timed in f32 (default all; the f32 chain of the README is the teaching shapes'), FA_COURSE_MAX_MS skips
# the forward steps slower than that a call (fa-bench --max-ms; e.g. the CUDA-core steps at the headline shapes),
# FA_COURSE_PAGES the page sizes (default "16 64 256"); the runs file says what a run left out.
set -uo pipefail
csv=${1:?usage: bash bench/course_run.sh OUT.csv [forward] [backward] [decode] [peers]}
shift
sections=${*:-forward backward decode peers}
bench=build/bench/fa-bench
[ -x "$bench" ] || { echo "$bench is missing: build this tree first"; exit 1; }
work=$(mktemp -d)
reps=()
[ -n "${FA_COURSE_REPS:-}" ] && reps=(--reps "$FA_COURSE_REPS")
max_ms=()
[ -n "${FA_COURSE_MAX_MS:-}" ] && max_ms=(--max-ms "$FA_COURSE_MAX_MS")
all_forward_shapes="4,1024,1024,8,8,64 4,1024,1024,8,8,128 4,4096,4096,16,16,64 4,4096,4096,16,16,128"
forward_shapes=${FA_COURSE_SHAPES:-$all_forward_shapes}
f32_shapes=${FA_COURSE_F32:-$all_forward_shapes}
status=0
say() { echo "== $* ($SECONDS s)"; }

# merge: the finished section's CSVs into OUT.csv, after the rows already there, with fa-bench's header
# (tools/plots.py's COLUMNS) once; so a call cut short keeps every section it finished.
merge() {
  compgen -G "$work/*.csv" > /dev/null || return 0
  python3 - "$csv" "$work"/*.csv <<'EOF'
import csv, os, sys
sys.path.insert(0, "tools")
from plots import COLUMNS
out, parts = sys.argv[1], sys.argv[2:]
rows = []
if os.path.exists(out) and os.path.getsize(out):
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
for path in parts:
    with open(path, newline="") as f:
        rows += list(csv.DictReader(f))
with open(out, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
print(f"{len(rows)} rows in {out}")
EOF
  rm -f "$work"/*.csv
}

for section in $sections; do
  case $section in
    forward)
      for shape in $forward_shapes; do
        say "forward $shape"
        dtypes=f16
        [[ " $f32_shapes " == *" $shape "* ]] && dtypes=f32,f16
        "$bench" --shape "$shape" --dtypes "$dtypes" --causal no "${reps[@]}" "${max_ms[@]}" --csv "$work/forward-${shape//,/x}.csv" \
          > "$work/forward-${shape//,/x}.txt" 2>&1 || { status=1; tail -3 "$work/forward-${shape//,/x}.txt"; }
        merge  # shape by shape: the last shape alone takes minutes, and a call cut short keeps the others
      done ;;
    backward)
      say backward
      "$bench" --suite backward "${reps[@]}" --csv "$work/backward.csv" > "$work/backward.txt" 2>&1 ||
        { status=1; tail -3 "$work/backward.txt"; } ;;
    decode)
      say decode
      "$bench" --suite decode "${reps[@]}" --csv "$work/decode.csv" > "$work/decode.txt" 2>&1 ||
        { status=1; tail -3 "$work/decode.txt"; }
      for pages in ${FA_COURSE_PAGES-16 64 256}; do
        say "decode, pages of $pages"
        "$bench" --suite decode --page-size "$pages" --dtypes f16 --no-baseline "${reps[@]}" \
          --csv "$work/decode-pages$pages.csv" > "$work/decode-pages$pages.txt" 2>&1 ||
          { status=1; tail -3 "$work/decode-pages$pages.txt"; }
      done ;;
    peers)
      say ceilings
      python3 bench/ceilings.py --csv "$work/ceilings.csv" || status=1
      for shape in $forward_shapes; do
        say "peers forward $shape"
        python3 bench/sdpa_peers.py --pass forward --shape "$shape" --dtypes f16 --causal no --backends flash,cudnn \
          --csv "$work/peers-forward.csv" > /dev/null 2>&1 || status=1
      done
      say "peers backward, decode"
      python3 bench/sdpa_peers.py --pass backward --suites backward --dtypes f16,bf16 --backends flash,cudnn \
        --csv "$work/peers-backward.csv" > /dev/null 2>&1 || status=1
      python3 bench/sdpa_peers.py --pass decode --suites decode --dtypes f16,bf16 --causal no --backends flash,cudnn \
        --csv "$work/peers-decode.csv" > /dev/null 2>&1 || status=1
      if [ -n "${FA_PEER_SITE:-}" ]; then  # FlashAttention-4, installed by bench/fa4_wheels.sh
        for shape in $forward_shapes; do
          say "FlashAttention-4 forward $shape"
          python3 bench/sdpa_peers.py --pass forward --shape "$shape" --dtypes f16 --causal no --backends fa4 \
            --csv "$work/fa4.csv" > /dev/null 2>&1 || status=1
        done
        say "FlashAttention-4 backward"
        python3 bench/sdpa_peers.py --pass backward --suites backward --dtypes f16,bf16 --backends fa4 \
          --csv "$work/fa4.csv" > /dev/null 2>&1 || status=1
      else
        echo "FlashAttention-4 not timed: FA_PEER_SITE is not set (see bench/fa4_wheels.sh)"
      fi
      fa3_wheel=${FA3_WHEEL:-$(ls .whl/flash_attn3_jax-*.whl 2> /dev/null | head -1)}
      if [ -n "$fa3_wheel" ] &&
         python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/fa3-site \
           "$fa3_wheel" > /dev/null 2>&1; then
        for shape in 4,1024,1024,8,8,128 4,4096,4096,16,16,128 1,16384,16384,16,16,128; do
          say "FlashAttention-3 $shape"
          pass=both
          [ "$shape" = 1,16384,16384,16,16,128 ] && pass=backward
          PYTHONPATH=/tmp/fa3-site XLA_PYTHON_CLIENT_PREALLOCATE=false python3 bench/fa3_peer.py --pass $pass \
            --shape "$shape" --dtypes f16,bf16 --csv "$work/fa3.csv" > /dev/null 2>&1 || status=1
        done
      else
        echo "FlashAttention-3 not timed: no flash-attn3-jax wheel in .whl/ (see bench/fa3_peer.py)"
      fi ;;
    *) echo "unknown section '$section': expected forward, backward, decode or peers"; exit 1 ;;
  esac
  merge
done
exit $status
