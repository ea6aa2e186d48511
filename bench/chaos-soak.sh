#!/usr/bin/env bash
# The chaos soaks (issues #48 and #68; docs/failure-model.md, "The chaos soak"): the suite's
# ChaosSoak test (one elastic DiLoCo run of `loco coordinator` and 4 `loco worker`s, each on an
# emulated island, while faults drawn at random hit it: SIGKILL and SIGSTOP of workers and of the
# coordinator, a worker's link cut and restored, a slot's disk filled, replacements joining, checked
# against the same run without faults), run N times back to back, each with a new random seed. The
# suite runs only its committed seeds (tests/cli/soak_test.cpp, kSeeds); this is where new ones are
# drawn. A failed soak's seed belongs in kSeeds once its defect is fixed. Needs root (the islands'
# network namespaces, the slots' tmpfs disks).
#
# Each soak's JSON summary goes to OUT/soaks/SEED.json; a failed one's test output and fault log
# to OUT/failures/SEED.log, its run's metrics.jsonl and every process's log to OUT/failures/SEED/. After every soak, OUT.json sums them up: the seeds, the commit each ran
# on, faults of each kind, rounds, every failure with its seed and log, and how many soaks in a row
# passed at the end. An interrupted run continues where it stopped (OUT/soaks is kept). The run
# without faults, the soaks' reference loss, is deterministic: it runs once for this build and is
# kept in OUT/calm.json for the others.
#
#   N=100 bench/chaos-soak.sh          100 short soaks like the suite's (about 2 minutes each here)
#   N=1 STEPS=14000 GAP=8 MIN_FAULTS=50 MIN_S=1200 DEADLINE=5400 bench/chaos-soak.sh   one long soak on Brown
#   SEEDS="1653663434 3197102869" bench/chaos-soak.sh   these seeds instead of random ones
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench: the soak needs root (network namespaces, tmpfs disks): run it with sudo" >&2; exit 1; }
loco=${LOCO:-build/loco}
test_binary=build/tests/cli/test_chaos
[ -x "$test_binary" ] && [ -x "$loco" ] || scripts/build.sh
out=${OUT:-bench/results/chaos-soaks}
mkdir -p "$out/soaks" "$out/failures"
data=()
if [ -n "${DATA:-}" ]; then
  [ -f "$DATA/manifest.json" ] || "$loco" prepare --corpus brown --out "$DATA"
  data=(LOCO_SOAK_DATA="$DATA")
fi
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain -- src tests 2>/dev/null)" ] || commit="$commit+changes"
# The test's first committed seed is the one it runs; LOCO_SOAK_SEED replaces its seed.
filter=$("$test_binary" --gtest_list_tests --gtest_filter='Seeds/ChaosSoak.*' | awk '/^Seeds/ {s=$1} /^  / && s {print s $1; exit}')
[ -n "$filter" ] || { echo "bench: no ChaosSoak test in $test_binary" >&2; exit 1; }

summarize() {
  python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
soaks = []
for name in os.listdir(os.path.join(out, "soaks")):
    if name.endswith(".json"):
        with open(os.path.join(out, "soaks", name)) as f:
            soaks.append(json.load(f))
soaks.sort(key=lambda s: s["finished_at"])
faults, failures, streak = {}, [], 0
for s in soaks:
    for kind, n in s.get("faults", {}).items():
        faults[kind] = faults.get(kind, 0) + n
    if s["passed"]:
        streak += 1
    else:
        streak = 0
        failures.append({"seed": s["seed"], "commit": s["commit"], "log": s["log"], "said": s.get("said", "")})
summary = {
    "soaks": len(soaks), "passed": sum(s["passed"] for s in soaks), "failed": len(failures),
    "passed_in_a_row_at_the_end": streak,
    "commits": sorted({s["commit"] for s in soaks}),
    "faults": faults, "faults_total": sum(faults.values()),
    "rounds": sum(s.get("rounds", 0) for s in soaks),
    "rounds_retried": sum(s.get("rounds_retried", 0) for s in soaks),
    "workers_started": sum(s.get("workers_started", 0) for s in soaks),
    "coordinators_started": sum(s.get("coordinators_started", 0) for s in soaks),
    "largest_val_loss_gap": max((abs(s["chaos_val_loss"] - s["calm_val_loss"]) for s in soaks if s["passed"]), default=None),
    "failures": failures,
    "seeds": [s["seed"] for s in soaks],
}
with open(out + ".json", "w") as f:
    json.dump(summary, f, indent=1)
    f.write("\n")
print(f"bench: {summary['soaks']} soaks, {summary['failed']} failed, {streak} passed in a row at the end, "
      f"{summary['faults_total']} faults; wrote {out}.json")
EOF
}

