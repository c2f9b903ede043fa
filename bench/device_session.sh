#!/usr/bin/env bash
# One GPU session in one call: build, the whole test suite (bench/gpu_suite.py, over every GPU), the benchmark,
# then compute-sanitizer (memcheck and racecheck) over the GPU tests.
# Logs and the CSV go to $OUT (default ./out). Used on the lent H100 like this:
#   bash bench/device_session.sh [fa-bench options...]
# FA_TRACE=1 also runs step 02's trace suite (fa-bench --suite trace) into $OUT/trace.*.
# Catch2 comes from a carried Debian package (.gpu-deps/catch2_*.deb) when the
# machine has none installed.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
prefix_args=()
if ls .gpu-deps/catch2_*.deb >/dev/null 2>&1; then
  dpkg -x .gpu-deps/catch2_*.deb /tmp/c2 && prefix_args=(-DCMAKE_PREFIX_PATH=/tmp/c2/usr)
fi
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -1
} > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=${FA_ARCH:-90} \
      -DFA_PTXAS_VERBOSE=ON "${prefix_args[@]}" > "$OUT/build.log" 2>&1 &&
  cmake --build build -j"$(nproc)" >> "$OUT/build.log" 2>&1
status=$?
grep -E "error|warning" "$OUT/build.log" | grep -v "ptxas info" | head -20
if [ $status -ne 0 ]; then tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1; fi

# The whole suite over every GPU of the machine from one queue (bench/gpu_suite.py). FA_SUITE_DEADLINE (seconds)
# stops it in time for the rest of a device call; with FA_SUITE_STATE outside $OUT (e.g. /tmp/fa-suite) the next
# call on the same machine runs only the tests left.
echo "== the suite"
state=${FA_SUITE_STATE:-$OUT/suite}
python3 bench/gpu_suite.py --build build --state "$state" ${FA_SUITE_DEADLINE:+--deadline "$FA_SUITE_DEADLINE"} \
  --keep-logs "^mutants/" > "$OUT/suite.log" 2>&1
tail -n 12 "$OUT/suite.log"
[ "$state" = "$OUT/suite" ] || cp "$state/results.tsv" "$OUT/suite-results.tsv"

if [ "${FA_BENCH:-1}" = 1 ]; then
  echo "== fa-bench $*"
  build/bench/fa-bench --csv "$OUT/bench.csv" "$@" > "$OUT/bench.txt" 2> "$OUT/bench-progress.log"
  echo "exit $?"; cat "$OUT/bench.txt"; grep skip "$OUT/bench-progress.log" | sort | uniq | head -20
fi

if [ "${FA_TRACE:-0}" = 1 ]; then
  echo "== fa-bench --suite trace"
  build/bench/fa-bench --suite trace --csv "$OUT/trace.csv" > "$OUT/trace.txt" 2> "$OUT/trace-progress.log"
  echo "exit $?"; cat "$OUT/trace.txt"; cat "$OUT/trace-progress.log"
fi

# FA_EXTRA: a command run after the benchmark, before the sanitizers (e.g. ncu).
if [ -n "${FA_EXTRA:-}" ]; then
  echo "== $FA_EXTRA"
  bash -c "$FA_EXTRA"
fi

# compute-sanitizer is 10-100x slower than a plain run, so it runs last, one
# process per step and tool side by side (each with its own time limit), over
# the shapes up to FA_SANITIZE_MAX_LEN long, plus one process for the
# non-attention GPU tests (reductions, trace).
if [ "${FA_SANITIZE:-1}" = 1 ]; then
  steps=$(ctest --test-dir build -N | grep -oE "step[0-9]+/" | sort -u | tr -d 'step/')
  # The other GPU tests (reductions over every block size, the trace) run one
  # test case per process: together they outran racecheck's time limit.
  others=$(build/tests/fa_tests "[gpu]~[attention]~[backward]~[large]" --list-test-names-only | grep -v '^$' | awk '{print "other" NR}')
  targets="${FA_SANITIZE_STEPS:-$steps cublas} ${FA_SANITIZE_OTHER-$others}"
  echo "== compute-sanitizer (attention shapes up to ${FA_SANITIZE_MAX_LEN:-300} long)"
  for tool in ${FA_SANITIZE_TOOLS:-memcheck racecheck}; do
    for target in $targets; do
      if [[ "$target" == other* ]]; then
        args=("$(build/tests/fa_tests "[gpu]~[attention]~[backward]~[large]" --list-test-names-only | grep -v '^$' | sed -n "${target#other}p" | sed "s/,/\\\\,/g")")
      else
        # A backward step's cases are tagged [backward]; under "[attention]" it would check nothing.
        tag="[attention]"
        ctest --test-dir build -N | grep -q "step$target/the backward" && tag="[backward]"
        args=("$tag" --step "$target" --max-len "${FA_SANITIZE_MAX_LEN:-300}"); fi
      log="$OUT/sanitizer-$tool-$target.log"
      ( timeout "${FA_SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool $tool --error-exitcode 99 \
          build/tests/fa_tests "${args[@]}" > "$log" 2>&1; echo "exit $?" >> "$log" ) &
    done
  done
  wait
  for tool in ${FA_SANITIZE_TOOLS:-memcheck racecheck}; do
    for target in $targets; do
      log="$OUT/sanitizer-$tool-$target.log"
      printf '%-9s %-8s %-8s %s | %s\n' "$tool" "$target" "$(tail -1 "$log")" \
        "$(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1)" \
        "$(grep -hE "All tests passed|test cases:" "$log" | tail -1)"
      # Name the kernels behind any report, once each.
      grep -E -A3 "^========= (Error|Warning|Invalid|Race)" "$log" | grep -oE "_Z[A-Za-z0-9_]+" | sort | uniq -c | head -5
    done
  done
fi

# At most 8 files come back from the device: the logs travel as one archive.
(cd "$OUT" && tar czf logs.tar.gz ./*.log $(ls -d suite 2> /dev/null) && rm -rf ./*.log suite)
