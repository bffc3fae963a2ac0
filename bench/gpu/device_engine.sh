#!/usr/bin/env bash
# One device call for issue 23's engine pieces on CUDA, most important first, inside a budget of
# BUDGET_S seconds (default 520; a step that would start later is skipped and says so):
# the append-flush cases of the tail-state lockstep suite (CPU oracle), plan/run suite (the mixed
# batch under a plan sized by engine maxima: the device-built work list), the graph suite (the
# one-pool mixed step captured and replayed 300 times against eager calls), an extend subset of the
# attention suite, memcheck on both, the mixed-step bench with and without the work list, the
# rest of the tail suite, and the design point. Needs .devdeps/googletest (carried).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
budget=${BUDGET_S:-520}
nvidia-smi --query-gpu=name --format=csv,noheader
T=build/dev/tests
B=build/dev/bench_cuda_attention
if [[ -n ${PREBUILT:-} ]]; then
  # PREBUILT=dir: binaries built on the development machine (sm_90, glibc 2.34, the CUDA runtime
  # linked statically), carried flat in dir with libkvarn.so.0: no build when device time is short.
  T=$PREBUILT B=$PREBUILT/bench_cuda_attention
  export LD_LIBRARY_PATH=$PWD/$PREBUILT${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  chmod +x "$PREBUILT"/* 2>/dev/null
else
  device_configure -DKVARN_BUILD_BENCH=OFF
  cmake --build build/dev -j"$J" --target kvarn_test_cuda_tail_state kvarn_test_paged_run \
    kvarn_test_cuda_attention kvarn_test_cuda_graph bench_cuda_attention >"$OUT/build.log" 2>&1 ||
    { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
fi
echo "build: $(($(date +%s) - t0)) s"
rc=0
summary=()
run() { # name, seconds, command...
  local name=$1 limit=$2
  shift 2
  local left=$((budget - ($(date +%s) - t0)))
  if ((left < 20)); then
    summary+=("$name: skipped (budget)")
    return
  fi
  ((limit > left)) && limit=$left
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1 || rc=1
  local line
  line="$name ($(($(date +%s) - t0)) s): $(grep -E '^\[  (PASSED|FAILED)|ERROR SUMMARY' "$OUT/$name.log" | tr '\n' ' ')"
  echo "$line"
  summary+=("$line")
  grep -E "^\[  FAILED|Failure|Expected|Which is|actual|error" "$OUT/$name.log" | head -8
}
TS=$T/kvarn_test_cuda_tail_state
run paged_run 40 $T/kvarn_test_paged_run --gtest_filter='*/cuda'
run graph 60 $T/kvarn_test_cuda_graph
run tail_af 100 $TS --gtest_filter='*_af*:*Faults*'
grep -h "^\[ kernels" "$OUT/tail_af.log" 2>/dev/null | head -4
run attention_extend 90 $T/kvarn_test_cuda_attention --gtest_filter='*extend*:*Extend*'
run memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 1 $TS \
  --gtest_filter='*k4v4_g64_D64*_af*:*Faults*'
run memcheck_mixed 60 compute-sanitizer --tool memcheck --error-exitcode 1 $T/kvarn_test_paged_run \
  --gtest_filter='*MixedBatch*/cuda:*ExtendPlan*/cuda'
run mixed 40 $B --no-read-bw --mixed
run mixed_nolist 40 env KVARN_CUDA_WORK_LIST=off $B --no-read-bw --mixed
run mixed_split 40 env KVARN_CUDA_DECODE_ROWS=split $B --no-read-bw --mixed
run paged_run_split 40 env KVARN_CUDA_DECODE_ROWS=split $T/kvarn_test_paged_run --gtest_filter='*/cuda'
run graph_split 60 env KVARN_CUDA_DECODE_ROWS=split $T/kvarn_test_cuda_graph
run tail_af_split 100 env KVARN_CUDA_DECODE_ROWS=split $TS --gtest_filter='*_af*'
run tail_rest 150 $TS --gtest_filter='-*_af*:*Faults*'
run racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 1 $TS \
  --gtest_filter='*k4v2_g128_D128_Hk4*_af*'
run design 40 $B --no-read-bw --shape 32 32768
echo "==== summary ($(($(date +%s) - t0)) s, rc=$rc)"
printf '%s\n' "${summary[@]}"
for f in mixed mixed_nolist mixed_split; do
  echo "-- $f"
  grep -A3 "^mixed step" "$OUT/$f.log"
done
tail -1 "$OUT/design.log" 2>/dev/null
# One file back instead of one per step (the device tool returns a limited number of files).
for f in "$OUT"/*.log; do
  echo "===== ${f##*/}"
  cat "$f"
done >"$OUT/logs.txt"
rm -f "$OUT"/*.log
exit $rc