read -r -a seeds <<< "${SEEDS:-}"
# N soaks in all: those an earlier, stopped run of this benchmark left in OUT/soaks count.
kept=$(find "$out/soaks" -name '*.json' ! -name '*.raw.json' | wc -l)
n=$(( ${#seeds[@]} > 0 ? ${#seeds[@]} : ${N:-100} - kept ))
(( ${#seeds[@]} > 0 )) || echo "bench: $kept soaks kept in $out/soaks; $(( n > 0 ? n : 0 )) to go"
done_here=0
while (( done_here < n )); do
  done_here=$((done_here + 1))
  if (( ${#seeds[@]} > 0 )); then seed=${seeds[$((done_here - 1))]}; else seed=$(( $(od -An -N4 -tu4 /dev/urandom) )); fi
  (( seed != 0 )) || { echo "bench: seed 0 skipped (it means: draw one)"; continue; }
  result="$out/soaks/$seed.json" raw="$out/soaks/$seed.raw.json" faults="$out/soaks/$seed.faults.log" log="$out/failures/$seed.log"
  [ -f "$result" ] && { echo "bench: seed $seed already soaked"; continue; }
  echo "bench: soak $done_here of $n, seed $seed"
  rm -f "$raw" "$faults"
  status=0
  env "${data[@]}" LOCO_SOAK_SEED="$seed" LOCO_SOAK_STEPS="${STEPS:-1600}" LOCO_SOAK_GAP_S="${GAP:-1}" \
    LOCO_SOAK_MIN_FAULTS="${MIN_FAULTS:-3}" LOCO_SOAK_MIN_S="${MIN_S:-0}" LOCO_SOAK_DEADLINE_S="${DEADLINE:-200}" \
    LOCO_SOAK_SUMMARY="$raw" LOCO_SOAK_LOG="$faults" LOCO_SOAK_KEEP="$out/failures/$seed" LOCO_SOAK_CALM="$out/calm.json" \
    timeout -k 30 $(( ${DEADLINE:-200} + 600 )) "$test_binary" --gtest_filter="$filter" > "$out/soaks/$seed.out" 2>&1 || status=$?
  # Killed past its time, the test left its processes: they would slow the next soak.
  (( status != 124 && status != 137 )) || pkill -KILL -f 'loco-test-Seeds.ChaosSoak' || true
  passed=false said=""
  if (( status == 0 )) && grep -q '^\[  PASSED  \] 1 test' "$out/soaks/$seed.out"; then
    passed=true
  else
    { cat "$out/soaks/$seed.out"; echo "--- the soak's faults"; cat "$faults" 2>/dev/null; } > "$log"
    said=$(grep -m1 -E 'Failure|error:|Expected' "$out/soaks/$seed.out" | cut -c1-300 || true)
    echo "bench: seed $seed FAILED (status $status), see $log"
  fi
  python3 - "$raw" "$result" "$seed" "$commit" "$passed" "$log" "$said" <<'EOF'
import json, sys, time
raw, result, seed, commit, passed, log, said = sys.argv[1:]
try:
    with open(raw) as f:
        s = json.load(f)
except (OSError, ValueError):
    s = {}
s.update({"seed": int(seed), "commit": commit, "passed": passed == "true", "finished_at": time.time()})
if passed != "true":
    s.update({"log": log, "said": said})
with open(result, "w") as f:
    json.dump(s, f, indent=1)
    f.write("\n")
EOF
  rm -f "$raw" "$faults" "$out/soaks/$seed.out"
  summarize
done
summarize
