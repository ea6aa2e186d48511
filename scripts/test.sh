#!/usr/bin/env bash
# Sets up, builds and runs every test (CTest), then a short smoke of every fuzzer (20,000 inputs
# each, in build-fuzz/). Used by CI (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 600)
scripts/fuzz.sh 20000
