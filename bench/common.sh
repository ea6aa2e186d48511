# Shared by the training benchmarks (bench/diloco.sh, bench/streaming.sh, bench/dipaco-*.sh); sourced, not
# run. Expects: loco (the binary), out (the output folder), config (the TOML), steps.

# Whether OUT/NAME holds a run that every worker finished.
finished() { "$loco" report "$1" > /dev/null 2>&1 && ! "$loco" report "$1" | grep -q "(unfinished)"; }

# run NAME [overrides...]: one launch into OUT/NAME, its output in OUT/NAME.log; a finished run is
# kept and skipped, so an interrupted benchmark continues where it stopped.
run() {
  local name=$1; shift
  if finished "$out/$name"; then echo "bench: $name already done"; return; fi
  rm -rf "${out:?}/$name"
  echo "bench: $name ($*)"
  "$loco" launch --config "$config" --run.dir="$out/$name" --train.steps="$steps" "$@" > "$out/$name.log" 2>&1 \
    || { echo "bench: $name failed, see $out/$name.log"; tail -n 5 "$out/$name.log"; exit 1; }
  tail -n 1 "$out/$name.log"
}

# Builds loco and prepares Brown when they are missing.
prepare() {
  [ -x "$loco" ] || scripts/build.sh
  [ -f data/brown/manifest.json ] || "$loco" prepare --corpus brown --out data/brown
  mkdir -p "$out"
}

# step NAME COMMAND...: runs once into OUT/NAME (its output in OUT/NAME.log); skipped when OUT/NAME.done exists.
step() {
  local name=$1; shift
  if [ -f "$out/$name.done" ]; then echo "bench: $name already done"; return; fi
  rm -rf "${out:?}/$name"
  echo "bench: $name"
  /usr/bin/time -f "wall %e s" "$@" > "$out/$name.log" 2>&1 || { echo "bench: $name failed, see $out/$name.log"; tail -n 5 "$out/$name.log"; exit 1; }
  tail -n 1 "$out/$name.log"
  touch "$out/$name.done"
}
