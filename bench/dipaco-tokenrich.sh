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
#   dipaco-shared   the same layout with one embedding, head and final norm shared by every path
#              (dipaco.embed = "shared"): fewer parameters of a path's own, each read by every
#              path's tokens (first seed only)
# dipaco and diloco-8 run once per seed in SEEDS (train.seed: the data order, the routing, the
# sampling of the i.i.d. shards). Each seed's DiPaCo run is scored with `loco eval --json`: every
# validation document, routed by that run's router (its routing tokens left out), scored whole by
# its path and by every dense model; paired bootstrap intervals over documents for every pair.
# The results are gathered into RESULTS (bench/results/dipaco-tokenrich.json).
#
#   bench/dipaco-tokenrich.sh [OUT]    OUT defaults to runs/dipaco-tokenrich; finished runs are skipped.
#   PRE=350 STEPS=1000 SEEDS="1 2" REROUTE=33 WIDE=176 bench/dipaco-tokenrich.sh    (the defaults)
#   PARTS="shared" SEEDS=1 bench/dipaco-tokenrich.sh    some parts only (of: seeds saturation wide
#              reroute shared; the default is all): the runs they compare against are run too, and
#              the results file keeps what an earlier call with the same PRE and STEPS wrote for the rest
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
parts=${PARTS:-seeds saturation wide reroute shared}
part() { [[ " $parts " == *" $1 "* ]]; }
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
first=${seeds%% *}
diloco8() {
  step "diloco-8-s$1" "$loco" launch "${dense[@]}" --run.dir="$out/diloco-8-s$1" "${fork[@]}" --train.seed="$1" \
    --sync.algorithm=diloco --cluster.workers=8
}
baseline_one() {
  step one "$loco" train "${dense[@]}" --run.dir="$out/one" "${fork[@]}" --train.seed="$first" --cluster.workers=1
}
if part seeds; then
  for seed in $seeds; do
    step "dipaco-s$seed" "$loco" launch --config "$config" --run.dir="$out/dipaco-s$seed" "${fork[@]}" --train.seed="$seed"
    diloco8 "$seed"
  done
fi
if part saturation; then
  step diloco-4 "$loco" launch "${dense[@]}" --run.dir="$out/diloco-4" "${fork[@]}" --train.seed="$first" \
    --sync.algorithm=diloco --cluster.workers=4
  baseline_one
fi
wide_model=(--model.width="$wide" --model.heads=4)
if part wide; then
  step pretrain-wide "$loco" train "${dense[@]}" "${wide_model[@]}" --run.dir="$out/pretrain-wide" --train.steps="$pre" \
    --cluster.workers=1 --optim.min_lr_ratio=1 --optim.warmup_steps=50
  step diloco-8-wide "$loco" launch "${dense[@]}" "${wide_model[@]}" --run.dir="$out/diloco-8-wide" \
    --train.init_from="$out/pretrain-wide" --train.steps="$steps" --train.seed="$first" --sync.algorithm=diloco --cluster.workers=8
fi
if part reroute; then
  diloco8 "$first"
  baseline_one
  step "dipaco-reroute-s$first" "$loco" launch --config "$config" --run.dir="$out/dipaco-reroute-s$first" "${fork[@]}" \
    --train.seed="$first" --dipaco.reroute_phase="$reroute" --dipaco.router_fraction=0.1
fi
if part shared; then
  diloco8 "$first"
  baseline_one
  step "dipaco-shared-s$first" "$loco" launch --config "$config" --run.dir="$out/dipaco-shared-s$first" "${fork[@]}" \
    --train.seed="$first" --dipaco.embed=shared
fi

# score RUN SEED NAME: every validation document of a DiPaCo run (its own config and router) scored by
# its paths and by every dense model of this OUT that has finished, into OUT/eval-NAME.json. The
# routing read the pretrained model's features: scoring must too (loco refuses other features).
score() {
  local against=() model
  for model in "diloco-8-s$2" diloco-4 one pretrain diloco-8-wide; do
    [ -f "$out/$model.done" ] || continue
    if [ -d "$out/$model/workers/0" ]; then against+=(--against "$out/$model/workers/0"); else against+=(--against "$out/$model"); fi
  done
  echo "bench: scoring $1 on every validation document"
  "$loco" eval --config "$out/$1/config.toml" --run.dir="$out/$1" --train.init_from="$out/pretrain" "${against[@]}" \
    --json "$out/eval-$3.json" | tee "$out/eval-$3.md"
}
if part seeds; then for seed in $seeds; do score "dipaco-s$seed" "$seed" "s$seed"; done; fi
part reroute && score "dipaco-reroute-s$first" "$first" "reroute-s$first"
part shared && score "dipaco-shared-s$first" "$first" "shared-s$first"

