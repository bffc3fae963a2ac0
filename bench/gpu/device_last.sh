#!/usr/bin/env bash
# A short device call for little device time: build only the plan/run, isolation, attention,
# codec and graph suites and the attention bench (the decode family's four units compile in
# parallel), then, each line printed as it finishes: the issue-28 GPU isolation suite, the
# plan/run CUDA tests, a family subset, the attention variants (issue 25) on the kernels the plan
# chooses and on the general kernel, the plans' kernel choice for variants, the head dims 80/96
# refusals, the error word (issue 23), the sanitizers, and last the design point's decode time
# and the gpt-oss / Gemma variant rows against fp16 SDPA, the short-context floor's split sweep,
# then the sanitizers (each cut at SAN_TIMEOUT s). Needs .devdeps/googletest (carried).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
device_configure -DKVARN_BUILD_BENCH=OFF
cmake --build build/dev -j"$J" --target test_run_isolation kvarn_test_paged_run \
  kvarn_test_cuda_attention kvarn_test_cuda_codec kvarn_test_cuda_graph bench_cuda_attention \
  >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
rc=0
run() {  # name, command...
  local name=$1
  shift
  "$@" >"$OUT/$name.log" 2>&1 || rc=1
  echo "$name ($(( $(date +%s) - t0 )) s): $(grep -E '^\[  (PASSED|FAILED)|ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$name.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|Expected|Which is|actual" "$OUT/$name.log" | head -8
}
run_t() { local name=$1; shift; run "$name" timeout "${SAN_TIMEOUT:-60}" "$@"; }
T=build/dev/tests
A=$T/kvarn_test_cuda_attention
VF='*CudaAttentionVariant*'
run variants $A --gtest_filter="$VF"
grep -h "^\[ errors" "$OUT/variants.log" | sort -k6 -g | tail -3
run variants_generic env KVARN_CUDA_ATTENTION=generic $A --gtest_filter="$VF"
run attention $A --gtest_filter='*family_d64_k4v2*:*family_d128_k4v2*:*family_d256*k4v4*:*family_d512_k2v2*:*long128k_hk8*:*k4v2_g128_decode*:*extend_fp16io*'
run isolation env KVARN_ISOLATION_STEPS="${STEPS:-300}" $T/test_run_isolation --gtest_filter='*/cuda'
run paged_run $T/kvarn_test_paged_run --gtest_filter='*/cuda'
run headdims $T/kvarn_test_cuda_codec --gtest_filter='*HeadDims80And96*'
run error_word $T/kvarn_test_cuda_graph --gtest_filter='*CudaErrorWord*'
echo "---- tests: $(( $(date +%s) - t0 )) s, rc=$rc ----"
# Speed: the design point (B32 / 32k and B1 / 128k, k4v2 D128) and the variant rows.
for shape in "32 32768" "1 131072"; do
  build/dev/bench_cuda_attention --no-read-bw --shape $shape 2>&1 | tail -1
done
[[ ${BENCH_VARIANTS:-1} == 1 ]] && timeout 120 bash bench/gpu/variant_rows.sh build/dev
timeout 70 bash bench/gpu/device_floor.sh quick
echo "---- benches: $(( $(date +%s) - t0 )) s ----"
# The sanitizers last (the slowest part; a cut-off run still returns the rest).
run_t variants_memcheck compute-sanitizer --tool memcheck --error-exitcode 1 $A --gtest_filter="$VF"
run_t variants_racecheck compute-sanitizer --tool racecheck --error-exitcode 1 $A \
  --gtest_filter='*CudaAttentionVariants*window_1_*:*CudaAttentionVariants*prefix_window*:*CudaAttentionVariants*extend_d128_window*:*CudaAttentionVariants*gptoss_window_sinks_decode*'
run_t variants_synccheck compute-sanitizer --tool synccheck --error-exitcode 1 $A \
  --gtest_filter='*CudaAttentionVariants*gemma2*:*CudaAttentionVariants*extend_d128_g64*'
run_t isolation_memcheck env KVARN_ISOLATION_STEPS=60 compute-sanitizer --tool memcheck --error-exitcode 1 $T/test_run_isolation --gtest_filter='*/cuda'
run_t isolation_synccheck env KVARN_ISOLATION_STEPS=10 compute-sanitizer --tool synccheck --error-exitcode 1 $T/test_run_isolation --gtest_filter='*/cuda'
run_t isolation_racecheck env KVARN_ISOLATION_STEPS=10 compute-sanitizer --tool racecheck --error-exitcode 1 $T/test_run_isolation --gtest_filter='*/cuda'
echo "---- all: $(( $(date +%s) - t0 )) s, rc=$rc ----"
exit $rc
