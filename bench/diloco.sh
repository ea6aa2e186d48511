#!/usr/bin/env bash
# The DiLoCo benchmark: Brown, M = 4 worker processes, the same model (bench/diloco.toml) and the
# same tokens per worker (7,500 steps of 8 x 64 tokens) for every algorithm:
#   ddp  vs  diloco H = 10, 50, 250  vs  local (no communication)
# then what may close DiLoCo's gap to DDP: a smaller outer lr, plain averaging, and a warm start
# from a pretrained checkpoint (train.init_from), as in the paper. Prints one table (`loco report`).
#
#   bench/diloco.sh [OUT]          OUT defaults to runs/bench-diloco; finished runs are kept and
#                                  skipped, so an interrupted benchmark continues where it stopped.
#   STEPS=1500 bench/diloco.sh     a shorter version (fewer rounds; not the reported figures)
# Takes about 2.5 hours on 2 CPU cores. Results and commentary: docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/bench-diloco}
steps=${STEPS:-7500}
config=bench/diloco.toml
loco=build/loco
source bench/common.sh
prepare

run ddp           --sync.algorithm=ddp
run diloco-h10    --sync.inner_steps=10
run diloco-h50    --sync.inner_steps=50
run diloco-h250   --sync.inner_steps=250
run local         --sync.algorithm=local
# What closes the gap at H = 250: a gentler outer step (the lr that Charles et al. found best for
# M = 4 is about 0.6), plain averaging (FedAvg), and a warm start.
run diloco-h250-lr0.4    --sync.inner_steps=250 --outer.lr=0.4
run diloco-h250-fedavg   --sync.inner_steps=250 --outer.optimizer=sgd
# Warm start: one process pretrains on the same data with the 4-worker batch (8 x 4 sequences) for
# a fifth of the budget; DDP and DiLoCo then both start from it.
warm="$out/pretrain"
if ! finished "$warm"; then
  rm -rf "$warm"
  echo "bench: pretrain (one process, batch 32, $((steps / 5)) steps)"
  "$loco" train --config bench/diloco.toml --run.dir="$warm" --sync.algorithm=none --cluster.workers=1 \
    --train.batch_size=32 --train.steps=$((steps / 5)) > "$out/pretrain.log" 2>&1
  tail -n 1 "$out/pretrain.log"
fi
run ddp-warm          --sync.algorithm=ddp --train.init_from="$warm" --optim.warmup_steps=0
run diloco-h250-warm  --sync.inner_steps=250 --train.init_from="$warm" --optim.warmup_steps=0
echo
"$loco" report "$out"/ddp "$out"/diloco-h10 "$out"/diloco-h50 "$out"/diloco-h250 "$out"/local \
  "$out"/diloco-h250-lr0.4 "$out"/diloco-h250-fedavg "$out"/pretrain "$out"/ddp-warm \
  "$out"/diloco-h250-warm --html "$out/report.html" --svg "$out/charts"
