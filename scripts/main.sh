#!/usr/bin/env bash
# The main job: set up, build, prepare the Brown corpus, train a small GPT with DiLoCo on 4 local
# worker processes (configs/brown.toml), evaluate the global parameters and sample text.
#   scripts/main.sh [--section.key=value ...]      (overrides go to `loco launch`)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh

data=data/brown
run=runs/brown
if [ ! -f "$data/manifest.json" ]; then
  build/loco prepare --corpus brown --out "$data"
fi
if [ -d "$run" ] && [ ! -d "$run/workers" ]; then
  # A run of the earlier single-process main job: keep it, out of the way.
  echo "main: $run holds a single-process run; moving it to $run.single"
  rm -rf "$run.single"
  mv "$run" "$run.single"
fi
# A run made from another version of configs/brown.toml cannot continue under this one: keep it,
# out of the way, and start afresh. (The config's hash is kept next to the run folder.)
config_hash=$(sha256sum configs/brown.toml | cut -d' ' -f1)
if [ -d "$run" ] && [ "$(cat "$run.config-sha256" 2>/dev/null)" != "$config_hash" ]; then
  old="$run.$(date +%Y%m%d-%H%M%S)"
  echo "main: $run was trained from another configs/brown.toml; moving it to $old"
  mv "$run" "$old"
fi
if compgen -G "$run/workers/*/checkpoints/latest" > /dev/null; then
  # A previous main job left a run here: continue it (a finished run just evaluates again).
  build/loco launch --config configs/brown.toml --data.dir="$data" --run.dir="$run" --resume "$@"
else
  rm -rf "$run"  # nothing saved yet (stopped before its first checkpoint)
  mkdir -p "$(dirname "$run")"
  echo "$config_hash" > "$run.config-sha256"
  build/loco launch --config configs/brown.toml --data.dir="$data" --run.dir="$run" "$@"
fi
build/loco eval --checkpoint "$run"
for prompt in "The jury said" "She looked at him and"; do
  echo "--- sample: $prompt"
  build/loco generate --checkpoint "$run" --prompt "$prompt" --max-new-tokens 60 --temperature 0.8 --top-k 40 --seed 1
done
# The claim, in the last lines: this run against one worker alone with the same per-worker budget
# and against DDP, both measured on this machine by bench/sweep.sh (docs/benchmarks.md).
echo "--- the main job against its baselines (measured by bench/sweep.sh; docs/benchmarks.md)"
build/loco report "$run" --baseline bench/results/main-baselines.json
