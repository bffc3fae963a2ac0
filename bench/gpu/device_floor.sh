#!/usr/bin/env bash
# Where the short-context floor of decode goes (issue 22: batch 1-8 at 1k-4k is slower than fp16
# by a fixed ~20 us): bench_cuda_attention at those shapes, eager and graph-replayed, with the
# plan's split count and forced ones, and ncu's duration of each kernel of a call (attention and
# merge), so that launch gaps and kernel time separate (`quick`: the replayed sweep only; `ncu`:
# the profiles only, with the attention kernel's warp stall reasons). Needs .devdeps/googletest
# (carried).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
[[ -x build/dev/bench_cuda_attention ]] || {
  device_configure -DKVARN_BUILD_BENCH=OFF
  cmake --build build/dev -j"$J" --target bench_cuda_attention >"$OUT/build.log" 2>&1 ||
    { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
}
B=build/dev/bench_cuda_attention
shapes=("1 1024" "1 4096" "8 1024" "1 32768") splits_list=(0 1 2 4 8) modes=("" "--graph")
# quick: graph-replayed only, fewer split counts, no ncu (a tail of device_last.sh).
[[ ${1:-} == quick ]] && shapes=("1 1024" "1 4096" "8 1024") splits_list=(0 1 4 8) modes=("--graph")
[[ ${1:-} == ncu ]] && shapes=()
for shape in "${shapes[@]}"; do
  for splits in "${splits_list[@]}"; do
    for mode in "${modes[@]}"; do
      echo "shape $shape splits $splits $mode: $($B --no-read-bw --shape $shape --splits $splits $mode 2>&1 | tail -1)"
    done
  done
done
[[ ${1:-} == quick ]] && exit 0
for shape in "1 1024" "1 4096"; do
  ncu --clock-control none --kernel-name regex:'Mma|Merge' --launch-skip 40 --launch-count 4 \
    --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active \
    $B --no-read-bw --shape $shape >"$OUT/ncu_floor_${shape// /_}.txt" 2>&1
  echo "== ncu $shape"
  grep -E "MmaAttention|MergeKernel|duration|grid_size" "$OUT/ncu_floor_${shape// /_}.txt" | sed -E 's/\(int\)//; s/ +/ /g' | cut -c1-160 | head -24
done
# Where the attention kernel's warps wait at B1 / 1k (the floor's largest part).
ncu --clock-control none --kernel-name regex:'Mma' --launch-skip 40 --launch-count 1 \
  --section WarpStateStats --section LaunchStats --section Occupancy --section SpeedOfLight \
  $B --no-read-bw --shape 1 1024 >"$OUT/ncu_floor_stalls.txt" 2>&1
echo "== ncu stalls 1 1024"
grep -E "Duration|Warp Cycles Per Issued|Stall|Achieved Occupancy|Registers Per|Memory Throughput|Grid Size" \
  "$OUT/ncu_floor_stalls.txt" | sed -E 's/ +/ /g' | head -30
ncu --clock-control none --kernel-name regex:'Mma' --launch-skip 40 --launch-count 1 \
  --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
  $B --no-read-bw --shape 1 1024 >"$OUT/ncu_floor_reasons.txt" 2>&1
echo "== stall reasons (warps per issue) 1 1024"
grep -E "stalled" "$OUT/ncu_floor_reasons.txt" | awk '{print $NF, $1}' | sort -rn | head -8
