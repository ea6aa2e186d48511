#!/usr/bin/env bash
# The build, measured as a contributor and CI meet it (docs/benchmarks.md, "Build"): in a fresh clone
# of HEAD with an empty ccache, a cold build of everything the README's test command builds (build/
# and the fuzzers' build-fuzz/); how many translation units an edit of comm/group.h rebuilds, and how
# long that takes without ccache; then a second clone at another path, built with the cache the
# first one filled, and its ccache hit rate. About 15 minutes on 2 cores; run scripts/setup.sh first.
#
#   bench/build.sh [WORK]    WORK: a folder for the clones and the cache (default: a temporary one,
#                            removed at the end)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-}
if [ -z "$work" ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/loco-build-bench.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
export CCACHE_DIR="$work/ccache"  # empty: the first build is cold
export CCACHE_MAXSIZE=20G
seconds() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }'; }
stat() { ccache --print-stats | awk -v k="$1" '$1 == k { print $2 }'; }
hits() { echo $(( $(stat direct_cache_hit) + $(stat preprocessed_cache_hit) )); }
units() { grep -c 'Building CXX' "$@" || true; }  # translation units a build log shows compiled

build_all() {  # in a clone: both build folders, quietly; prints seconds
  local start=$EPOCHREALTIME
  (cd "$1" && scripts/build.sh > "$work/$(basename "$1").build.log" 2>&1 && scripts/fuzz.sh --build >> "$work/$(basename "$1").build.log" 2>&1)
  seconds "$start"
}

rm -rf "$work/first" "$work/second" "$CCACHE_DIR"
git clone -q "$repo" "$work/first"
ccache -z > /dev/null
cold=$(build_all "$work/first")
total=$(units "$work/first.build.log")
main_units=$(ninja -C "$work/first/build" -t commands | grep -c ' -c ' || true)
cold_misses=$(stat cache_miss)

# An edit of comm/group.h: the rebuild of build/ without ccache, and how many units it compiled.
echo "// an edit" >> "$work/first/src/loco/comm/group.h"
start=$EPOCHREALTIME
CCACHE_DISABLE=1 ninja -C "$work/first/build" > "$work/first.touch.log" 2>&1
touch_s=$(seconds "$start")
touched=$(units "$work/first.touch.log")

git clone -q "$repo" "$work/second"
ccache -z > /dev/null
second=$(build_all "$work/second")
second_hits=$(hits)
second_misses=$(stat cache_miss)

printf '%-58s %s\n' "what (in $work)" "figure"
printf '%-58s %s\n' "cold build, build/ and build-fuzz/ ($total units)" "$((cold / 60))m$((cold % 60))s"
printf '%-58s %s\n' "  ccache misses in it" "$cold_misses"
printf '%-58s %s\n' "edit of comm/group.h: units rebuilt in build/" "$touched of $main_units ($((100 * touched / main_units))%)"
printf '%-58s %s\n' "  the rebuild, without ccache" "$((touch_s / 60))m$((touch_s % 60))s"
printf '%-58s %s\n' "second clone at another path, both folders" "$((second / 60))m$((second % 60))s"
printf '%-58s %s\n' "  ccache hits" "$second_hits of $((second_hits + second_misses)) ($((100 * second_hits / (second_hits + second_misses)))%)"
