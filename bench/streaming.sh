#!/usr/bin/env bash
# The Streaming DiLoCo benchmark: Brown, M = 4 worker processes, one model (bench/streaming.toml,
# 4 blocks) and the same tokens per worker (3,000 steps of 8 x 64 tokens) for every run:
#   DiLoCo H = 50  vs  Streaming DiLoCo P = 4 fragments, H = 50, tau = 1 and 5, fp32 and e3m0
# Prints one table (`loco report`): validation loss of the global parameters, bytes sent, peak
# bytes sent in one inner step, stall at the receive points and compute utilization.
#
#   bench/streaming.sh [OUT]       OUT defaults to runs/bench-streaming; finished runs are skipped
#   STEPS=600 bench/streaming.sh   a shorter version (not the reported figures)
# Takes about 50 minutes on 2 CPU cores. Results and commentary: docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/bench-streaming}
steps=${STEPS:-3000}
config=bench/streaming.toml
loco=build/loco
source bench/common.sh
prepare

run diloco-h50           --sync.algorithm=diloco
run streaming-t1-fp32    --sync.overlap_steps=1 --sync.exchange=fp32
run streaming-t5-fp32    --sync.overlap_steps=5 --sync.exchange=fp32
run streaming-t1-e3m0    --sync.overlap_steps=1 --sync.exchange=e3m0
run streaming-t5-e3m0    --sync.overlap_steps=5 --sync.exchange=e3m0

echo
"$loco" report "$out"/diloco-h50 "$out"/streaming-t1-fp32 "$out"/streaming-t5-fp32 "$out"/streaming-t1-e3m0 \
  "$out"/streaming-t5-e3m0 --html "$out/report.html" --svg "$out/charts"
