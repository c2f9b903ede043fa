#!/bin/sh
# Compiler launcher for the Hopper steps (CUDA_COMPILER_LAUNCHER, set by add_step): runs the nvcc
# command it is given unchanged, passes its messages through, and keeps a copy of them in LOG_DIR, one
# file per object, so that ctest can read what ptxas said about the build (check_ptxas.cmake).
#
#   ptxas_log.sh LOG_DIR nvcc ARGS...
log_dir=$1
shift
object=unknown
previous=
for arg in "$@"; do
  [ "$previous" = "-o" ] && object=$arg
  previous=$arg
done
mkdir -p "$log_dir"
log="$log_dir/$(basename "$object").log"
"$@" 2> "$log.tmp"
status=$?
cat "$log.tmp" >&2
mv "$log.tmp" "$log"
exit $status
