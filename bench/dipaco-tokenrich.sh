#!/usr/bin/env bash
# DiPaCo where it should win (issue #47; docs/benchmarks.md, "DiPaCo, token-rich"): paths trained on
# many tokens each, against dense DiLoCo of the path's size at equal compute and communication,
# each comparison with a paired 95% interval over the validation documents.
#   pretrain   a dense model of one path's size (configs/dipaco-tokenrich.toml), PRE steps on all
#              the data at a constant learning rate after its warm-up; every model below is forked
#              from it, and the router reads its features
#   dipaco     the paper's kind of layout, 8 paths (path-specific embeddings, first and last
#              blocks; blocks 1 and 2 among 2 and 4 modules), STEPS inner steps a path, H = 10
#   diloco-8   dense DiLoCo of the path's size, 8 workers x STEPS: DiPaCo's compute, and the same
#              bytes per worker per sync (a path-sized model every H)
#   diloco-4   the same with 4 workers, and
#   one        one path-sized model continued for STEPS steps on all the data: with diloco-8, the
#              saturation check (the gain from 4 to 8 workers against the gain from 1 to 4)
#   wide       a dense model of all the modules' size (WIDE wide, 4 blocks: 1.67M parameters against the
#              modules' 1.61M), pretrained PRE steps on its own like the path-sized one, then trained as
#              dense DiLoCo with 8 workers x STEPS: DiPaCo's tokens, 6.4x its compute and bytes (first
#              seed only)
#   dipaco-reroute  DiPaCo with the paper's discriminative routing phase: a tenth of the training
#              documents held out of training, and before phase REROUTE each path scores them, a
#              linear router learns which path models each best and re-shards the training and
#              validation documents (first seed only)
# dipaco and diloco-8 run once per seed in SEEDS (train.seed: the data order, the routing, the
# sampling of the i.i.d. shards). Each seed's DiPaCo run is scored with `loco eval --json`: every
# validation document, routed by that run's router (its routing tokens left out), scored whole by
# its path and by every dense model; paired bootstrap intervals over documents for every pair.
# The results are gathered into RESULTS (bench/results/dipaco-tokenrich.json).
#
#   bench/dipaco-tokenrich.sh [OUT]    OUT defaults to runs/dipaco-tokenrich; finished runs are skipped.
#   PRE=350 STEPS=1000 SEEDS="1 2" REROUTE=33 WIDE=176 bench/dipaco-tokenrich.sh    (the defaults)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/dipaco-tokenrich}
loco=${LOCO:-build/loco}
config=configs/dipaco-tokenrich.toml
pre=${PRE:-350}
steps=${STEPS:-1000}
seeds=${SEEDS:-1 2}
reroute=${REROUTE:-33}
wide=${WIDE:-176}
results=${RESULTS:-bench/results/dipaco-tokenrich.json}
[ -x "$loco" ] || scripts/build.sh
if [ ! -f data/domains-1k/manifest.json ]; then
  "$loco" prepare --corpus domains --label source --vocab-size 1024 --character-coverage 0.995 --out data/domains-1k
fi
mkdir -p "$out"

source bench/common.sh
dense=(--config "$config" --dipaco.levels=)
fork=(--train.init_from="$out/pretrain" --train.steps="$steps")

step pretrain "$loco" train "${dense[@]}" --run.dir="$out/pretrain" --train.steps="$pre" --cluster.workers=1 \
  --optim.min_lr_ratio=1 --optim.warmup_steps=50
for seed in $seeds; do
  step "dipaco-s$seed" "$loco" launch --config "$config" --run.dir="$out/dipaco-s$seed" "${fork[@]}" --train.seed="$seed"
  step "diloco-8-s$seed" "$loco" launch "${dense[@]}" --run.dir="$out/diloco-8-s$seed" "${fork[@]}" --train.seed="$seed" \
    --sync.algorithm=diloco --cluster.workers=8
done
first=${seeds%% *}
step diloco-4 "$loco" launch "${dense[@]}" --run.dir="$out/diloco-4" "${fork[@]}" --train.seed="$first" \
  --sync.algorithm=diloco --cluster.workers=4
