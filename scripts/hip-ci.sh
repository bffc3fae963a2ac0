#!/usr/bin/env bash
# CI step for the ROCm backend (issue 14), run by .ci/run: configure and build the `hip` preset
# (the CUDA kernels compiled as HIP by clang-15 for gfx90a and gfx1030, with Debian 12's ROCm 5.2
# from scripts/install-deps.sh), then run its tests: the GPU suites against the ROCm backend,
# which skip without an AMD GPU, and the selftest. Builds the library, kvarn-selftest and the
# GPU test binaries only (the build preset's targets), to stay within the CI time budget.
# KVARN_CI_HIP=0 skips it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ "${KVARN_CI_HIP:-1}" == "0" ]]; then
  echo "hip-ci: KVARN_CI_HIP=0, skipped"
  exit 0
fi
start=$(date +%s)
cmake --preset hip
cmake --build --preset hip
ctest --preset hip
# With no AMD GPU the backend must say so and refuse (never fall back); with one, it must pass.
selftest=build/hip/tools/kvarn-selftest/kvarn-selftest
out=$("$selftest" --quick --backend rocm 2>&1 || true)
if grep -q "^  rocm  available" <<<"$out"; then
  "$selftest" --quick --backend rocm
elif ! grep -q "^  rocm  not available: no ROCm device found" <<<"$out"; then
  echo "hip-ci: kvarn-selftest --backend rocm did not report a built, unavailable backend:" >&2
  echo "$out" >&2
  exit 1
fi
echo "hip-ci: kvarn-selftest --backend rocm: $(grep '^  rocm' <<<"$out")"
echo "hip-ci: done in $(($(date +%s) - start)) s"
