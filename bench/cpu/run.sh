#!/usr/bin/env bash
# Builds the release preset, runs the CPU benchmarks (every ISA level this machine has, the
# scalar reference, the fp16 baseline and the rooflines in one run) and appends a dated section
# with the tables to bench/RESULTS.md.
#   bench/cpu/run.sh [--no-append] [google-benchmark flags, e.g. --benchmark_filter=Decode]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
append=1
if [[ "${1:-}" == "--no-append" ]]; then
  append=0
  shift
fi
cmake --preset cpu >/dev/null
cmake --build --preset cpu --target kvarn-bench-cpu kvarn-selftest >/dev/null
json=$(mktemp /tmp/kvarn-bench-XXXXXX.json)
build/cpu/bench/kvarn-bench-cpu --benchmark_min_time=0.5 --benchmark_format=json \
  --benchmark_out="$json" --benchmark_out_format=json "$@" >/dev/null
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
table=$(python3 bench/cpu/report.py "$json" --machine "$(nproc) cores, $cpu" \
  --command "bench/cpu/run.sh $*")
echo "$table"
if ((append)); then
  printf '\n%s\n' "$table" >> bench/RESULTS.md
  echo "(appended to bench/RESULTS.md)"
fi
