#!/usr/bin/env bash
# Sets up, builds and runs every test (CTest), then a short smoke of every fuzzer (20,000 inputs
# each, in build-fuzz/). Used by CI (.ci/run). Both builds go through ccache when it is installed
# (scripts/setup.sh installs it): a second clone on the same machine rebuilds from the cache, and
# the cache's hits for this run are printed after the builds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
command -v ccache >/dev/null && ccache --zero-stats >/dev/null
scripts/build.sh
scripts/fuzz.sh --build
command -v ccache >/dev/null && ccache --show-stats
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 600)
scripts/fuzz.sh 20000
