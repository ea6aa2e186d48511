#!/usr/bin/env bash
# Slow links at model scale (docs/slow-links.md, "At model scale"): M = 8 islands (`loco launch
# --link`, needs root) of bench/wan-scale.toml's 105M-parameter GPT whose compute is emulated
# (train.emulated_step_s = 0.5 s, an H200's step on 262,144 tokens: the config says how) while
# the links, codecs, all-reduces and outer steps are real. Each method runs over no emulated link
# (the ideal reference, OUT/ideal/METHOD) and over each link at 50 ms one way (OUT/RATE/METHOD);
# its goodput on a link is the ideal run's wall time over the shaped run's (`loco report --ideal`).
#   ddp                 every step an fp32 all-reduce of the gradients (DDP_STEPS steps: 4)
#   diloco-h50          DiLoCo, H = 50, fp32 outer gradients (DILOCO_STEPS: 100, two syncs)
#   streaming-t5-e3m0   Streaming DiLoCo, P = 4, tau = 5, e3m0 (4-bit) (STREAMING_STEPS: 300)
#   streaming-t10-e3m0  the same with tau = 10 (not in the default METHODS: run with LINKS=100mbit)
#   streaming-t12-e3m0  the same with tau = 12, the most that P = 4 fragments of H = 50 allow without two
#                       in flight at once (not in the default METHODS: run with LINKS=50mbit)
#   streaming-t5-e3m0-median   the same with the coordinate-wise median of the outer gradients
#   streaming-t5-e3m0-trimmed  the same with their trimmed mean (sync.trim = 1 at each end): the robust means'
#                       costs on the wire (not in the default METHODS; docs/failure-model.md):
#   sudo WORKERS=4 LINKS=300mbit STREAMING_STEPS=100 RESULTS=bench/results/wan-scale-robust-m4.json \
#     METHODS="streaming-t5-e3m0 streaming-t5-e3m0-median streaming-t5-e3m0-trimmed" bench/wan-scale.sh runs/bench-wan-robust-m4
# First the relay alone: `loco link-check` with 8 and 16 flows at once at each rate (OUT/relay.txt).
# Writes every report, with its link and goodput, to bench/results/wan-scale-m8.json (RESULTS=FILE).
#
#   sudo bench/wan-scale.sh [OUT]                  OUT defaults to runs/bench-wan-scale; finished runs are skipped
#   sudo LINKS="100mbit" bench/wan-scale.sh        some links only (default: 1gbit 300mbit 100mbit)
#   sudo METHODS="streaming-t5-e3m0" bench/wan-scale.sh
#   sudo WORKERS=4 bench/wan-scale.sh runs/bench-wan-scale-m4     results in bench/results/wan-scale-m4.json
#   sudo CPU=0.2 bench/wan-scale.sh      each island held to 0.2 cores (a CPU control group), the ideal runs too
#                                        (runs in runs/bench-wan-scale-cpu, results in wan-scale-m8-cpu.json)
#                                        (over islands with no rate or delay), so that the emulator's own work
#                                        (the relay, tbf, the veths, TCP) has cores the workers do not take
#   sudo WORKERS=16 MODEL="--model.width=704" bench/wan-scale.sh runs/bench-wan-scale-m16   (51M parameters)
# Each shaped run's report carries `loco simulate --from-run RUN --fit IDEAL_RUN`'s prediction
# ("simulated"): the simulator with this machine's costs of a sync fitted on the ideal run.
# Memory: 8 workers of this model take about 18 GB with Streaming (each ~2.2 GB: the parameters, the
# global copy, the outer momentum and the fragments' send and receive buffers) and up to about 21 GB
# with DiLoCo at its syncs (a model-sized buffer and the all-reduce's pieces in flight); 16 do not
# fit in 24 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
links=${LINKS:-"1gbit 300mbit 100mbit"}
delay=${DELAY:-50ms}
workers=${WORKERS:-8}
cpu=${CPU:-0}  # > 0: each island (worker) held to this many cores, in the ideal runs too
ideal_link=() shaped_cpu="" suffix=""
if awk "BEGIN { exit !($cpu > 0) }"; then
  ideal_link=(--link "cpu=$cpu"); shaped_cpu=",cpu=$cpu"; suffix="-cpu"  # runs and results of their own
fi
out=${1:-runs/bench-wan-scale$suffix}
methods=${METHODS:-"streaming-t5-e3m0 diloco-h50 ddp"}
read -r -a model <<< "${MODEL:-}"  # overrides of the model's shape
config=bench/wan-scale.toml
results=${RESULTS:-bench/results/wan-scale-m$workers$suffix.json}
loco=${LOCO:-build/loco}
source bench/common.sh
prepare

