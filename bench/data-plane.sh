#!/usr/bin/env bash
# What sealing the data plane costs a sync (docs/benchmarks.md, "The sealed data plane"): M = 4
# islands (`loco launch --link`, needs root) of bench/wan-scale.toml's 105M-parameter GPT, compute
# emulated (0.5 s a step), Streaming DiLoCo with e3m0 (P = 4, tau = 5) over RATE and 50 ms one way,
# each island held to CPU cores; one run per data plane (open, authenticated, encrypted), the same in
# all else. Prints each one's median fragment sync (from the sync events of every worker) and its
# cost against open's, and writes them to bench/results/data-plane.json (RESULTS=FILE).
#
#   sudo bench/data-plane.sh [OUT]           OUT defaults to runs/bench-data-plane; finished runs are skipped
#   sudo RATE=300mbit CPU=0.45 STEPS=150 WORKERS=4 bench/data-plane.sh
#
# About 3 minutes a run on the 2-core machine (150 steps), 10 in all.
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${RATE:-1gbit}
delay=${DELAY:-50ms}
cpu=${CPU:-0.45}
workers=${WORKERS:-4}
steps=${STEPS:-150}
out=${1:-runs/bench-data-plane}
config=bench/wan-scale.toml
results=${RESULTS:-bench/results/data-plane.json}
loco=${LOCO:-build/loco}
source bench/common.sh
prepare

for plane in open authenticated encrypted; do
  run "$plane" --cluster.workers="$workers" --cluster.data_plane="$plane" --link "rate=$rate,delay=$delay,cpu=$cpu" \
    --sync.algorithm=streaming --sync.inner_steps=50 --sync.fragments=4 --sync.overlap_steps=5 --sync.exchange=e3m0
done

mkdir -p "$(dirname "$results")"
python3 - "$out" "$rate" "$delay" "$cpu" "$workers" "$steps" > "$results.tmp" <<'PY'
import json, statistics, sys
out, rate, delay, cpu, workers, steps = sys.argv[1:]
runs, base = [], None
for plane in ["open", "authenticated", "encrypted"]:
    syncs = []
    with open(f"{out}/{plane}/metrics.jsonl") as f:
        for line in f:
            e = json.loads(line)
            if e.get("event") == "sync":
                syncs.append(e)
    seconds = statistics.median(e["seconds"] for e in syncs)
    sent = statistics.median(e["bytes_sent"] for e in syncs)
    base = seconds if base is None else base
    runs.append({"data_plane": plane, "syncs": len(syncs), "median_sync_s": seconds, "median_sent_bytes": sent,
                 "cost_vs_open": seconds / base - 1})
print(json.dumps({"workers": int(workers), "rate": rate, "delay": delay, "cpu": cpu, "steps": int(steps),
                  "method": "streaming P=4 tau=5 e3m0", "config": "bench/wan-scale.toml", "runs": runs}, indent=1))
PY
mv "$results.tmp" "$results"
python3 - "$results" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("| data plane | syncs | median sync | sent a sync | vs open |  (%d islands, %s, %s)" % (r["workers"], r["rate"], r["delay"]))
print("|---|---|---|---|---|")
for x in r["runs"]:
    print("| %s | %d | %.3f s | %.2f MB | %+.1f%% |" % (x["data_plane"], x["syncs"], x["median_sync_s"],
                                                 x["median_sent_bytes"] / 1e6, 100 * x["cost_vs_open"]))
PY
