#!/usr/bin/env bash
# A short device call for little device time: build only the plan/run, isolation, attention and
# codec suites (the decode family's four units compile in parallel), then the issue-28 GPU
# isolation suite, the plan/run CUDA tests, a family subset, the attention variants' GPU path
# (issue 25, behind KVARN_CUDA_EXPERIMENTAL_VARIANTS, which its suite sets) and the head dims
# 80/96 refusals, the error word (issue 23), and the sanitizers, each line printed as it finishes. Needs
# .devdeps/googletest (carried).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
device_configure -DKVARN_BUILD_BENCH=OFF
cmake --build build/dev -j"$J" --target test_run_isolation kvarn_test_paged_run \
  kvarn_test_cuda_attention kvarn_test_cuda_codec kvarn_test_cuda_graph >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
rc=0
run() {  # name, command...
  local name=$1
  shift
  "$@" >"$OUT/$name.log" 2>&1 || rc=1
  echo "$name ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED)|ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$name.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED" "$OUT/$name.log" | head -5
}
T=build/dev/tests
run isolation env KVARN_ISOLATION_STEPS="${STEPS:-1000}" $T/test_run_isolation --gtest_filter='*/cuda'
run paged_run $T/kvarn_test_paged_run --gtest_filter='*/cuda'
run attention $T/kvarn_test_cuda_attention --gtest_filter='*family_d64_k4v2*:*family_d128_k4v2*:*family_d256*k4v4*:*family_d512_k2v2*:*long128k_hk8*:*k4v2_g128_decode*:*extend_fp16io*'
run variants $T/kvarn_test_cuda_attention --gtest_filter='*CudaAttentionVariants*:*ModelVariantsAreRefused*'
run headdims $T/kvarn_test_cuda_codec --gtest_filter='*HeadDims80And96*'
run error_word $T/kvarn_test_cuda_graph --gtest_filter='*CudaErrorWord*'
run variants_memcheck compute-sanitizer --tool memcheck --error-exitcode 1 $T/kvarn_test_cuda_attention --gtest_filter='*CudaAttentionVariants*'
run variants_racecheck compute-sanitizer --tool racecheck --error-exitcode 1 $T/kvarn_test_cuda_attention --gtest_filter='*CudaAttentionVariants*window_1*:*CudaAttentionVariants*prefix*'
run isolation_memcheck env KVARN_ISOLATION_STEPS=60 compute-sanitizer --tool memcheck --error-exitcode 1 $T/test_run_isolation --gtest_filter='*/cuda'
run isolation_synccheck env KVARN_ISOLATION_STEPS=10 compute-sanitizer --tool synccheck --error-exitcode 1 $T/test_run_isolation --gtest_filter='*/cuda'
run isolation_racecheck env KVARN_ISOLATION_STEPS=10 compute-sanitizer --tool racecheck --error-exitcode 1 $T/test_run_isolation --gtest_filter='*/cuda'
echo "---- $(( $(date +%s) - t0 )) s, rc=$rc ----"
exit $rc
