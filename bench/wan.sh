#!/usr/bin/env bash
# Slow links, for real (docs/slow-links.md): M = 4 worker processes of the Streaming DiLoCo
# benchmark's model (bench/streaming.toml, 1.3M parameters) on emulated islands (`loco launch
# --link`, needs root) joined by 1 Gbit/s, 100 Mbit/s and 10 Mbit/s links with 50 ms one-way delay:
#   DDP  |  DiLoCo H = 50 (fp32, and e3m0)  |  Streaming P = 4, tau = 1, fp32  |
#   Streaming P = 4, tau = 5, e3m0  |  eager DiLoCo H = 50 (its default outer Nesterov lr 0.7 /
#   momentum 0, and outer SGD)
# every run the same tokens per worker. Each method also runs once over islands with the same CPU
# shares but no rate or delay (OUT/ideal-METHOD: the ideal network), and a run's goodput is that
# run's wall time over its own. Prints one `loco report` table per link: validation loss, bytes
# sent, stall, compute utilization (end to end), goodput and wall time; writes every report with its
# goodput to bench/results/wan-goodput.json (GOODPUT=FILE), and what `loco simulate` predicts for
# each run, with what it measured, to bench/results/wan.json (RESULTS=FILE: elsewhere).
#
#   sudo bench/wan.sh [OUT]              OUT defaults to runs/bench-wan; finished runs are skipped
#   sudo STEPS=100 bench/wan.sh          shorter (DDP over 10 Mbit/s costs ~6 s a step: 300 steps ~ 30 min)
#   sudo LINKS="100mbit" bench/wan.sh    some links only
#   sudo DELAY=25ms LINKS=100mbit RESULTS=bench/results/wan-25ms.json bench/wan.sh   another delay
#   sudo METHODS="diloco-h50 streaming-t5-e3m0" bench/wan.sh   some methods only
#   sudo CPU=0 bench/wan.sh               the workers share the machine's cores as they come (default:
#                                        0.35 cores each, a CPU control group per island, so that the
#                                        4 workers compute nearer one speed, as 4 machines would; on 2
#                                        cores they still differ: docs/slow-links.md, "CPU")
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/bench-wan}
steps=${STEPS:-300}
links=${LINKS:-"1gbit 100mbit 10mbit"}
delay=${DELAY:-50ms}
cpu=${CPU:-0.35}
config=bench/streaming.toml
results=${RESULTS:-bench/results/wan.json}
goodput=${GOODPUT:-bench/results/wan-goodput.json}
loco=${LOCO:-build/loco}  # LOCO=/path/to/a/copy keeps a rebuild from changing the binary mid-benchmark
source bench/common.sh
prepare

methods=${METHODS:-"ddp diloco-h50 diloco-h50-e3m0 streaming-t1-fp32 streaming-t5-e3m0 eager-diloco-h50 eager-sgd-diloco-h50"}
# One method's overrides, by name.
overrides() {
  case $1 in
    ddp)                  echo --sync.algorithm=ddp ;;
    diloco-h50)           echo --sync.algorithm=diloco ;;
    diloco-h50-e3m0)      echo --sync.algorithm=diloco --sync.exchange=e3m0 ;;
    streaming-t1-fp32)    echo --sync.algorithm=streaming --sync.overlap_steps=1 --sync.exchange=fp32 ;;
    streaming-t5-e3m0)    echo --sync.algorithm=streaming --sync.overlap_steps=5 --sync.exchange=e3m0 ;;
    # Eager with its defaults (outer Nesterov lr 0.7, momentum 0: bench/eager.sh), and with outer
    # SGD (FedAvg, lr 1, no momentum).
    eager-diloco-h50)     echo --sync.algorithm=diloco --sync.eager=true ;;
    eager-sgd-diloco-h50) echo --sync.algorithm=diloco --sync.eager=true --outer.optimizer=sgd ;;
    *) echo "bench/wan.sh: unknown method $1" >&2; exit 2 ;;
  esac
}

# The ideal network: the same islands and CPU shares, no rate or delay (with CPU=0, no islands).
ideal_link=()
[ "$cpu" = 0 ] || ideal_link=(--link "cpu=$cpu")
for name in $methods; do
  # shellcheck disable=SC2046  # the overrides are words
  run "ideal-$name" ${ideal_link[@]+"${ideal_link[@]}"} $(overrides "$name")
done
for rate in $links; do
  link="rate=$rate,delay=$delay"
  [ "$cpu" = 0 ] || link="$link,cpu=$cpu"
  for name in $methods; do
    # shellcheck disable=SC2046  # the overrides are words
    run "$rate-$name" --link "$link" $(overrides "$name")
  done
done

# What `loco simulate` predicts for each run, from its measured step time, next to what it measured:
# $results (tests/cli/simulate_test.cpp checks the predictions against bench/results/wan.json).
mkdir -p "$(dirname "$results")"
# Every finished run of OUT is predicted, also those of earlier calls with other LINKS or METHODS.
all_methods="ddp diloco-h50 diloco-h50-e3m0 streaming-t1-fp32 streaming-t5-e3m0 eager-diloco-h50 eager-sgd-diloco-h50"
all_links=$(echo 1gbit 100mbit 10mbit $links | tr ' ' '\n' | awk '!seen[$0]++')
{
  echo "["
  first=1
  for rate in $all_links; do
    for name in $all_methods; do
      finished "$out/$rate-$name" || continue
      [ $first = 1 ] || echo ","
      first=0
      "$loco" simulate --from-run "$out/$rate-$name" --link "rate=$rate,delay=$delay" --json
    done
  done
  echo "]"
} > "$results"

# Goodput: `loco report --ideal DIR` reads each run's reference as DIR/<the run's folder name>, so
# OUT/ideal-as/RATE-METHOD links to OUT/ideal-METHOD. Runs without a finished reference have none.
rm -rf "${out:?}/ideal-as" && mkdir -p "$out/ideal-as"
for rate in $all_links; do
  for name in $all_methods; do
    finished "$out/ideal-$name" && ln -s "../ideal-$name" "$out/ideal-as/$rate-$name"
  done
done
{
  echo "{\"workers\": 4, \"delay\": \"$delay\", \"cpu\": \"$cpu\", \"config\": \"$config\", \"runs\": ["
  first=1
  for rate in ideal $all_links; do
    for name in $all_methods; do
      run_dir="$out/$rate-$name"
      finished "$run_dir" || continue
      ideal=()
      [ "$rate" = ideal ] || [ ! -e "$out/ideal-as/$rate-$name" ] || ideal=(--ideal "$out/ideal-as")
      [ $first = 1 ] || echo ","
      first=0
      report=$("$loco" report "$run_dir" ${ideal[@]+"${ideal[@]}"} --json | tr -d '\n' | sed 's/^\[//; s/\]$//')
      echo "{\"link\": \"$rate\", \"report\": $report}"
    done
  done
  echo "]}"
} > "$goodput"

for rate in $all_links; do
  runs=()
  for name in $all_methods; do finished "$out/$rate-$name" && runs+=("$out/$rate-$name"); done
  [ ${#runs[@]} -gt 0 ] || continue
  echo
  echo "## $rate, $delay one-way (goodput against the same run over no rate or delay)"
  "$loco" report "${runs[@]}" --ideal "$out/ideal-as" --html "$out/$rate-report.html" --svg "$out/$rate-charts" ||
    "$loco" report "${runs[@]}" --html "$out/$rate-report.html" --svg "$out/$rate-charts"  # a reference missing
done
