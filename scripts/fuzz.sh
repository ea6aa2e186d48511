#!/usr/bin/env bash
# Runs the libFuzzer harnesses of fuzz/ (one per parser that reads bytes from outside loco), one
# after the other, each for RUNS inputs on a copy of its seeds in fuzz/corpus/ (the repository
# is never written to). Configures and builds build-fuzz/ (clang, ASan + UBSan) when needed.
#
#   scripts/fuzz.sh [RUNS] [FUZZER...]   RUNS inputs each (default 20000: CI's smoke); all fuzzers
#                                        unless some are named (protocol_fuzzer, config_fuzzer...)
#   scripts/fuzz.sh --seeds              regenerates the seeds that loco's own writers make
#   scripts/fuzz.sh --build              configures and builds the fuzzers, runs none
#
# Prints one line per fuzzer (inputs executed, seconds, inputs/s, result) and exits non-zero when
# any fuzzer found a crash, a sanitizer report, an escaped exception, a leak, a timeout (10 s per
# input) or memory over 2 GiB. The input that did it and the fuzzer's log are kept in
# $LOCO_FUZZ_ARTIFACTS (default build-fuzz/fuzz-artifacts); reproduce with
# build-fuzz/fuzz/FUZZER ARTIFACT.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build-fuzz
all=(protocol_fuzzer auth_fuzzer config_fuzzer safetensors_fuzzer shard_fuzzer jsonl_fuzzer coordinator_state_fuzzer
     tokenizer_json_fuzzer client_hello_fuzzer seal_fuzzer)

configure_and_build() {
  if ! command -v clang++ >/dev/null; then
    echo "[fuzz] needs clang and its libFuzzer: apt-get install clang libclang-rt-14-dev" >&2
    exit 2
  fi
  if [ ! -f "$build/build.ninja" ]; then
    CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DLOCO_FUZZ=ON -DLOCO_BUILD_TESTS=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  fi
  # As scripts/build.sh: a libtorch translation unit needs up to 2 GiB.
  local jobs mem_jobs
  jobs=$(nproc)
  mem_jobs=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) / 2000000 ))
  (( mem_jobs >= 1 )) && (( mem_jobs < jobs )) && jobs=$mem_jobs
  cmake --build "$build" -j "$jobs" --target "$@"
}

if [ "${1:-}" = "--build" ]; then
  configure_and_build fuzzers
  exit 0
fi
if [ "${1:-}" = "--seeds" ]; then
  configure_and_build make_seeds
  "$build/fuzz/make_seeds" fuzz/corpus
  exit 0
fi

runs=${1:-20000}
[[ "$runs" =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [RUNS] [FUZZER...] | --seeds | --build" >&2; exit 2; }
shift || true
fuzzers=("$@")
(( ${#fuzzers[@]} > 0 )) || fuzzers=("${all[@]}")

configure_and_build fuzzers

artifacts=${LOCO_FUZZ_ARTIFACTS:-$build/fuzz-artifacts}
mkdir -p "$artifacts"
work=$(mktemp -d "${TMPDIR:-/tmp}/loco-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Leaks are findings; UBSan already aborts (-fno-sanitize-recover), this adds its stack.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

failed=0
printf '%-26s %10s %8s %9s  %s\n' fuzzer inputs seconds inputs/s result
for fuzzer in "${fuzzers[@]}"; do
  case "$fuzzer" in
    protocol_fuzzer|safetensors_fuzzer|shard_fuzzer|jsonl_fuzzer|coordinator_state_fuzzer|tokenizer_json_fuzzer) dict=fuzz/json.dict ;;
    config_fuzzer) dict=fuzz/toml.dict ;;
    auth_fuzzer) dict="" ;;  # headers and a body: no grammar to teach it
    client_hello_fuzzer) dict="" ;;  # binary records
    seal_fuzzer) dict="" ;;  # a message's bytes
    *) echo "unknown fuzzer '$fuzzer' (one of: ${all[*]})" >&2; exit 2 ;;
  esac
  max_len=4096
  [ "$fuzzer" = coordinator_state_fuzzer ] && max_len=16384  # a saved table with a round under way
  [ "$fuzzer" = client_hello_fuzzer ] && max_len=70000  # past the 64 KiB bound
  corpus="$work/$fuzzer"
  mkdir -p "$corpus"
  cp fuzz/corpus/"$fuzzer"/* "$corpus"/
  log="$work/$fuzzer.log"
  start=$EPOCHREALTIME
  rc=0
  "$build/fuzz/$fuzzer" -runs="$runs" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 ${dict:+-dict="$dict"} \
    -artifact_prefix="$artifacts/$fuzzer-" -print_final_stats=1 "$corpus" >"$log" 2>&1 || rc=$?
  seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')
  execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
  rate=$(awk -v n="${execs:-0}" -v t="$seconds" 'BEGIN { printf "%.0f", n / t }')
  if (( rc == 0 )); then
    result=ok
  else
    failed=1
    result=$(grep -m1 -oE 'ERROR: libFuzzer: [a-z-]+|==loco-fuzz== finding: .{0,100}|runtime error: .{0,100}|ERROR: AddressSanitizer: [a-z-]+' "$log" || echo "exit $rc")
    cp "$log" "$artifacts/$fuzzer.log"
    result="FAILED: $result (log and input in $artifacts)"
  fi
  printf '%-26s %10s %8.1f %9s  %s\n' "$fuzzer" "${execs:-?}" "$seconds" "${rate:-?}" "$result"
done
exit $failed
