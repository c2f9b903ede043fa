#!/usr/bin/env bash
# Times an earlier tree against this one in one device session, so that "nothing got slower" is a
# measurement: builds fa-bench from OLD_DIR (e.g. `git worktree add ../old <commit>`) beside this
# tree's build/, then runs both on the same shapes, alternating old and new shape by shape, into
# $OUT/old-<name>.csv and $OUT/new-<name>.csv. Then:
#   python3 tools/tables.py compare --old $OUT/old-teaching.csv --new $OUT/new-teaching.csv
#
#   bash bench/compare_trees.sh OLD_DIR            (this tree must be built in build/ already)
# FA_COMPARE_RUNS: which of teaching, headline, d128 to run (default all three).
set -uo pipefail
old_src=${1:?usage: bash bench/compare_trees.sh OLD_DIR}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
[ -x build/bench/fa-bench ] || { echo "build/bench/fa-bench is missing: build this tree first"; exit 1; }
old_build=/tmp/fa-old-build
if ! [ -x "$old_build/bench/fa-bench" ]; then
  (cmake -S "$old_src" -B "$old_build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=${FA_ARCH:-90} \
         -DFA_BUILD_TESTS=OFF && cmake --build "$old_build" -j"$(nproc)" --target fa-bench) > "$OUT/old-build.log" 2>&1 \
    || { tail -30 "$OUT/old-build.log"; echo "OLD BUILD FAILED"; exit 1; }
fi

# name | fa-bench options (the same for both trees; steps a tree lacks are left out of its list)
runs=(
  "teaching|--suite teaching --reps 30"
  "headline|--suite headline --reps 10 --max-ms 1000"
  "d128|--shape 4,4096,4096,16,16,128 --reps 20 --no-baseline"
)
for run in "${runs[@]}"; do
  name=${run%%|*}; options=${run#*|}
  [[ " ${FA_COMPARE_RUNS:-teaching headline d128} " == *" $name "* ]] || continue
  extra=()
  [ "$name" = d128 ] && extra=(--steps "${FA_COMPARE_D128_STEPS:-08,09,10,11,12,13}")
  for tree in ${FA_COMPARE_TREES:-old new}; do
    bench=build/bench/fa-bench
    [ "$tree" = old ] && bench=$old_build/bench/fa-bench
    list=("${extra[@]}")
    if [ "$name" = d128 ] && [ "$tree" = old ]; then list=(--steps 08,09); fi
    echo "== $tree $name: fa-bench $options ${list[*]}"
    # shellcheck disable=SC2086
    "$bench" $options "${list[@]}" --csv "$OUT/$tree-$name.csv" > "$OUT/$tree-$name.txt" 2> "$OUT/$tree-$name.log"
    echo "exit $?, $(grep -c . "$OUT/$tree-$name.csv") CSV lines"
  done
done

# At most 8 files come back from the lent device: everything travels as one archive.
(cd "$OUT" && files=$(ls old-* new-* 2>/dev/null) && tar czf compare.tar.gz $files && rm -f $files)
