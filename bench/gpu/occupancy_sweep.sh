#!/usr/bin/env bash
# Decode attention vs the tensor-core kernel's CTAs-per-SM register budget (KVARN_MMA_MIN_BLOCKS):
# builds the bench once per value (after device_run.sh built GoogleTest into /tmp/gt) and times
# the TARGETS.md decode shapes. Run on the device: bash bench/gpu/occupancy_sweep.sh [3 4 5]
set -uo pipefail
values=${*:-3 4 5}
OUT=${OUT:-/tmp/kvarn-out}
mkdir -p "$OUT"
for mb in $values; do
  (cmake -S . -B build/mb$mb -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVARN_ENABLE_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=90 -DKVARN_BUILD_TESTS=OFF -DKVARN_BUILD_BENCH=OFF -DKVARN_BUILD_PYTHON=OFF \
     -DCMAKE_CUDA_FLAGS="-DKVARN_MMA_MIN_BLOCKS=$mb" >"$OUT/mb$mb.configure.log" 2>&1 &&
   cmake --build build/mb$mb --target bench_cuda_attention >"$OUT/mb$mb.build.log" 2>&1) &
done
wait
for mb in $values; do
  echo "== KVARN_MMA_MIN_BLOCKS=$mb"
  [[ -x build/mb$mb/bench_cuda_attention ]] || { tail -5 "$OUT/mb$mb.build.log"; continue; }
  for shape in "1 32768" "8 32768" "32 4096" "32 32768" "32 131072"; do
    build/mb$mb/bench_cuda_attention --shape $shape 2>&1 | tail -1
  done
done
