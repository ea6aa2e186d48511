#!/usr/bin/env bash
# Configures (once) and builds loco into build/. Extra arguments go to CMake's configure step,
# e.g. scripts/build.sh -DCMAKE_PREFIX_PATH=/path/to/libtorch for a newer or CUDA LibTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# libtorch translation units need about 2 GiB each: don't start more jobs than memory allows.
mem_jobs=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) / 2000000 ))
(( mem_jobs >= 1 )) && (( mem_jobs < jobs )) && jobs=$mem_jobs
if [ ! -f build/build.ninja ] || [ $# -gt 0 ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
fi
cmake --build build -j "$jobs"
