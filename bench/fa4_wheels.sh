#!/usr/bin/env bash
# FlashAttention-4 (PyPI flash-attn-4, CuTe DSL) for a GPU machine without network, as a peer of the course's
# Hopper steps (bench/sdpa_peers.py --backends fa4). With network, `pip install flash-attn-4` does the same.
#
#   bash bench/fa4_wheels.sh download          here, with pip and network: the wheels for Python 3.12 into .whl/fa4/
#                                              and the two carry folders .fa4a/ and .fa4b/ (see below)
#   bash bench/fa4_wheels.sh stash             there, in a first call that carries .fa4a/: keeps its part in /tmp
#   bash bench/fa4_wheels.sh install [DIR]     there, in a later call (same machine) that carries .fa4b/: joins the
#                                              parts and installs every wheel into DIR (default /tmp/fa4-site)
#
# then: FA_PEER_SITE=DIR python3 bench/sdpa_peers.py --backends fa4,cudnn,flash ... (sdpa_peers.py hands DIR to
# site.addsitedir: the CuTe DSL's .pth file puts `cutlass` on the path, which PYTHONPATH alone would not).
# The CuTe DSL's libraries for CUDA 13 are one wheel of about 92 MB, more than one device call may carry (64 MiB), so
# it travels in two halves: .fa4a/ holds the first, .fa4b/ the second and every other wheel (about 52 MB).
# FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 and FLASH_ATTENTION_CUTE_DSL_CACHE_DIR keep FA4's compiled kernels on
# disk: the first call of each configuration compiles it (seconds), later processes load it.
set -euo pipefail
# The versions the course's runs used (docs/results/runs/h200-2026-11-29-session-12.txt). libs-core holds the CuTe
# DSL's Python package (cutlass.cute); libs-cu13 its compiler and runtime for CUDA 13.
WHEELS=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
        torch-c-dlpack-ext==0.1.5 apache-tvm-ffi==0.1.15.post2)
BIG=nvidia_cutlass_dsl_libs_cu13
cd "$(dirname "$0")/.."

case "${1:-}" in
  download)
    mkdir -p .whl/fa4 .fa4a .fa4b
    platforms=()
    for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
             manylinux2014_x86_64; do platforms+=(--platform "$p"); done
    python3 -m pip download --pre --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${platforms[@]}" -d .whl/fa4 "${WHEELS[@]}"
    rm -f .fa4a/* .fa4b/*
    split -b 46M .whl/fa4/$BIG-*.whl /tmp/$BIG.part-
    mv /tmp/$BIG.part-aa .fa4a/ && mv /tmp/$BIG.part-ab .fa4b/
    [ ! -e /tmp/$BIG.part-ac ] || { echo "the $BIG wheel split into more than two parts"; exit 1; }
    find .whl/fa4 -name '*.whl' ! -name "$BIG-*" -exec cp {} .fa4b/ \;
    basename .whl/fa4/$BIG-*.whl > .fa4b/$BIG.name
    for folder in .whl .fa4a .fa4b; do
      grep -qx "/$folder/" .git/info/exclude 2>/dev/null || echo "/$folder/" >> .git/info/exclude
    done
    du -sh .fa4a .fa4b ;;
  stash)
    mkdir -p /tmp/fa4parts && cp .fa4a/$BIG.part-aa /tmp/fa4parts/ && ls -la /tmp/fa4parts ;;
  install)
    site=${2:-/tmp/fa4-site}
    [ -e /tmp/fa4parts/$BIG.part-aa ] || { echo "no /tmp/fa4parts/$BIG.part-aa: run 'stash' first, on this machine"; exit 1; }
    wheel=/tmp/$(cat .fa4b/$BIG.name)
    cat /tmp/fa4parts/$BIG.part-aa .fa4b/$BIG.part-ab > "$wheel"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      .fa4b/*.whl "$wheel"
    python3 -c "import site, sys; site.addsitedir(sys.argv[1]); import flash_attn.cute, cutlass; \
print('FlashAttention-4 in', sys.argv[1], '- CuTe DSL', cutlass.__version__)" "$site" ;;
  *)
    echo "usage: bash bench/fa4_wheels.sh download | stash | install [DIR]"; exit 2 ;;
esac
