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
