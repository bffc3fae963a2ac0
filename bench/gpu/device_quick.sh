#!/usr/bin/env bash
# A short device call for the capturable layer 2: build only its tests, the C example and the
# decode-step benchmark, run them, print the table. For when little device time is left (the
# full run is bench/gpu/device_run.sh). Needs .devdeps/googletest (carried).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
device_configure
cmake --build build/dev -j"$J" --target kvarn_test_paged_run kvarn_test_cuda_graph \
  kvarn_test_cuda_codec kvarn_example_paged_decode bench_decode_step >"$OUT/build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
rc=0
for t in kvarn_test_paged_run kvarn_test_cuda_graph kvarn_test_cuda_codec; do
  build/dev/tests/$t --gtest_brief=1 >"$OUT/$t.log" 2>&1 || rc=1
  echo "$t: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/$t.log" | tr '\n' ' ')"
done
build/dev/examples/paged_decode --backend cuda >"$OUT/paged_decode_cuda.log" 2>&1
echo "paged_decode --backend cuda rc=$?: $(tail -1 "$OUT/paged_decode_cuda.log")"
build/dev/bench_decode_step --steps ${STEPS:-20} 2>&1 | tee "$OUT/bench_decode_step.txt"
echo "---- $(( $(date +%s) - t0 )) s, tests rc=$rc ----"
exit $rc