python3 - "$out" "$results" "$pre" "$steps" "$reroute" "$wide" $seeds <<'PY'
import json, os, random, sys
out, results, pre, steps, reroute, wide, seeds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7:]
first = seeds[0]
def wall(name):
    if not os.path.exists(f"{out}/{name}.log"):
        return None
    for line in open(f"{out}/{name}.log"):
        if line.startswith("wall "):
            return float(line.split()[1])
    return None
def evaluation(name):
    path = f"{out}/eval-{name}.json"
    return json.load(open(path)) if os.path.exists(path) else None
doc = {"benchmark": "bench/dipaco-tokenrich.sh", "config": "configs/dipaco-tokenrich.toml",
       "pretrain_steps": pre, "steps_per_path": steps, "wide_width": wide, "seeds": {}, "wall_s": {}}
# What an earlier call with the same settings wrote for the parts this call did not run is kept.
if os.path.exists(results):
    earlier = json.load(open(results))
    if (earlier.get("pretrain_steps"), earlier.get("steps_per_path"), earlier.get("wide_width")) == (pre, steps, wide):
        doc.update(earlier)
for seed in seeds:
    e = evaluation(f"s{seed}")
    if e:
        e["wall_s"] = {"dipaco": wall(f"dipaco-s{seed}"), "diloco-8": wall(f"diloco-8-s{seed}")}
        doc["seeds"][seed] = e
for name in ["pretrain", "diloco-4", "one", "pretrain-wide", "diloco-8-wide"]:
    doc["wall_s"][name] = wall(name) or doc["wall_s"].get(name)
e = evaluation(f"reroute-s{first}")
if e:
    e["phase"] = reroute
    doc["reroute"] = e
    doc["wall_s"]["dipaco-reroute"] = wall(f"dipaco-reroute-s{first}")

def paired_bootstrap(a, b, tokens, resamples=2000, seed=1):
    """DiPaCo a - DiPaCo b per token, over documents resampled with replacement (as loco eval's)."""
    n, draw, differences = len(tokens), random.Random(seed), []
    for _ in range(resamples):
        picked = [draw.randrange(n) for _ in range(n)]
        differences.append(sum(a[d] - b[d] for d in picked) / max(1, sum(tokens[d] for d in picked)))
    differences.sort()
    def percentile(q):
        at = q * (resamples - 1)
        below = int(at)
        above = min(below + 1, resamples - 1)
        return differences[below] + (at - below) * (differences[above] - differences[below])
    return {"difference": (sum(a) - sum(b)) / sum(tokens), "low": percentile(0.025), "high": percentile(0.975),
            "documents": n, "resamples": resamples}

e = evaluation(f"shared-s{first}")
if e and first not in doc["seeds"]:
    sys.exit(f"bench: no scores of seed {first}'s DiPaCo run (PARTS=seeds) to compare the shared-embedding run with")
if e:
    e["wall_s"] = wall(f"dipaco-shared-s{first}")
    # Against the path-specific embeddings' run of the same seed: the same router (k-means of the
    # pretrained model's features), so the same documents on the same paths.
    paths = {d["document"]: d for d in doc["seeds"][first]["documents"]}
    shared = e["documents"]
    if sorted(paths) != sorted(d["document"] for d in shared) or any(paths[d["document"]]["path"] != d["path"] for d in shared):
        sys.exit("bench: the shared-embedding run routed the validation documents differently; not compared")
    e["against_path_embeddings"] = paired_bootstrap([d["loss_sums"][0] for d in shared],
                                                    [paths[d["document"]]["loss_sums"][0] for d in shared],
                                                    [d["tokens"] for d in shared])
    doc["shared_embedding"] = e
json.dump(doc, open(results, "w"), indent=1)
print(f"bench: wrote {results}")
for seed, e in doc["seeds"].items():
    for c in e["comparisons"]:
        print(f"seed {seed}: {c['a']} - {c['b']}: {c['difference']:+.4f} [{c['low']:+.4f}, {c['high']:+.4f}]")
for name in ["reroute", "shared_embedding"]:
    for c in doc.get(name, {}).get("comparisons", []):
        print(f"{name}: {c['a']} - {c['b']}: {c['difference']:+.4f} [{c['low']:+.4f}, {c['high']:+.4f}]")
if "shared_embedding" in doc:
    c = doc["shared_embedding"]["against_path_embeddings"]
    print(f"shared_embedding: dipaco - dipaco with path embeddings: {c['difference']:+.4f} [{c['low']:+.4f}, {c['high']:+.4f}]")
PY
