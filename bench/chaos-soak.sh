#!/usr/bin/env bash
# The chaos soak (issue #48; docs/failure-model.md, "The chaos soak"): the suite's
# ChaosSoak.RandomFaultsForMinutesLoseNothing run long on Brown: one elastic DiLoCo run of `loco
# coordinator` and 4 `loco worker`s, each on an emulated island, while faults drawn at random hit it
# (SIGKILL and SIGSTOP of workers and of the coordinator, a worker's link cut and restored, a slot's
# disk filled, replacements joining), checked against the same run without faults. Needs root (the
# islands' network namespaces, the slots' tmpfs disks). Writes RESULTS (a JSON summary) and LOG
# (every fault and every worker's exit, with times).
#
#   bench/chaos-soak.sh                    about 50 minutes on 2 cores: the run without faults, then the soak
#   STEPS=14000 GAP=8 MIN_FAULTS=50 MIN_S=1200 SEED=0 bench/chaos-soak.sh    (the defaults; SEED=0 draws one)
set -euo pipefail
cd "$(dirname "$0")/.."
loco=${LOCO:-build/loco}
test_binary=build/tests/cli/test_chaos
[ -x "$test_binary" ] && [ -x "$loco" ] || scripts/build.sh
[ -f data/brown/manifest.json ] || "$loco" prepare --corpus brown --out data/brown
results=${RESULTS:-bench/results/chaos-soak.json}
log=${LOG:-bench/results/chaos-soak.log}
LOCO_SOAK_DATA=data/brown LOCO_SOAK_STEPS=${STEPS:-14000} LOCO_SOAK_GAP_S=${GAP:-8} \
  LOCO_SOAK_MIN_FAULTS=${MIN_FAULTS:-50} LOCO_SOAK_MIN_S=${MIN_S:-1200} LOCO_SOAK_DEADLINE_S=${DEADLINE:-5400} \
  LOCO_SOAK_SEED=${SEED:-0} LOCO_SOAK_SUMMARY="$results" LOCO_SOAK_LOG="$log" \
  "$test_binary" --gtest_filter=ChaosSoak.RandomFaultsForMinutesLoseNothing
echo "bench: wrote $results and $log"
