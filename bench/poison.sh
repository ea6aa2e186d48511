#!/usr/bin/env bash
# A worker that sends harm, against screening (docs/failure-model.md, "A worker that sends harm"):
# the slow-links benchmark's model and run (bench/streaming.toml, 300 steps) at M = 4 on loopback,
# worker 3 poisoned with sync.poison: its outer gradient times 100 at every sync, or one value of it
# NaN at its second sync. Each poisoned run without screening (the harm), with sync.reject_ratio = 10,
# and with a robust mean, against the clean run; DiLoCo (H = 50, fp32) and Streaming DiLoCo (P = 4,
# tau = 1, e3m0). Table and results: bench/results/poison.json (RESULTS=... elsewhere).
#
#   bench/poison.sh [OUT]       OUT defaults to runs/bench-poison; finished runs are kept and skipped
# Each run takes about a minute on 2 cores; the whole benchmark about 15 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/bench-poison}
steps=${STEPS:-300}
config=bench/streaming.toml
loco=${LOCO:-build/loco}
source bench/common.sh
prepare

# A run that may fail (the harm can be a run that stops): its exit status is kept in OUT/NAME.status.
run_or_fail() {
  local name=$1; shift
  if [ -f "$out/$name.status" ]; then echo "bench: $name already done"; return; fi
  rm -rf "${out:?}/$name"
  echo "bench: $name ($*)"
  local status=0
  "$loco" launch --config "$config" --run.dir="$out/$name" --train.steps="$steps" "$@" > "$out/$name.log" 2>&1 || status=$?
  echo "$status" > "$out/$name.status"
  tail -n 1 "$out/$name.log"
}

diloco=(--cluster.workers=4 --sync.algorithm=diloco --sync.inner_steps=50 --sync.exchange=fp32)
streaming=(--cluster.workers=4 --sync.algorithm=streaming --sync.exchange=e3m0 --sync.overlap_steps=1)
for method in diloco streaming; do
  if [ "$method" = diloco ]; then args=("${diloco[@]}"); else args=("${streaming[@]}"); fi
  run_or_fail "$method-clean" "${args[@]}"
  run_or_fail "$method-x100" "${args[@]}" --sync.poison=3:x100
  run_or_fail "$method-x100-reject" "${args[@]}" --sync.poison=3:x100 --sync.reject_ratio=10
  run_or_fail "$method-x100-median" "${args[@]}" --sync.poison=3:x100 --sync.robust_mean=median
  run_or_fail "$method-x100-trimmed" "${args[@]}" --sync.poison=3:x100 --sync.robust_mean=trimmed
  run_or_fail "$method-nan-kept" "${args[@]}" --sync.poison=3:nan@2 --sync.reject_not_finite=false
  run_or_fail "$method-nan" "${args[@]}" --sync.poison=3:nan@2
done

# One row per run: its final validation loss (or why it stopped), its distance from the clean run,
# and the outer gradients screening left out (worker 0's sync events).
python3 - "$out" "$loco" "${RESULTS:-bench/results/poison.json}" "$steps" <<'EOF'
import json, os, subprocess, sys
out, loco, results, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
screening = {"": "none", "reject": "sync.reject_ratio = 10", "median": "sync.robust_mean = median",
             "trimmed": "sync.robust_mean = trimmed (trim 1)", "kept": "none (sync.reject_not_finite = false)"}
runs = []
for method in ["diloco", "streaming"]:
    for name in ["clean", "x100", "x100-reject", "x100-median", "x100-trimmed", "nan-kept", "nan"]:
        run = f"{method}-{name}"
        status = int(open(f"{out}/{run}.status").read())
        row = {"run": run, "method": method, "poison": name.split("-")[0], "status": status}
        row["screening"] = screening["kept" if name == "nan-kept" else (name.split("-")[1] if "-" in name else "")]
        if name == "nan":
            row["screening"] = "default (not finite left out)"
        if status == 0:
            report = json.loads(subprocess.run([loco, "report", f"{out}/{run}", "--json"], capture_output=True, text=True, check=True).stdout)[0]
            row["val_loss"] = report["val_loss"]
        else:
            lines = [l for l in open(f"{out}/{run}.log") if "error" in l.lower()]
            row["stopped"] = lines[-1].strip()[:200] if lines else f"exit status {status}"
        rejected = 0
        metrics = f"{out}/{run}/metrics.jsonl"
        if os.path.exists(metrics):
            for line in open(metrics):
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("event") == "sync" and e.get("worker") == 0:
                    rejected += e.get("rejected", 0)
        row["rejected"] = rejected
        runs.append(row)
clean = {r["method"]: r["val_loss"] for r in runs if r["poison"] == "clean"}
print("| method | poison (worker 3) | screening | final val loss | vs clean | left out |")
print("|---|---|---|---|---|---|")
for r in runs:
    loss = f"{r['val_loss']:.3f}" if "val_loss" in r else "stopped"
    delta = f"{r['val_loss'] - clean[r['method']]:+.3f}" if "val_loss" in r else r.get("stopped", "")
    poison = {"clean": "none", "x100": "x100 every sync", "nan": "NaN at its 2nd sync"}[r["poison"]]
    print(f"| {r['method']} | {poison} | {r['screening']} | {loss} | {delta} | {r['rejected']} |")
json.dump({"workers": 4, "steps": steps, "config": "bench/streaming.toml", "runs": runs}, open(results, "w"), indent=1)
EOF
