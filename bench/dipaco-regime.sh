#!/usr/bin/env bash
# DiPaCo in the paper's regime (issue #34; docs/benchmarks.md, "DiPaCo in its regime"): many
# domains, one dense model pretrained first, and every model forked from it (train.init_from), so
# that all start from the same point and differ only in how they spend the same compute:
#   pretrain     a dense model of one path's size (configs/dipaco-domains.toml, 4 blocks of width
#                128), PRE steps on all the data at a constant learning rate after its warm-up
#                (the first part of one schedule, as the paper's pretraining is); the router reads
#                its features. Every fork then warms up over 10 steps only and decays to 0.1x over
#                its own steps. (Forking from a pretraining that had decayed its learning rate to
#                0.1x, and warming up again over 50 steps to the peak, undid the pretraining's last
#                gains: every path's loss rose by 0.3-0.4 nat over the first 50 steps.)
#   dipaco       DiPaCo 2x2 (4 paths) forked from it, STEPS inner steps per path, H = 10, routed by
#                balanced k-means of the pretrained features, early stopping among versions kept
#                every 5 phases (dipaco.keep_every, dipaco.early_stopping)
#   dipaco-paper the paper's kind of layout on 4 blocks: the first and last block path-specific,
#                blocks 1 and 2 chosen among 2 and 4 modules (8 paths), 8 x STEPS path steps
#   diloco       dense DiLoCo of the path's size, 4 workers x STEPS from the same start: DiPaCo 2x2's
#                compute, and the same bytes per worker per sync (a whole path-sized model every H)
#   diloco-8     the same with 8 workers: dipaco-paper's compute
#   one          the 1x baseline: one path-sized model continued for STEPS steps on all the data
#   wide         a dense model of all 2x2 modules' size (8 blocks), trained from scratch on PRE +
#                4 x STEPS steps: the tokens the others saw in all (twice the FLOPs per token)
# plus an outer-learning-rate sweep of DiPaCo 2x2 with and without the sqrt(n) rescale
# (dipaco.outer_rescale). Every model is scored on the same routed validation windows (the
# DiPaCo run's router; routing tokens left out), half of each path's validation documents, the
# other half having picked each path's early-stopped version.
#
#   bench/dipaco-regime.sh [OUT]    OUT defaults to runs/dipaco-regime; finished runs are skipped.
#   PRE=1000 STEPS=500 LRS="0.2 0.4 0.7" bench/dipaco-regime.sh   (the defaults: the table in docs/benchmarks.md)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/dipaco-regime}
loco=${LOCO:-build/loco}
config=configs/dipaco-domains.toml
pre=${PRE:-1000}
steps=${STEPS:-500}
lrs=${LRS:-0.2 0.4 0.7}
[ -x "$loco" ] || scripts/build.sh
if [ ! -f data/domains/manifest.json ]; then
  "$loco" prepare --corpus domains --label source --vocab-size 8192 --out data/domains
fi
mkdir -p "$out"

source bench/common.sh
dense=(--config "$config" --dipaco.levels= --dipaco.early_stopping=false)
fork=(--train.init_from="$out/pretrain" --train.steps="$steps" --optim.warmup_steps=10)

step pretrain "$loco" train "${dense[@]}" --run.dir="$out/pretrain" --train.steps="$pre" --cluster.workers=1 \
  --optim.min_lr_ratio=1
step dipaco "$loco" launch --config "$config" --run.dir="$out/dipaco" "${fork[@]}"
step diloco "$loco" launch "${dense[@]}" --run.dir="$out/diloco" "${fork[@]}" --sync.algorithm=diloco --cluster.workers=4
step one "$loco" train "${dense[@]}" --run.dir="$out/one" "${fork[@]}" --cluster.workers=1
step dipaco-paper "$loco" launch --config "$config" --run.dir="$out/dipaco-paper" "${fork[@]}" \
  --dipaco.levels=1:path,1:2,1:4,1:path
step diloco-8 "$loco" launch "${dense[@]}" --run.dir="$out/diloco-8" "${fork[@]}" --sync.algorithm=diloco --cluster.workers=8
step wide "$loco" train "${dense[@]}" --run.dir="$out/wide" --model.layers=8 --train.steps=$((pre + 4 * steps)) --cluster.workers=1
for lr in $lrs; do
  for rescale in false true; do
    step "dipaco-lr$lr-rescale-$rescale" "$loco" launch --config "$config" --run.dir="$out/dipaco-lr$lr-rescale-$rescale" \
      "${fork[@]}" --outer.lr="$lr" --dipaco.outer_rescale="$rescale"
  done
done

echo "bench: scoring on the routed validation windows"
against=(--against "$out/diloco/workers/0" --against "$out/one" --against "$out/wide" --against "$out/pretrain")
# The routing read the pretrained model's features: scoring must too (loco refuses other features).
"$loco" eval --config "$config" --run.dir="$out/dipaco" --train.init_from="$out/pretrain" --eval.windows=256 "${against[@]}" \
  | tee "$out/dipaco-eval.md"
"$loco" eval --config "$config" --run.dir="$out/dipaco-paper" --train.init_from="$out/pretrain" \
  --dipaco.levels=1:path,1:2,1:4,1:path --eval.windows=256 \
  --against "$out/diloco-8/workers/0" --against "$out/one" --against "$out/pretrain" | tee "$out/dipaco-paper-eval.md"
for lr in $lrs; do
  for rescale in false true; do
    run="dipaco-lr$lr-rescale-$rescale"
    "$loco" eval --config "$config" --run.dir="$out/$run" --train.init_from="$out/pretrain" --eval.windows=256 \
      > "$out/$run-eval.md"
    echo "bench: $run: $(python3 -c "import json; print(json.load(open('$out/$run/dipaco-eval.json'))['val_loss'])")"
  done
done
