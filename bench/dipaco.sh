#!/usr/bin/env bash
# DiPaCo on Brown (configs/dipaco.toml: 2 levels x 2 modules, 4 paths of the main job's 4.2M-parameter
# GPT, 500 inner steps each, H = 10, 2 worker processes leasing the tasks) against the issue's
# baselines, every model scored on the same routed validation windows (routing tokens left out):
#   main       a dense model the size of one path, trained on all the data with DiLoCo: the main job
#              (configs/brown.toml, Streaming DiLoCo, 4 workers x 500 steps: the same tokens in all)
#   flat       a flat mixture of 4 independent paths (one level of 4 modules, path-specific embeddings)
#   ddp-all    a dense model the size of all the modules together (8 blocks, 7.3M), trained with DDP
#              (4 workers x 500 steps of batch 8: the same tokens)
# and DiPaCo with discriminative re-routing halfway (reroute: phases 0-24 on k-means shards, then a
# linear router fitted on which path models the 10% held-out router documents best).
#
#   bench/dipaco.sh [OUT]     OUT defaults to runs/dipaco-bench; finished runs are kept and skipped.
# About 40 minutes on 2 CPU cores. Results: docs/benchmarks.md ("DiPaCo").
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/dipaco-bench}
loco=${LOCO:-build/loco}
steps=500
config=configs/brown.toml
source bench/common.sh
prepare

# A DiPaCo run is finished when its launch wrote dipaco-eval.json.
dipaco() {
  local name=$1; shift
  if [ -f "$out/$name/dipaco-eval.json" ]; then echo "bench: $name already done"; return; fi
  rm -rf "${out:?}/$name"
  echo "bench: $name (DiPaCo $*)"
  /usr/bin/time -f "wall %e s" "$loco" launch --config configs/dipaco.toml --run.dir="$out/$name" "$@" > "$out/$name.log" 2>&1 \
    || { echo "bench: $name failed, see $out/$name.log"; tail -n 5 "$out/$name.log"; exit 1; }
  tail -n 2 "$out/$name.log"
}

dipaco dipaco
dipaco flat --dipaco.levels=4:4 --dipaco.embed=path
dipaco reroute --dipaco.reroute_phase=25
run main                                  # configs/brown.toml as it is: the main job
run ddp-all --sync.algorithm=ddp --model.layers=8

echo "bench: scoring on the routed validation windows"
"$loco" eval --config configs/dipaco.toml --run.dir="$out/dipaco" --eval.windows=256 \
  --against "$out/main/workers/0" --against "$out/ddp-all/workers/0" | tee "$out/dipaco-eval.md"
"$loco" eval --config configs/dipaco.toml --run.dir="$out/flat" --dipaco.levels=4:4 --dipaco.embed=path \
  --eval.windows=256 | tee "$out/flat-eval.md"
"$loco" eval --config configs/dipaco.toml --run.dir="$out/reroute" --dipaco.reroute_phase=25 --eval.windows=256 \
  --against "$out/main/workers/0" --against "$out/ddp-all/workers/0" | tee "$out/reroute-eval.md"
