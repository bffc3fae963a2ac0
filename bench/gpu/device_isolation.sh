#!/usr/bin/env bash
# The GPU fault-isolation suite of issue 28 on a device (docs/RELIABILITY.md, "Fault isolation
# of the run calls"): builds test_run_isolation and the plan/run tests for sm_90, runs their
# CUDA instances (the random suite with STEPS malformed steps, default 2000), then
# compute-sanitizer memcheck and racecheck over the CUDA instances (fewer steps: racecheck is
# slow). Needs .devdeps/googletest (carried), like device_quick.sh.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
device_configure
cmake --build build/dev -j"$J" --target test_run_isolation kvarn_test_paged_run \
  >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
rc=0
run() {  # name, command...
  local name=$1
  shift
  "$@" >"$OUT/$name.log" 2>&1 || rc=1
  echo "$name: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)|ERROR SUMMARY|RACECHECK SUMMARY' \
    "$OUT/$name.log" | tr '\n' ' ')"
}
iso=build/dev/tests/test_run_isolation
run isolation env KVARN_ISOLATION_STEPS="${STEPS:-2000}" "$iso" --gtest_filter='*/cuda'
run paged_run build/dev/tests/kvarn_test_paged_run --gtest_filter='*/cuda'
run memcheck env KVARN_ISOLATION_STEPS=100 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$iso" --gtest_filter='*/cuda'
run racecheck env KVARN_ISOLATION_STEPS=20 compute-sanitizer --tool racecheck --error-exitcode 1 \
  "$iso" --gtest_filter='*/cuda'
run synccheck env KVARN_ISOLATION_STEPS=20 compute-sanitizer --tool synccheck --error-exitcode 1 \
  "$iso" --gtest_filter='*/cuda'
echo "---- $(( $(date +%s) - t0 )) s, rc=$rc ----"
exit $rc
