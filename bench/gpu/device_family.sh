#!/usr/bin/env bash
# One device call for the tensor-core decode family (issue 22): build only the attention suite,
# the plan/run suite, the selftest and the benchmark; run the suite with the bulk-copy ring and
# the cp.async ring, then the decode grid against fp16 SDPA (bench/gpu/decode_grid.sh); a table
# last. Needs .devdeps/googletest (carried).
#   bench/gpu/device_family.sh [tests|grid|tests,grid] [gtest filter] [grid rows...]
set -uo pipefail
mode=${1:-tests,grid}
filter=${2:-*}
shift 2 2>/dev/null || shift $#
OUT=${OUT:-/tmp/kvarn-out}
mkdir -p "$OUT"
J=$(nproc)
t0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
if [[ ! -f /tmp/gt/lib/cmake/GTest/GTestConfig.cmake ]]; then
  { cmake -S .devdeps/googletest -B /tmp/gt-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX=/tmp/gt && cmake --build /tmp/gt-build -j"$J" &&
      cmake --install /tmp/gt-build; } >"$OUT/gtest.log" 2>&1 || { tail -20 "$OUT/gtest.log"; exit 1; }
fi
cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVARN_ENABLE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH=/tmp/gt >"$OUT/configure.log" 2>&1 ||
  { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build/dev -j"$J" --target kvarn_test_cuda_attention kvarn_test_paged_run \
  kvarn-selftest bench_cuda_attention >"$OUT/build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
rc=0
summary=()
if [[ $mode == *tests* ]]; then
  for ring in bulk cpasync; do
    KVARN_CUDA_RING=$ring build/dev/tests/kvarn_test_cuda_attention --gtest_filter="$filter" \
      >"$OUT/attention_$ring.log" 2>&1 || rc=1
    summary+=("attention ($ring ring): $(grep -E '^\[  (PASSED|FAILED)' "$OUT/attention_$ring.log" | tr '\n' ' ')")
    grep -E "^\[  FAILED|Failure|Expected|Which is" "$OUT/attention_$ring.log" | head -20
  done
  grep -E "^\[ errors" "$OUT/attention_bulk.log" | sort -t, -k1 | awk '{print}' >"$OUT/errors.txt"
  # The worst errors of the family against float64.
  sort -k6 -g "$OUT/errors.txt" | tail -3
  build/dev/tests/kvarn_test_paged_run --gtest_brief=1 >"$OUT/paged_run.log" 2>&1 || rc=1
  summary+=("paged_run: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/paged_run.log" | tr '\n' ' ')")
  build/dev/tools/kvarn-selftest/kvarn-selftest --backend cuda >"$OUT/selftest_cuda.log" 2>&1 || rc=1
  summary+=("selftest cuda: $(tail -1 "$OUT/selftest_cuda.log")")
fi
if [[ $mode == *sanitize* ]]; then
  # One case per kernel layout of the family: one warp per record (D64/D128, G 64/128), two and
  # four warps per record (D256, D512), every code width, and the ring wrapping in one split.
  sfilter=${SANITIZE_FILTER:-'*family_d64_k2v2_g64_*:*family_d128_k8v4_g128_*:*family_d256_k4v2_g128_*:*family_d512_k2v8_g64_*:*family_d128_k4v2_g128_gqa*:*ring_one_split*'}
  for tool in memcheck racecheck synccheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 build/dev/tests/kvarn_test_cuda_attention \
      --gtest_filter="$sfilter" >"$OUT/sanitize_$tool.log" 2>&1 || rc=1
    summary+=("compute-sanitizer $tool: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/sanitize_$tool.log" | tr '\n' ' ') $(grep -E 'SUMMARY' "$OUT/sanitize_$tool.log" | tail -1)")
  done
fi
if [[ $mode == *bench1* ]]; then
  for shape in "1 131072" "32 32768"; do build/dev/bench_cuda_attention --no-read-bw --shape $shape 2>&1 | tail -2; done
fi
if [[ $mode == *ncu* ]]; then
  # What limits decode at batch 32, 32k: one launch of the family's kernel per preset under ncu.
  for row in "k4v2_g128 128 32 8" "k4v4_g128 128 32 8" "k4v2_g128 256 16 8"; do
    read -r preset d hq hk <<<"$row"
    ncu --clock-control none --kernel-name regex:MmaAttention --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
      --section SchedulerStats build/dev/bench_cuda_attention --no-read-bw --preset "$preset" \
      --head-dim "$d" --heads "$hq" "$hk" --shape 32 32768 >"$OUT/ncu_${preset}_d$d.txt" 2>&1
    echo "== ncu $row"
    grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Theoretical Occupancy|Block Limit Shared|Dynamic Shared" \
      "$OUT/ncu_${preset}_d$d.txt" | tr -s ' ' | head -14
  done
fi
if [[ $mode == *grid* ]]; then
  timeout ${GRID_TIMEOUT:-300} bench/gpu/decode_grid.sh build/dev "$OUT" "$@" | tee "$OUT/grid_table.md"
fi
echo "---- $(( $(date +%s) - t0 )) s, rc=$rc ----"
printf '%s\n' "${summary[@]}"
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log ./*.txt ./*.csv 2>/dev/null)
exit $rc