# One method's steps and overrides, by name.
method_steps() {
  case $1 in
    ddp) echo "${DDP_STEPS:-4}" ;;
    diloco-h50) echo "${DILOCO_STEPS:-100}" ;;
    streaming-t5-e3m0*|streaming-t10-e3m0|streaming-t12-e3m0) echo "${STREAMING_STEPS:-300}" ;;
    *) echo "bench/wan-scale.sh: unknown method $1" >&2; exit 2 ;;
  esac
}
overrides() {
  case $1 in
    ddp) echo --sync.algorithm=ddp --optim.warmup_steps=1 --cluster.timeout_s=300 ;;
    diloco-h50) echo --sync.algorithm=diloco --sync.inner_steps=50 --sync.exchange=fp32 ;;
    streaming-t5-e3m0) echo --sync.algorithm=streaming --sync.inner_steps=50 --sync.fragments=4 --sync.overlap_steps=5 --sync.exchange=e3m0 ;;
    streaming-t5-e3m0-median) echo "$(overrides streaming-t5-e3m0) --sync.robust_mean=median" ;;
    streaming-t5-e3m0-trimmed) echo "$(overrides streaming-t5-e3m0) --sync.robust_mean=trimmed" ;;
    streaming-t10-e3m0) echo --sync.algorithm=streaming --sync.inner_steps=50 --sync.fragments=4 --sync.overlap_steps=10 --sync.exchange=e3m0 ;;
    streaming-t12-e3m0) echo --sync.algorithm=streaming --sync.inner_steps=50 --sync.fragments=4 --sync.overlap_steps=12 --sync.exchange=e3m0 ;;
  esac
}

if [ ! -f "$out/relay.txt" ]; then
  echo "bench: the relay alone (8 and 16 flows at once)"
  for rate in $links; do
    for flows in 8 16; do
      echo "== $flows flows at rate=$rate,delay=$delay"
      "$loco" link-check --link "rate=$rate,delay=$delay" --flows "$flows" --pings 5 | tail -n 2
    done
  done > "$out/relay.tmp" && mv "$out/relay.tmp" "$out/relay.txt"
fi
cat "$out/relay.txt"

mkdir -p "$out/ideal"
for rate in $links; do mkdir -p "$out/$rate"; done
for name in $methods; do
  steps=$(method_steps "$name")
  # shellcheck disable=SC2046  # the overrides are words
  run "ideal/$name" --cluster.workers="$workers" ${model[@]+"${model[@]}"} ${ideal_link[@]+"${ideal_link[@]}"} $(overrides "$name")
  for rate in $links; do
    # shellcheck disable=SC2046
    run "$rate/$name" --cluster.workers="$workers" ${model[@]+"${model[@]}"} --link "rate=$rate,delay=$delay$shaped_cpu" $(overrides "$name")
  done
done

# Every finished run, with its link and its goodput against the ideal run of the same method.
mkdir -p "$(dirname "$results")"
{
  echo "{\"workers\": $workers, \"delay\": \"$delay\", \"cpu\": \"$cpu\", \"config\": \"$config\", \"runs\": ["
  first=1
  for rate in $(echo ideal 1gbit 300mbit 100mbit 50mbit $links | tr ' ' '\n' | awk '!seen[$0]++'); do
    for name in streaming-t5-e3m0 streaming-t5-e3m0-median streaming-t5-e3m0-trimmed streaming-t10-e3m0 streaming-t12-e3m0 \
                diloco-h50 ddp; do
      [ -d "$out/$rate/$name" ] && finished "$out/$rate/$name" || continue
      [ $first = 1 ] || echo ","
      first=0
      ideal=()
      [ "$rate" = ideal ] || ideal=(--ideal "$out/ideal")
      simulated=null
      if [ "$rate" != ideal ] && finished "$out/ideal/$name"; then
        simulated=$("$loco" simulate --from-run "$out/$rate/$name" --link "rate=$rate,delay=$delay" --fit "$out/ideal/$name" --json)
      fi
      report=$("$loco" report "$out/$rate/$name" ${ideal[@]+"${ideal[@]}"} --json | tr -d '\n' | sed 's/^\[//; s/\]$//')
      echo "{\"link\": \"$rate\", \"report\": $report, \"simulated\": $simulated}"
    done
  done
  echo "]}"
} > "$results"

for rate in $links; do
  echo
  echo "## $rate, $delay one way, $workers islands (goodput against $out/ideal)"
  "$loco" report "$out/$rate"/*/ --ideal "$out/ideal"
done
echo
echo "## no emulated link (the ideal references)"
"$loco" report "$out/ideal"/*/
