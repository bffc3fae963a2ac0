#!/usr/bin/env bash
# Builds the release preset and runs the CPU benchmarks; paste the table into bench/RESULTS.md
# with the date, machine and this command.
#   bench/cpu/run.sh [google-benchmark flags]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
cmake --preset cpu >/dev/null
cmake --build --preset cpu --target kvarn-bench-cpu kvarn-selftest >/dev/null
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -m) $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
build/cpu/bench/kvarn-bench-cpu --benchmark_counters_tabular=true --benchmark_min_time=0.5 "$@"
