#!/usr/bin/env bash
# Decode attention vs the tensor-core kernel's register budget: the automatic choice and each
# forced value of KVARN_CUDA_MMA_BLOCKS (3: 168 registers, 4: 128 registers), on the TARGETS.md
# decode shapes. Run on the device after bench/gpu/device_run.sh built build/dev.
set -uo pipefail
bench=${BENCH:-build/dev/bench_cuda_attention}
for mb in auto 3 4; do
  echo "== KVARN_CUDA_MMA_BLOCKS=$mb"
  for shape in "1 32768" "8 32768" "32 4096" "32 32768" "32 131072"; do
    if [[ $mb == auto ]]; then
      $bench --shape $shape 2>&1 | tail -1
    else
      KVARN_CUDA_MMA_BLOCKS=$mb $bench --shape $shape 2>&1 | tail -1
    fi
  done
done
