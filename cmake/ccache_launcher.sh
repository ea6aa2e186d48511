#!/usr/bin/env bash
# The compiler launcher of loco's build when ccache is installed (CMakeLists.txt, LOCO_USE_CCACHE):
#
#   ccache_launcher.sh SOURCE_DIR BUILD_DIR CCACHE COMPILER ARGS...          a translation unit
#   ccache_launcher.sh SOURCE_DIR BUILD_DIR --pch COMPILER ARGS...           the precompiled header
#
# A second clone at another path should hit what the first compiled (docs/benchmarks.md, "Build"), so
# nothing clone-specific may reach ccache's hash:
# - paths under the sources are hashed relative to the build folder (base_dir), and the build folder's
#   own path is not hashed (no hash_dir; it only names the folder in debug info);
# - paths under the build folder that ccache does not rewrite (clang's `-Xclang -include -Xclang
#   .../cmake_pch.hxx`) are made relative here: the compiler runs in the build folder;
# - the precompiled header is never taken from the cache, since clang refuses one that names files
#   of another folder. It is compiled here, then OUT.sum is written beside it: a hash of the contents
#   of every file it was made from (its depfile's list), which ccache hashes for the translation units
#   that use it instead of the header's own bytes (pch_external_checksum);
# - the compiler is known by its bytes (compiler_check content), and a precompiled header's own
#   defines and time macros are not compared (sloppiness).
set -euo pipefail
source_dir=$1 build_dir=$2 mode=$3
shift 3

if [ "$mode" = --pch ]; then
  "$@"
  out="" depfile=""
  args=("$@")
  for ((i = 0; i + 1 < ${#args[@]}; i++)); do
    case "${args[i]}" in
      -o) out=${args[i + 1]} ;;
      -MF) depfile=${args[i + 1]} ;;
    esac
  done
  case "$out" in *.pch | *.gch) ;; *) exit 0 ;; esac
  rm -f "$out.sum"
  [ -n "$depfile" ] && [ -f "$depfile" ] || exit 0  # without it ccache hashes the header itself
  sed -e 's/\\$//' -e '1s/^[^:]*://' "$depfile" | tr ' ' '\n' | sed '/^$/d' |
    xargs -d '\n' sha256sum | cut -d' ' -f1 | sha256sum | cut -d' ' -f1 > "$out.sum.tmp"
  mv "$out.sum.tmp" "$out.sum"
  exit 0
fi

args=()
for arg in "$@"; do
  case "$arg" in
    "$build_dir"/*) args+=("${arg#"$build_dir"/}") ;;
    *) args+=("$arg") ;;
  esac
done
export CCACHE_BASEDIR=$source_dir CCACHE_NOHASHDIR=1 CCACHE_COMPILERCHECK=content CCACHE_PCH_EXTSUM=1
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
exec "$mode" "${args[@]}"
