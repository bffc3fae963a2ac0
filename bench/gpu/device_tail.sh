#!/usr/bin/env bash
# Session 11's device call (issue 23: the per-request tail state on CUDA; issue 22: the split rule
# for short contexts). Builds the tail-state, attention, graph and plan/run suites and the
# attention bench, then, each line printed as it finishes: the CUDA tail-state suite (lockstep
# with the CPU backend) on the plan's kernels and on the general kernel, its fault suite, the
# sanitizers over it, regressions of the attention family, variants, plan/run and graph suites,
# and last the design point and the short-context floor's split sweep (the plan's count against
# forced ones). Needs .devdeps/googletest (carried).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
device_configure -DKVARN_BUILD_BENCH=OFF
cmake --build build/dev -j"$J" --target kvarn_test_cuda_tail_state kvarn_test_tail_state \
  kvarn_test_paged_run kvarn_test_cuda_attention kvarn_test_cuda_graph bench_cuda_attention \
  >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
rc=0
run() { # name, command...
  local name=$1
  shift
  "$@" >"$OUT/$name.log" 2>&1 || rc=1
  echo "$name ($(($(date +%s) - t0)) s): $(grep -E '^\[  (PASSED|FAILED)|ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$name.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|Expected|Which is|actual|error" "$OUT/$name.log" | head -10
}
run_t() {
  local name=$1
  shift
  run "$name" timeout "${SAN_TIMEOUT:-90}" "$@"
}
T=build/dev/tests
TS=$T/kvarn_test_cuda_tail_state
run tail $TS
grep -h "^\[ kernels" "$OUT/tail.log" | head -8
run tail_generic env KVARN_CUDA_ATTENTION=generic $TS
run tail_cpu $T/kvarn_test_tail_state
run_t tail_memcheck compute-sanitizer --tool memcheck --error-exitcode 1 $TS \
  --gtest_filter='*Faults*:*k4v2_g64_D128*:*k2v2_g64_D512*:*s40*:*k4v4_g64_D64*_af'
run_t tail_racecheck compute-sanitizer --tool racecheck --error-exitcode 1 $TS \
  --gtest_filter='*Faults*:*k4v4_g128_D64*:*k4v2_g128_D128_Hk4*_af'
run_t tail_synccheck compute-sanitizer --tool synccheck --error-exitcode 1 $TS \
  --gtest_filter='*Faults*:*k8v8*'
echo "---- tail: $(($(date +%s) - t0)) s, rc=$rc ----"
[[ ${1:-} == tail ]] && exit $rc
A=$T/kvarn_test_cuda_attention
run attention $A --gtest_filter='*family_d64_k4v2*:*family_d128_k4v2*:*family_d256*k4v4*:*family_d512_k2v2*:*long128k_hk8*:*k4v2_g128_decode*:*extend_fp16io*'
run variants $A --gtest_filter='*CudaAttentionVariant*'
run paged_run $T/kvarn_test_paged_run --gtest_filter='*/cuda'
run graph $T/kvarn_test_cuda_graph
echo "---- tests: $(($(date +%s) - t0)) s, rc=$rc ----"
for shape in "32 32768" "1 131072"; do
  build/dev/bench_cuda_attention --no-read-bw --shape $shape 2>&1 | tail -1
done
timeout 90 bash bench/gpu/device_floor.sh quick
echo "---- all: $(($(date +%s) - t0)) s, rc=$rc ----"
exit $rc
