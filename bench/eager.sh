#!/usr/bin/env bash
# Eager outer updates (sync.eager, Kale et al. 2025): which outer learning rate and momentum train.
# The slow-links benchmark's model and run (bench/streaming.toml, DiLoCo H = 50, 300 steps = 6
# rounds), at M = 2 and M = 4 workers, on loopback: quality does not depend on the link, only the
# wall time does (bench/wan.sh). For each M: synchronous DiLoCo (outer Nesterov 0.7 / 0.9, and
# outer SGD lr 1) and eager DiLoCo over a grid of outer Nesterov lr x momentum. Results:
# docs/slow-links.md, "Eager updates: the sweep".
#
#   bench/eager.sh [OUT]        OUT defaults to runs/bench-eager; finished runs are kept and skipped
#   STEPS=600 bench/eager.sh    longer runs (more rounds)
#   SEEDS="1234 2025" bench/eager.sh   eager's defaults against synchronous DiLoCo, per seed and H (below)
# Each run takes 30 s (M = 2) to 60 s (M = 4) on 2 cores; the whole sweep about 30 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/bench-eager}
steps=${STEPS:-300}
lrs=${LRS:-"0.3 0.5 0.7 1.0"}
momenta=${MOMENTA:-"0 0.5 0.8 0.9"}
workers=${WORKERS:-"2 4"}
config=bench/streaming.toml
loco=${LOCO:-build/loco}
source bench/common.sh
prepare

# SEEDS="1234 2025" bench/eager.sh: the check against synchronous DiLoCo instead of the grid: at
# M = 4, for each seed and each H in HS (default 50 25 10), eager's defaults (outer Nesterov η 0.7,
# μ 0) against synchronous DiLoCo's (0.7 / 0.9) on the same run; the table, and the results in
# bench/results/eager-m4.json (RESULTS=... elsewhere).
if [ -n "${SEEDS:-}" ]; then
  hs=${HS:-"50 25 10"}
  for seed in $SEEDS; do
    for h in $hs; do
      common=(--cluster.workers=4 --sync.algorithm=diloco --sync.inner_steps="$h" --train.seed="$seed")
      run "m4-h$h-s$seed-diloco" "${common[@]}"
      run "m4-h$h-s$seed-eager" "${common[@]}" --sync.eager=true
    done
  done
  for seed in $SEEDS; do for h in $hs; do for method in diloco eager; do
    "$loco" report "$out/m4-h$h-s$seed-$method" --json |
      python3 -c 'import json,sys; r=json.load(sys.stdin)[0]; print(json.dumps({"seed": int(sys.argv[1]), "inner_steps": int(sys.argv[2]), "method": sys.argv[3], "val_loss": r["val_loss"], "rounds": r["rounds"], "bytes_sent": r["bytes_sent"]}))' "$seed" "$h" "$method"
  done; done; done | python3 -c '
import json, sys
runs = [json.loads(line) for line in sys.stdin]
by = {(r["seed"], r["inner_steps"], r["method"]): r["val_loss"] for r in runs}
print("| H (rounds) | seed | synchronous DiLoCo | eager | eager - synchronous |")
print("|---|---|---|---|---|")
for (seed, h, method), loss in sorted(by.items(), key=lambda kv: (-kv[0][1], kv[0][0])):
    if method != "eager": continue
    sync = by[(seed, h, "diloco")]
    print(f"| {h} ({'"$steps"' // h}) | {seed} | {sync:.3f} | {loss:.3f} | {loss - sync:+.3f} |")
json.dump({"workers": 4, "steps": '"$steps"', "config": "bench/streaming.toml", "runs": runs}, open(sys.argv[1], "w"), indent=1)
' "${RESULTS:-bench/results/eager-m4.json}"
  exit 0
fi

for m in $workers; do
  common=(--cluster.workers="$m" --sync.algorithm=diloco --outer.optimizer=nesterov)
  run "m$m-diloco" "${common[@]}"
  run "m$m-diloco-sgd" "${common[@]}" --outer.optimizer=sgd
  for lr in $lrs; do
    for mu in $momenta; do
      run "m$m-eager-lr$lr-mu$mu" "${common[@]}" --sync.eager=true --outer.lr="$lr" --outer.momentum="$mu"
    done
  done
done

# One table per M: the final validation loss of each run, eager's grid against synchronous DiLoCo.
for m in $workers; do
  echo
  echo "## M = $m: validation loss after $steps steps"
  echo
  loss() {  # "-" for a run not in this sweep
    finished "$out/$1" || { echo "-"; return; }
    "$loco" report "$out/$1" --json | python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)[0]["val_loss"])'
  }
  echo "synchronous DiLoCo: Nesterov 0.7 / 0.9 $(loss "m$m-diloco"), outer SGD lr 1 $(loss "m$m-diloco-sgd")"
  echo
  printf "| eager: lr \\\\ momentum |"; for mu in $momenta; do printf " %s |" "$mu"; done; echo
  printf "|---|"; for mu in $momenta; do printf -- "---|"; done; echo
  for lr in $lrs; do
    printf "| %s |" "$lr"
    for mu in $momenta; do printf " %s |" "$(loss "m$m-eager-lr$lr-mu$mu")"; done
    echo
  done
done