step one "$loco" train "${dense[@]}" --run.dir="$out/one" "${fork[@]}" --train.seed="$first" --cluster.workers=1
wide_model=(--model.width="$wide" --model.heads=4)
step pretrain-wide "$loco" train "${dense[@]}" "${wide_model[@]}" --run.dir="$out/pretrain-wide" --train.steps="$pre" \
  --cluster.workers=1 --optim.min_lr_ratio=1 --optim.warmup_steps=50
step diloco-8-wide "$loco" launch "${dense[@]}" "${wide_model[@]}" --run.dir="$out/diloco-8-wide" \
  --train.init_from="$out/pretrain-wide" --train.steps="$steps" --train.seed="$first" --sync.algorithm=diloco --cluster.workers=8
step "dipaco-reroute-s$first" "$loco" launch --config "$config" --run.dir="$out/dipaco-reroute-s$first" "${fork[@]}" \
  --train.seed="$first" --dipaco.reroute_phase="$reroute" --dipaco.router_fraction=0.1

for seed in $seeds; do
  echo "bench: scoring seed $seed on every validation document"
  # The routing read the pretrained model's features: scoring must too (loco refuses other features).
  "$loco" eval --config "$config" --run.dir="$out/dipaco-s$seed" --train.init_from="$out/pretrain" \
    --against "$out/diloco-8-s$seed/workers/0" --against "$out/diloco-4/workers/0" --against "$out/one" \
    --against "$out/pretrain" --against "$out/diloco-8-wide/workers/0" --json "$out/eval-s$seed.json" | tee "$out/eval-s$seed.md"
done
echo "bench: scoring the re-routed run (its own router) on every validation document"
"$loco" eval --config "$config" --run.dir="$out/dipaco-reroute-s$first" --train.init_from="$out/pretrain" \
  --against "$out/diloco-8-s$first/workers/0" --against "$out/one" --against "$out/diloco-8-wide/workers/0" \
  --json "$out/eval-reroute-s$first.json" | tee "$out/eval-reroute-s$first.md"

python3 - "$out" "$results" "$pre" "$steps" "$reroute" "$wide" $seeds <<'PY'
import json, sys
out, results, pre, steps, reroute, wide, seeds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7:]
names = {"diloco-8": "diloco-8-s{}", "diloco-4": "diloco-4", "one": "one", "pretrain": "pretrain"}
def wall(name):
    for line in open(f"{out}/{name}.log"):
        if line.startswith("wall "):
            return float(line.split()[1])
    return None
doc = {"benchmark": "bench/dipaco-tokenrich.sh", "config": "configs/dipaco-tokenrich.toml",
       "pretrain_steps": pre, "steps_per_path": steps, "wide_width": wide, "seeds": {}}
for seed in seeds:
    e = json.load(open(f"{out}/eval-s{seed}.json"))
    e["wall_s"] = {"dipaco": wall(f"dipaco-s{seed}"), "diloco-8": wall(f"diloco-8-s{seed}")}
    doc["seeds"][seed] = e
doc["wall_s"] = {"pretrain": wall("pretrain"), "diloco-4": wall("diloco-4"), "one": wall("one"),
                 "pretrain-wide": wall("pretrain-wide"), "diloco-8-wide": wall("diloco-8-wide"),
                 "dipaco-reroute": wall(f"dipaco-reroute-s{seeds[0]}")}
doc["reroute"] = json.load(open(f"{out}/eval-reroute-s{seeds[0]}.json"))
doc["reroute"]["phase"] = reroute
json.dump(doc, open(results, "w"), indent=1)
print(f"bench: wrote {results}")
for seed, e in doc["seeds"].items():
    for c in e["comparisons"]:
        print(f"seed {seed}: {c['a']} - {c['b']}: {c['difference']:+.4f} [{c['low']:+.4f}, {c['high']:+.4f}]")
for c in doc["reroute"]["comparisons"]:
    print(f"re-routed: {c['a']} - {c['b']}: {c['difference']:+.4f} [{c['low']:+.4f}, {c['high']:+.4f}]")
PY
