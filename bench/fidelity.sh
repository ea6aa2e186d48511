#!/usr/bin/env bash
# The papers' claims, side by side, at equal tokens (bench/fidelity.toml: Brown + nlp-corpus read
# about 1.4 times, a 0.9M-parameter GPT, 5.4M tokens per run):
#   DiLoCo M = 4 vs DDP vs one worker alone (loss and bytes)     DiLoCo paper, Table 2
#   H = 10, 50, 250, 500                                        DiLoCo paper, Figure 3
#   non-i.i.d. (label shards) vs i.i.d.                         DiLoCo paper, Figure 4
#   50% of outer gradients dropped at random                     DiLoCo paper, §3.2 (+2.1%)
#   M = 1, 2, 4, 8 at equal tokens                               DiLoCo paper, Figure 5 / Scaling Laws
#   Streaming DiLoCo, e3m0, vs DiLoCo and DDP                    Streaming DiLoCo, Table 3
#
#   bench/fidelity.sh [OUT]        OUT defaults to runs/fidelity; finished runs are kept and skipped
# Takes about two hours on 2 CPU cores. Results and the papers' numbers: docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/fidelity}
steps=2640
config=bench/fidelity.toml
loco=${LOCO:-build/loco}
source bench/common.sh
[ -x "$loco" ] || scripts/build.sh
[ -f data/fidelity/manifest.json ] || "$loco" prepare --corpus brown+nlp-corpus --out data/fidelity
mkdir -p "$out"

# run_m NAME M [overrides...]: M workers at equal tokens (2640 x 4 / M steps each).
run_m() {
  local name=$1 m=$2; shift 2
  local saved=$steps
  steps=$((2640 * 4 / m))
  run "$name" --cluster.workers="$m" "$@"
  steps=$saved
}

run ddp             --sync.algorithm=ddp
run diloco-h10      --sync.inner_steps=10
run diloco-h50      --sync.inner_steps=50
run diloco-h250     --sync.inner_steps=250
run diloco-h500     --sync.inner_steps=500
run diloco-h50-label --sync.inner_steps=50 --data.shard=label
run diloco-h50-drop  --sync.inner_steps=50 --sync.drop_probability=0.5
run_m diloco-m1-h50 1 --sync.inner_steps=50
run_m diloco-m2-h50 2 --sync.inner_steps=50
run_m diloco-m8-h50 8 --sync.inner_steps=50
run streaming-e3m0-h50 --sync.algorithm=streaming --sync.fragments=2 --sync.exchange=e3m0 --sync.inner_steps=50
# One worker alone with the per-worker budget of M = 4 (a quarter of the tokens), as the paper's
# baseline; and one worker with all the tokens, DDP's batch, no communication: DDP's own ceiling.
if ! finished "$out/single"; then
  rm -rf "$out/single"
  echo "bench: single (one process, batch 4, $steps steps)"
  "$loco" train --config "$config" --run.dir="$out/single" --cluster.workers=1 --sync.algorithm=none \
    > "$out/single.log" 2>&1
  tail -n 1 "$out/single.log"
fi
echo
names=(ddp single diloco-h10 diloco-h50 diloco-h250 diloco-h500 diloco-h50-label diloco-h50-drop diloco-m1-h50
       diloco-m2-h50 diloco-m8-h50 streaming-e3m0-h50)
"$loco" report "${names[@]/#/$out/}" --html "$out/report.html" --svg "$out/charts"
