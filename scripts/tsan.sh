#!/usr/bin/env bash
# ThreadSanitizer over the launcher and the coordinator (docs/concurrency.md). Builds build-tsan/
# (every library and test with -fsanitize=thread; about 40 minutes on 2 cores the first time), then
# runs the launch tests and the chaos tests that abuse the coordinator's server with `loco launch`
# instrumented and its workers plain (build/loco, via LOCO_WORKER_EXECUTABLE): SentencePiece's
# plugin must be loaded with RTLD_DEEPBIND, which a sanitizer's runtime refuses, so neither a worker
# nor `loco prepare` can run instrumented. Exits 1 when TSan reported anything (the reports are in
# build-tsan/tsan/), 0 otherwise. The tests' own verdicts are printed, not judged: under TSan a
# test's timing and memory bounds are not the ones it was written for.
#
#   scripts/tsan.sh [test_chaos gtest filter]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
[ -x build/loco ] || { echo "tsan: build the plain tree first (scripts/build.sh): its loco runs the workers" >&2; exit 2; }
chaos_filter=${1:-'*MisbehavingClients*:*ThousandsOfHeld*'}
if [ ! -f build-tsan/build.ninja ]; then
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" -DCMAKE_C_FLAGS="-fsanitize=thread" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread"
fi
cmake --build build-tsan --target loco test_launch test_chaos

# The tests run build-tsan/loco: for a while it is a script that runs the instrumented binary for
# `launch` and `coordinator` and the plain one for everything else.
mv build-tsan/loco build-tsan/loco-tsan
trap 'mv "$root/build-tsan/loco-tsan" "$root/build-tsan/loco"' EXIT
cat > build-tsan/loco <<EOF
#!/bin/sh
case "\$1" in
  launch|coordinator) LOCO_WORKER_EXECUTABLE="$root/build/loco" exec "$root/build-tsan/loco-tsan" "\$@" ;;
  *) exec "$root/build/loco" "\$@" ;;
esac
EOF
chmod +x build-tsan/loco

rm -rf build-tsan/tsan && mkdir -p build-tsan/tsan
export TSAN_OPTIONS="log_path=$root/build-tsan/tsan/report exitcode=0 halt_on_error=0 second_deadlock_stack=1"
build-tsan/tests/cli/test_launch 2>&1 | grep -E '^\[ +(OK|FAILED|PASSED) ' || true
build-tsan/tests/cli/test_chaos --gtest_filter="$chaos_filter" 2>&1 | grep -E '^\[ +(OK|FAILED|PASSED) ' || true

reports=$(cat build-tsan/tsan/report.* 2>/dev/null | grep -c 'WARNING: ThreadSanitizer' || true)
if [ "$reports" -gt 0 ]; then
  echo "tsan: $reports report(s) in build-tsan/tsan/:"
  grep -h '^SUMMARY' build-tsan/tsan/report.* | sort | uniq -c
  exit 1
fi
echo "tsan: no report"
