#!/usr/bin/env bash
# One device call for the tensor-core decode family (issue 22): build, the attention suite with
# the default layout (bulk-copy ring), the narrow layout (KVARN_CUDA_SLICE=64) and the cp.async
# ring, the other GPU suites, compute-sanitizer, the decode grids against fp16 SDPA
# (bench/gpu/decode_grid.sh: eager, narrow, graph-replayed) and ncu; short summary last, every
# log and table in $OUT/logs.tgz. Needs .devdeps/googletest (carried).
#   bench/gpu/device_family.sh [modes: tests,gpu,sanitize,grid,narrowgrid,graphgrid,ncu,bench1,
#                               variants]
#                              [gtest filter of the attention suite]
set -uo pipefail
mode=${1:-tests,grid}
filter=${2:-*}
source "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
device_configure -DKVARN_BUILD_BENCH=OFF
targets=(kvarn_test_cuda_attention kvarn_test_paged_run kvarn-selftest bench_cuda_attention)
[[ ",$mode," == *",gpu,"* ]] && targets=(all)
cmake --build build/dev -j"$J" --target "${targets[@]}" >"$OUT/build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
rc=0
summary=()
has() { [[ ",$mode," == *",$1,"* ]]; }
attention() {  # name, env..., then the gtest filter
  local name=$1 f=$2
  shift 2
  env "$@" build/dev/tests/kvarn_test_cuda_attention --gtest_filter="$f" >"$OUT/attention_$name.log" 2>&1 || rc=1
  summary+=("attention ($name): $(grep -E '^\[  (PASSED|FAILED)' "$OUT/attention_$name.log" | tr '\n' ' ')")
  grep -E "^\[  FAILED|Failure" "$OUT/attention_$name.log" | head -10
}
if has tests; then
  attention default "$filter" KVARN_CUDA_RING=bulk
  attention narrow "$filter" KVARN_CUDA_SLICE=64
  attention cpasync '*family*g128*:*ring*:*long128k*' KVARN_CUDA_RING=cpasync
  grep -hE "^\[ errors" "$OUT"/attention_default.log | sort -k6 -g | tail -2
  build/dev/tests/kvarn_test_paged_run --gtest_brief=1 >"$OUT/paged_run.log" 2>&1 || rc=1
  summary+=("paged_run: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/paged_run.log" | tr '\n' ' ')")
  build/dev/tools/kvarn-selftest/kvarn-selftest --backend cuda --verbose >"$OUT/selftest_cuda.log" 2>&1 || rc=1
  summary+=("selftest cuda: $(tail -1 "$OUT/selftest_cuda.log"); $(grep -m1 'attention kernel' "$OUT/selftest_cuda.log")")
fi
if has gpu; then
  # Every other GPU suite (codec, caches, graphs, plan/run, reliability).
  ctest --test-dir build/dev -L gpu -E 'CudaAttention|cuda_attention' -j4 --timeout 200 \
    >"$OUT/ctest_gpu.log" 2>&1 || rc=1
  summary+=("ctest -L gpu (attention aside): $(grep 'tests passed' "$OUT/ctest_gpu.log")")
  grep -E "\*\*\*Failed|Not Run|Timeout" "$OUT/ctest_gpu.log" | head -10
fi
if has sanitize; then
  # One case per kernel layout: one warp per record (D64/D128, G 64/128), 2 and 4 warps per
  # record (D256, D512, the narrow D128), every code width, the ring wrapping in one split.
  sfilter=${SANITIZE_FILTER:-'*family_d64_k2v2_g64_*:*family_d128_k8v4_g128_*:*family_d256_k4v2_g128_*:*family_d512_k2v8_g64_*:*family_d128_k4v2_g128_gqa*:*ring_one_split*'}
  for tool in memcheck racecheck synccheck; do
    for variant in default narrow; do
      ev=KVARN_CUDA_RING=bulk
      [[ $variant == narrow ]] && ev=KVARN_CUDA_SLICE=64
      env $ev compute-sanitizer --tool $tool --error-exitcode 9 build/dev/tests/kvarn_test_cuda_attention \
        --gtest_filter="$sfilter" >"$OUT/sanitize_${tool}_$variant.log" 2>&1 || rc=1
      summary+=("compute-sanitizer $tool ($variant): $(grep -E '^\[  (PASSED|FAILED)' "$OUT/sanitize_${tool}_$variant.log" | tr '\n' ' ') $(grep -E 'SUMMARY' "$OUT/sanitize_${tool}_$variant.log" | tail -1)")
    done
  done
  if [[ -n ${EXTRA_SANITIZE:-} ]]; then
    eval "$EXTRA_SANITIZE" >"$OUT/sanitize_extra.log" 2>&1 || rc=1
    summary+=("extra sanitizer runs rc=$?: $(grep -E 'SUMMARY|PASSED|FAILED' "$OUT/sanitize_extra.log" | tr '\n' ' ' | cut -c1-400)")
  fi
fi
if has bench1; then
  for shape in "1 131072" "32 32768"; do build/dev/bench_cuda_attention --no-read-bw --shape $shape 2>&1 | tail -1; done
fi
if has variants; then
  bash bench/gpu/variant_rows.sh build/dev
fi
if has ncu; then
  # What limits decode at batch 32, 32k: one launch of the family's kernel under ncu.
  for row in "default k4v2_g128 128 32 8" "narrow k4v2_g128 128 32 8" "default k4v4_g128 128 32 8"; do
    read -r variant preset d hq hk <<<"$row"
    ev=KVARN_CUDA_RING=bulk
    [[ $variant == narrow ]] && ev=KVARN_CUDA_SLICE=64
    env $ev ncu --clock-control none --kernel-name regex:MmaAttention --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
      --section SchedulerStats build/dev/bench_cuda_attention --no-read-bw --preset "$preset" \
      --head-dim "$d" --heads "$hq" "$hk" --shape 32 32768 >"$OUT/ncu_${variant}_${preset}_d$d.txt" 2>&1
    echo "== ncu $row: $(grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|No Eligible|Warp Cycles Per Issued" \
      "$OUT/ncu_${variant}_${preset}_d$d.txt" | tr -s ' ' | tr '\n' ';' | cut -c1-500)"
  done
fi
grid() {  # subdir, env..., then rows
  local sub=$1
  shift
  mkdir -p "$OUT/$sub"
  timeout ${GRID_TIMEOUT:-200} env "$@" >"$OUT/$sub/table.md" 2>"$OUT/$sub/stderr.txt"
  summary+=("grid $sub: $(grep -c '^| k' "$OUT/$sub/table.md") rows")
}
if has grid; then
  grid eager bench/gpu/decode_grid.sh build/dev "$OUT/eager"
fi
if has narrowgrid; then
  grid narrow KVARN_CUDA_SLICE=64 bench/gpu/decode_grid.sh build/dev "$OUT/narrow" \
    "k4v2_g128 128 32 8" "k4v4_g128 128 32 8" "k8v8_g128 128 32 8" "k2v2_g128 128 32 8" \
    "k4v2_g128 256 16 8" "k4v4_g128 256 16 8"
fi
if has graphgrid; then
  grid graph GRAPH=1 bench/gpu/decode_grid.sh build/dev "$OUT/graph" \
    "k4v2_g128 128 32 8" "k4v2_g128 64 64 8" "k4v2_g128 256 16 8"
fi
echo "---- $(( $(date +%s) - t0 )) s, rc=$rc ----"
printf '%s\n' "${summary[@]}"
tar czf /tmp/logs.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/logs.tgz "$OUT/"
exit $rc
