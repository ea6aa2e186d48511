#!/usr/bin/env bash
# Configures (once) and builds loco into build/. Extra arguments go to CMake's configure step,
# e.g. scripts/build.sh -DCMAKE_PREFIX_PATH=/path/to/libtorch for a newer or CUDA LibTorch.
#
# The compiler is clang when it is installed (scripts/setup.sh installs it) and CXX does not name
# another: with libtorch's precompiled header, clang compiles loco's sources 2-3x faster than GCC
# (docs/benchmarks.md, "Build"). CXX=g++ scripts/build.sh builds with GCC.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${CXX:-}" ] && command -v clang++ >/dev/null; then
  export CC=clang CXX=clang++
fi
jobs=$(nproc)
# A libtorch translation unit needs up to 2 GiB: don't start more jobs than memory allows.
mem_jobs=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) / 2000000 ))
(( mem_jobs >= 1 )) && (( mem_jobs < jobs )) && jobs=$mem_jobs
# A build folder configured with another compiler is configured anew (CMake cannot switch in place).
if [ -f build/CMakeCache.txt ] && [ -n "${CXX:-}" ]; then
  cached=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' build/CMakeCache.txt)
  wanted=$(command -v "$CXX" || echo "$CXX")
  if [ "$(readlink -f "$cached")" != "$(readlink -f "$wanted")" ]; then
    echo "build: build/ was configured with $cached; configuring it anew with $wanted"
    rm -rf build/CMakeCache.txt build/CMakeFiles build/build.ninja
  fi
fi
if [ ! -f build/build.ninja ] || [ $# -gt 0 ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
fi
cmake --build build -j "$jobs"
