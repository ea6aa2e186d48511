#!/usr/bin/env bash
# The main job: set up, build, prepare the Brown corpus, train, evaluate and sample text.
#   scripts/main.sh [--train.key=value ...]      (overrides go to `loco train`)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh

data=data/brown
run=runs/brown
if [ ! -f "$data/manifest.json" ]; then
  build/loco prepare --corpus brown --out "$data"
fi
if [ -f "$run/checkpoints/latest" ]; then
  # A previous main job left a run here: continue it (a finished run just evaluates again).
  build/loco train --config configs/brown.toml --data.dir="$data" --run.dir="$run" --resume "$@"
else
  rm -rf "$run"
  build/loco train --config configs/brown.toml --data.dir="$data" --run.dir="$run" "$@"
fi
build/loco eval --checkpoint "$run"
for prompt in "The jury said" "She looked at him and"; do
  echo "--- sample: $prompt"
  build/loco generate --checkpoint "$run" --prompt "$prompt" --max-new-tokens 60 --temperature 0.8 --top-k 40 --seed 1
done
