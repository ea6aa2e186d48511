#!/usr/bin/env bash
# Asynchronous DiLoCo with one worker at half speed (docs/async.md): the slow-links benchmark's model
# and run (bench/streaming.toml, 300 steps, H = 50, fp32) at M = 4, each worker an island with 0.45 of
# a core (`--link cpu=0.45`, a CPU control group) and worker 3 with half that. Synchronous DiLoCo with
# four equal workers is the reference (its final loss, and each worker's steps per second for goodput);
# then synchronous DiLoCo with the slow worker (everyone waits for it), time-budgeted rounds (elastic,
# sync.round_seconds = the equal run's cycle), asynchronous DiLoCo (sync.async: delayed Nesterov,
# dynamic local updates, sync.async_grace 0.2) with equal workers and with the slow one, and with the
# slow one and no grace, and with equal workers and no grace. Only the final evaluation is made (an
# asynchronous worker's evaluation mid-run would hold up its share of the run's last steps).
# Needs root (CPU control groups). Results: bench/results/async.json (RESULTS=...).
#
#   sudo bench/async.sh [OUT]     OUT defaults to runs/bench-async; finished runs are kept and skipped
# Each run takes one to two minutes on 2 cores; the whole benchmark about 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/bench-async}
steps=${STEPS:-300}
config=bench/streaming.toml
loco=${LOCO:-build/loco}
cpu=${CPU:-0.45}
source bench/common.sh
prepare

slow_cpu=$(python3 -c "print($cpu / 2)")
base=(--cluster.workers=4 --sync.algorithm=diloco --sync.inner_steps=50 --sync.exchange=fp32 --eval.every=1000000
      --checkpoint.every=0 --link "cpu=$cpu")
slow=(--link "worker=3,cpu=$slow_cpu")
run sync-equal "${base[@]}"
# The equal run's cycle: H inner steps at its workers' mean compute time per step.
cycle=$(python3 - "$out/sync-equal/metrics.jsonl" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l]
print(round(sum(e["compute_s"] / e["steps"] for e in s) / len(s) * 50, 2))
PY
)
run sync-slow "${base[@]}" "${slow[@]}"
run budget-slow "${base[@]}" "${slow[@]}" --cluster.elastic=true --sync.round_seconds="$cycle"
run async-equal "${base[@]}" --sync.async=true
run async-slow "${base[@]}" "${slow[@]}" --sync.async=true
run async-slow-nograce "${base[@]}" "${slow[@]}" --sync.async=true --sync.async_grace=0
run async-equal-nograce "${base[@]}" --sync.async=true --sync.async_grace=0
# Asynchronous Streaming DiLoCo: P = 4 fragments (one block each), one exchanged at a time (tau = 0;
# alpha 0.5 as in bench/streaming.toml).
streaming=(--sync.async=true --sync.algorithm=streaming --sync.overlap_steps=0)
run sync-streaming-equal "${base[@]}" --sync.algorithm=streaming  # its synchronous reference (tau 1)
run async-streaming-equal "${base[@]}" "${streaming[@]}"
run async-streaming-slow "${base[@]}" "${slow[@]}" "${streaming[@]}"

# One row per run: the final validation loss against synchronous DiLoCo's, the tokens trained, the
# run's wall time, and the fast workers' goodput: the share of their time spent computing (their
# inner steps' compute time over the time from their start event to their last train event, the
# final evaluation left out) against the equal synchronous run's workers' mean; the slow worker's
# beside it. Their inner steps per second against the equal run's are kept too ("rate"), but they
# also move with how fast each run's steps ran on the shared machine (7-20% between runs here).
python3 - "$out" "${RESULTS:-bench/results/async.json}" "$steps" "$cpu" "$cycle" <<'PY'
import json, sys
out, results, steps, cpu, cycle = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
def events(run):
    return [json.loads(l) for l in open(f"{out}/{run}/metrics.jsonl")]
def per_worker(run):
    """(share of time computing, steps per second) of each worker, and its summary."""
    start, last, summary = {}, {}, {}
    for e in events(run):
        if e["event"] == "start":
            start[e["worker"]] = e["time"]
        elif e["event"] == "train" and e["step"] >= last.get(e["worker"], {"step": -1})["step"]:
            last[e["worker"]] = e
        elif e["event"] == "summary":
            summary[e["worker"]] = e
    out = {}
    for w in start:
        span = last[w]["time"] - start[w]
        out[w] = (summary[w]["compute_s"] / span, last[w]["step"] / span, summary[w])
    return out
reference = per_worker("sync-equal")
ref_share = sum(v[0] for v in reference.values()) / len(reference)
ref_rate = sum(v[1] for v in reference.values()) / len(reference)
ref_loss = reference[0][2]["val_loss"]
names = {"sync-equal": "DiLoCo, 4 equal workers", "sync-slow": "DiLoCo, worker 3 at half speed",
         "budget-slow": "time-budgeted rounds (elastic), worker 3 at half speed",
         "async-equal": "asynchronous DiLoCo, 4 equal workers", "async-slow": "asynchronous DiLoCo, worker 3 at half speed",
         "async-slow-nograce": "asynchronous, worker 3 at half speed, sync.async_grace = 0",
         "async-equal-nograce": "asynchronous, 4 equal workers, sync.async_grace = 0",
         "sync-streaming-equal": "Streaming DiLoCo (P = 4, synchronous), 4 equal workers",
         "async-streaming-equal": "asynchronous Streaming DiLoCo (P = 4), 4 equal workers",
         "async-streaming-slow": "asynchronous Streaming DiLoCo (P = 4), worker 3 at half speed"}
rows = []
for run, label in names.items():
    w = per_worker(run)
    loss = next(v[2]["val_loss"] for v in w.values() if v[2].get("val_loss") is not None)
    fast = [w[i][0] / ref_share for i in (0, 1, 2)]
    rows.append({"run": run, "method": label, "val_loss": loss, "vs_sync": loss - ref_loss,
                 "tokens": sum(v[2]["tokens"] for v in w.values()), "wall_s": max(v[2]["wall_s"] for v in w.values()),
                 "fast_goodput": min(fast), "slow_goodput": w[3][0] / ref_share,
                 "fast_rate": min(w[i][1] for i in (0, 1, 2)) / ref_rate, "slow_steps": w[3][2]["steps"],
                 "fast_stall_s": max(w[i][2]["stall_s"] for i in (0, 1, 2)),
                 "peak_step_bytes": max(v[2].get("peak_step_bytes", 0) for v in w.values())})
print("| run | final val loss | vs DiLoCo (equal) | tokens | wall time | fast workers' goodput (min) | slow worker's | fast workers' steps/s vs equal | slow worker's steps |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['method']} | {r['val_loss']:.3f} | {r['vs_sync']:+.3f} | {r['tokens'] / 1e3:.0f}k | {r['wall_s']:.0f} s | "
          f"{r['fast_goodput']:.3f} | {r['slow_goodput']:.3f} | {r['fast_rate']:.2f} | {r['slow_steps']} |")
json.dump({"workers": 4, "steps": steps, "cpu": cpu, "slow_cpu": cpu / 2, "round_seconds": cycle,
           "config": "bench/streaming.toml", "runs": rows}, open(results, "w"), indent=1)
PY
