#!/usr/bin/env bash
# The main job's sweep: what makes DiLoCo work on the main job's own budget (configs/brown.toml: 4
# workers, batch 8 x 128 tokens each, 500 inner steps), against one worker alone and DDP.
#
#   bench/sweep.sh [OUT] [NAME...]    OUT defaults to runs/sweep; with NAMEs, only those runs.
# Finished runs are kept and skipped, so an interrupted sweep continues where it stopped. Each run
# takes about 8 minutes on 2 CPU cores (the single worker about 2.5). Results: docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/sweep}
shift || true
only=("$@")
steps=500
config=configs/brown.toml
loco=${LOCO:-build/loco}
source bench/common.sh
prepare

wanted() { [ ${#only[@]} -eq 0 ] || [[ " ${only[*]} " == *" $1 "* ]]; }

# One worker alone, the same per-worker budget (batch 8, 500 steps): the bar DiLoCo must clear.
single() {
  local name=$1; shift
  wanted "$name" || return 0
  if finished "$out/$name"; then echo "bench: $name already done"; return; fi
  rm -rf "${out:?}/$name"
  echo "bench: $name (one process $*)"
  "$loco" train --config "$config" --run.dir="$out/$name" --cluster.workers=1 --sync.algorithm=none "$@" \
    > "$out/$name.log" 2>&1 || { echo "bench: $name failed, see $out/$name.log"; exit 1; }
  tail -n 1 "$out/$name.log"
}
# Every run starts from the settings the main job had before the sweep (DiLoCo, H = 50, Nesterov
# 0.7 / 0.9, fp32; Streaming's P = 4, tau = 1, alpha = 0.5) and names what it changes, so that the
# sweep means the same whatever configs/brown.toml now holds.
before=(--sync.algorithm=diloco --sync.inner_steps=50 --outer.optimizer=nesterov --outer.lr=0 --outer.momentum=-1
        --sync.exchange=fp32 --sync.fragments=4 --sync.overlap_steps=1 --sync.merge_alpha=0.5)
sweep() { wanted "$1" && { local name=$1; shift; run "$name" "${before[@]}" "$@"; } || true; }
e3m0=(--sync.algorithm=streaming --sync.exchange=e3m0)
diloco4=(--sync.algorithm=streaming --sync.fragments=1 --sync.overlap_steps=0 --sync.merge_alpha=0 --sync.exchange=e3m0)

single single
sweep ddp                      --sync.algorithm=ddp
sweep diloco-h50               # the main job before the sweep
sweep diloco-h50-fedavg        --outer.optimizer=sgd
sweep streaming-h50            --sync.algorithm=streaming
# 4-bit outer gradients buy about 7.7x fewer bytes per round: H = 10 still sends ~75x less than DDP.
sweep streaming-e3m0-h10       "${e3m0[@]}" --sync.inner_steps=10
sweep diloco-e3m0-h10          "${diloco4[@]}" --sync.inner_steps=10
sweep streaming-e3m0-h10-lr0.4 "${e3m0[@]}" --sync.inner_steps=10 --outer.lr=0.4
sweep streaming-e3m0-h8        "${e3m0[@]}" --sync.inner_steps=8
sweep streaming-e3m0-h10-lr0.2 "${e3m0[@]}" --sync.inner_steps=10 --outer.lr=0.2
sweep streaming-e3m0-h10-fedavg "${e3m0[@]}" --sync.inner_steps=10 --outer.optimizer=sgd   # the main job now
# The same bytes spent otherwise: 8-bit floats every 20 steps, or 4-bit integers every 10.
sweep streaming-fp8-h20-fedavg  --sync.algorithm=streaming --sync.exchange=fp8 --sync.inner_steps=20 --outer.optimizer=sgd
sweep streaming-int4-h10-fedavg --sync.algorithm=streaming --sync.exchange=int4 --sync.inner_steps=10 --outer.optimizer=sgd
# Plain averaging, extrapolated: the outer step goes past the workers' average.
sweep streaming-e3m0-h10-sgd1.5 "${e3m0[@]}" --sync.inner_steps=10 --outer.optimizer=sgd --outer.lr=1.5

# From the main job as it is now (configs/brown.toml: Streaming, e3m0, H = 10, FedAvg), one change
# each; the wire is the quantize-once scatter (the runs above used the re-encoding ring).
tune() { wanted "$1" && { local name=$1; shift; run "$name" "$@"; } || true; }
tune main                       # the main job itself, on the scatter
tune main-tau0                  --sync.overlap_steps=0
tune main-alpha0.25             --sync.merge_alpha=0.25
tune main-alpha0.75             --sync.merge_alpha=0.75
tune main-p2                    --sync.fragments=2
tune main-p1                    --sync.fragments=1
tune main-beta2-0.99            --optim.beta2=0.99
tune main-qknorm-zloss          --model.qk_norm=true --train.z_loss=1e-4
# Nesterov (η 0.4, the best Nesterov above) with and without its momentum ramped up over the
# first 10 outer steps of each fragment (of 50).
tune main-nesterov0.4           --outer.optimizer=nesterov --outer.lr=0.4
tune main-nesterov0.4-warmup10  --outer.optimizer=nesterov --outer.lr=0.4 --outer.momentum_warmup=10
# The same tokens in half the steps: batch 16 per worker, 250 steps, H = 5 (the same 50 syncs).
tune main-b16                   --train.batch_size=16 --train.steps=250 --sync.inner_steps=5
# The warmed-up Nesterov with the other changes that helped on their own: beta2 0.99, alpha 0.25,
# a longer warm-up, a larger eta.
warm=(--outer.optimizer=nesterov --outer.lr=0.4 --outer.momentum_warmup=10)
tune main-nesterov0.4-warmup10-beta2-0.99  "${warm[@]}" --optim.beta2=0.99
tune main-nesterov0.4-warmup10-alpha0.25   "${warm[@]}" --sync.merge_alpha=0.25
tune main-nesterov0.4-warmup20             "${warm[@]}" --outer.momentum_warmup=20
tune main-nesterov0.6-warmup10             "${warm[@]}" --outer.lr=0.6
# The best pair (warm-up Nesterov with alpha 0.25) with the third change that helped alone (tau 0),
# and with a longer warm-up or a larger eta.
best=("${warm[@]}" --sync.merge_alpha=0.25)
tune main-nesterov0.4-warmup10-alpha0.25-tau0   "${best[@]}" --sync.overlap_steps=0
tune main-nesterov0.4-warmup20-alpha0.25        "${best[@]}" --outer.momentum_warmup=20
tune main-nesterov0.6-warmup10-alpha0.25        "${best[@]}" --outer.lr=0.6
# The three together, and a yet longer warm-up.
tune main-nesterov0.4-warmup20-alpha0.25-tau0   "${best[@]}" --outer.momentum_warmup=20 --sync.overlap_steps=0
tune main-nesterov0.4-warmup30-alpha0.25        "${best[@]}" --outer.momentum_warmup=30

# The main job's baselines, kept for scripts/main.sh to compare against.
if finished "$out/single" && finished "$out/ddp"; then
  mkdir -p bench/results
  "$loco" report "$out/single" "$out/ddp" --json > bench/results/main-baselines.json.new
  mv bench/results/main-baselines.json.new bench/results/main-baselines.json
fi
echo
runs=()
for r in single ddp diloco-h50 diloco-h50-fedavg streaming-h50 streaming-e3m0-h10 diloco-e3m0-h10 \
         streaming-e3m0-h10-lr0.4 streaming-e3m0-h8 streaming-e3m0-h10-lr0.2 streaming-e3m0-h10-fedavg \
         streaming-fp8-h20-fedavg streaming-int4-h10-fedavg streaming-e3m0-h10-sgd1.5 \
         main main-tau0 main-alpha0.25 main-alpha0.75 main-p2 main-p1 main-beta2-0.99 main-qknorm-zloss main-b16 \
         main-nesterov0.4 main-nesterov0.4-warmup10 main-nesterov0.4-warmup10-beta2-0.99 \
         main-nesterov0.4-warmup10-alpha0.25 main-nesterov0.4-warmup20 main-nesterov0.6-warmup10 \
         main-nesterov0.4-warmup10-alpha0.25-tau0 main-nesterov0.4-warmup20-alpha0.25 main-nesterov0.6-warmup10-alpha0.25 \
         main-nesterov0.4-warmup20-alpha0.25-tau0 main-nesterov0.4-warmup30-alpha0.25; do
  [ -d "$out/$r" ] && runs+=("$out/$r")
done
"$loco" report "${runs[@]}" --html "$out/report.html" --svg "$out/charts"
