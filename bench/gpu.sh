#!/usr/bin/env bash
# The GPU checks (docs/benchmarks.md "On a GPU", docs/distributed.md "Building with CUDA"), in one
# script sized for a short loan of a GPU machine:
#   1. build loco against the machine's own PyTorch (a CUDA LibTorch) into build-cuda/;
#   2. run the CUDA tests and the model, optimizer, algorithm and transport suites on that build;
#   3. loco-bench on a GPT-2-small-shaped model (configs/gpt-small.toml): tokens/s, MFU, loop overhead;
#   4. DiLoCo and Streaming DiLoCo with worker processes sharing the GPU, checking that every
#      worker ends every round with the same parameters (θ hash).
#
#   bench/gpu.sh [OUT]    logs and results into OUT (default runs/gpu), a summary at the end
#
# Environment: LOCO_DEBS, a folder of .deb files of loco's dependencies to unpack where the machine
# lacks them (files it has are never replaced); LOCO_UPLOT_TGZ, uPlot's npm tarball on a machine
# without npm; LOCO_GLOO_INCLUDE_DIR, Gloo's headers where LibTorch has none (pip wheels);
# DATA_SMALL / DATA_GPT, the datasets (data/brown, data/brown50k; prepared when missing);
# GPU_STAGES, which stages run after the build (default "cuda bench runs suites"; "teardown" runs
# loco-bench under cuda-gdb and prints the stack of a crash at its exit).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu}
mkdir -p "$out"
data_small=${DATA_SMALL:-data/brown}
data_gpt=${DATA_GPT:-data/brown50k}
loco=build-cuda/loco
stage() { echo; echo "== $* ($(date +%T))"; }
stages=" ${GPU_STAGES:-cuda bench runs suites} "
wants() { [[ $stages == *" $1 "* ]]; }

stage "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda, "C++11 ABI", torch._C._GLIBCXX_USE_CXX11_ABI)'

if [ -n "${LOCO_DEBS:-}" ]; then
  stage "dependencies from $LOCO_DEBS (only files the machine lacks)"
  for deb in "$LOCO_DEBS"/*.deb; do
    unpacked=$(mktemp -d)
    dpkg -x "$deb" "$unpacked"
    (cd "$unpacked" && find . ! -type d -print0 | tar --null -T - -cf -) | tar -C / -xf - --skip-old-files
    rm -rf "$unpacked"
  done
  ldconfig
fi

stage "configure"
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$torch_prefix" \
  ${LOCO_UPLOT_TGZ:+-DLOCO_UPLOT_TGZ=$LOCO_UPLOT_TGZ} ${LOCO_GLOO_INCLUDE_DIR:+-DLOCO_GLOO_INCLUDE_DIR=$LOCO_GLOO_INCLUDE_DIR} \
  > "$out/configure.log" 2>&1 \
  || { tail -n 40 "$out/configure.log"; exit 1; }
grep -E 'loco: |Found CUDA' "$out/configure.log"

stage "build"
suites="test_cuda test_model test_optim test_golden test_algorithms test_comm"
# -k 0: every translation unit that fails is reported, not only the first.
if ! cmake --build build-cuda -j "$(nproc)" --target loco loco-bench $suites -- -k 0 > "$out/build.log" 2>&1; then
  grep -E 'error|Error' "$out/build.log" | head -n 60
  exit 1
fi
tail -n 1 "$out/build.log"

# tests SUITE...: each suite's binary, its summary and failures; the CUDA tests come first, the
# CPU suites (this LibTorch's Gloo, autograd and kernels under loco's code) at the end.
# A suite given as SUITE:FILTER runs the tests that FILTER (gtest's) names.
tests() {
  for spec in "$@"; do
    suite=${spec%%:*}
    filter=${spec#"$suite"}
    stage "tests: $spec"
    binary=$(find build-cuda/tests -name "$suite" -type f | head -n 1)
    timeout 60 "$binary" --gtest_brief=1 ${filter:+--gtest_filter=${filter#:}} > "$out/$suite.log" 2>&1
    echo "$suite: exit $?; $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$out/$suite.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]|Failure|error' "$out/$suite.log" | head -n 10
  done
}
wants cuda && tests test_cuda

stage "data"
[ -f "$data_small/manifest.json" ] || "$loco" prepare --corpus brown --out "$data_small"
[ -f "$data_gpt/manifest.json" ] || "$loco" prepare --corpus brown --vocab-size 50304 --out "$data_gpt"

wants bench && stage "loco-bench: GPT-2 small (124M), bf16" && timeout 150 build-cuda/loco-bench --config configs/gpt-small.toml --data.dir="$data_gpt" --steps 30 --rounds 3 \
  --peak-tflops 989 --json "$out/bench.json" --work-dir "$out/bench-work" 2>&1 | tee "$out/bench.log"

# run NAME [overrides...]: a launch of 4 workers on the GPU; every worker's θ hash must agree in
# every round (metrics.jsonl "sync" events).
run() {
  local name=$1; shift
  stage "$name: $*"
  rm -rf "${out:?}/$name"
  timeout 90 "$loco" launch --config configs/brown.toml --data.dir="$data_small" --run.dir="$out/$name" \
    --train.device=cuda --train.steps=100 --eval.every=50 "$@" > "$out/$name.log" 2>&1
  echo "exit $?"
  tail -n 3 "$out/$name.log"
  python3 - "$out/$name/metrics.jsonl" <<'EOF'
import collections, json, sys
hashes, workers = collections.defaultdict(set), collections.defaultdict(set)
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("event") == "sync":
        hashes[(e.get("fragment"), e["round"])].add(e["params_hash"])
        workers[(e.get("fragment"), e["round"])].add(e.get("worker"))
differ = [k for k, v in hashes.items() if len(v) != 1]
print(f"theta: {len(hashes)} rounds, {sum(len(w) for w in workers.values())} worker reports, "
      f"{'all agree' if not differ else f'{len(differ)} rounds differ: {differ[:5]}'}")
sys.exit(1 if differ or not hashes else 0)
EOF
}
if wants runs; then
  run diloco --sync.algorithm=diloco --sync.inner_steps=20
  run streaming
fi
# The golden tests of the model, its fused loss and AdamW against PyTorch's (those of Hugging
# Face's tokenizers need npm's packages, which such a machine may lack).
wants suites && tests test_model test_optim 'test_golden:*GoldenModel*:Golden.AdamW*' test_algorithms test_comm

if wants teardown; then
  stage "teardown: loco-bench under cuda-gdb"
  timeout 240 cuda-gdb -q -batch -ex 'set pagination off' -ex run -ex 'bt 40' -ex 'info threads' \
    --args build-cuda/loco-bench --config configs/gpt-small.toml --data.dir="$data_gpt" --steps 10 --rounds 1 \
    --work-dir "$out/teardown-work" 2>&1 | grep -vE '^\[(New|Thread .* exited)' | tail -n 80
fi

stage "done"
