#!/usr/bin/env bash
# Checks that every file under src/loco and src/cli includes only the loco folders its own folder may use
# (docs/architecture.md, "Folders and their dependencies", the table). CTest runs it as `layers`. The targets'
# link dependencies (src/loco/**/CMakeLists.txt) follow the same table.
set -euo pipefail
cd "$(dirname "$0")/../src"

# folder: the folders it may include from (its own is always allowed). The longest match wins.
declare -A may_use=(
  [loco/core]=""
  [loco/data]="loco/core"
  [loco/model]="loco/core"
  [loco/optim]="loco/core"
  [loco/metrics]="loco/core"
  [loco/comm]="loco/core"
  [loco/algorithms]="loco/core loco/data loco/model loco/optim loco/comm"
  [loco/runtime/config]="loco/core loco/data loco/model loco/optim loco/comm loco/algorithms"
  [loco/runtime/store]="loco/core loco/data"
  [loco/runtime/tasks]="loco/core loco/runtime/store"
  [loco/runtime/simulate]="loco/core loco/data loco/model loco/optim loco/comm loco/metrics loco/algorithms loco/runtime/config"
  # net knows nothing of runs: only core. status draws the page from net and metrics, without the coordinator.
  [loco/runtime/net]="loco/core"
  [loco/runtime/status]="loco/core loco/metrics loco/runtime/net"
  [loco/runtime/coordinator]="loco/core loco/data loco/model loco/optim loco/comm loco/metrics loco/algorithms loco/runtime/config loco/runtime/store loco/runtime/tasks loco/runtime/net loco/runtime/status"
  [loco/runtime/report]="loco/core loco/data loco/model loco/optim loco/comm loco/metrics loco/algorithms loco/runtime/config loco/runtime/store loco/runtime/tasks loco/runtime/net loco/runtime/status"
  [loco/runtime/worker]="loco/core loco/data loco/model loco/optim loco/comm loco/metrics loco/algorithms loco/runtime/config loco/runtime/store loco/runtime/tasks loco/runtime/net loco/runtime/status loco/runtime/coordinator"
  [loco/runtime/dipaco]="loco/core loco/data loco/model loco/optim loco/comm loco/metrics loco/algorithms loco/runtime/config loco/runtime/store loco/runtime/tasks loco/runtime/net loco/runtime/status loco/runtime/coordinator loco/runtime/worker"
  [loco/runtime/launch]="loco/core loco/data loco/model loco/optim loco/comm loco/metrics loco/algorithms loco/runtime/config loco/runtime/store loco/runtime/tasks loco/runtime/net loco/runtime/status loco/runtime/coordinator loco/runtime/worker loco/runtime/dipaco"
  [cli]="loco"
)

checked=0 broken=0
while IFS= read -r file; do
  folder=""
  for candidate in "${!may_use[@]}"; do
    if [[ $file == "$candidate"/* && ${#candidate} -gt ${#folder} ]]; then folder=$candidate; fi
  done
  if [[ -z $folder ]]; then
    echo "layers: $file is in no folder of the table in scripts/check_layers.sh" >&2
    broken=$((broken + 1))
    continue
  fi
  allowed="$folder ${may_use[$folder]}"
  while IFS= read -r header; do
    ok=0
    for prefix in $allowed; do [[ $header == "$prefix"/* ]] && ok=1; done
    if ((!ok)); then
      echo "layers: $file includes $header, which $folder may not use" >&2
      broken=$((broken + 1))
    fi
  done < <(sed -n 's/^#include "\(loco\/[^"]*\)".*/\1/p' "$file")
  checked=$((checked + 1))
done < <(find loco cli -name '*.h' -o -name '*.cpp')

if ((checked < 50)); then echo "layers: only $checked files found under src/loco" >&2; exit 1; fi
if ((broken)); then echo "layers: $broken include(s) break the layers" >&2; exit 1; fi
echo "layers: $checked files include only what their folder may use"
