#!/usr/bin/env bash
# Issue 25's bench rows on a GPU machine: gpt-oss window layers (D64, 64/8, sinks, window 128) and
# full layers (sinks), Gemma 3 window layers (D256, 16/8, window 1024): bench_cuda_attention
# --decode-grid with the variant, then sdpa_baseline.py --decode-grid over the keys it reads, in
# the same run; every line also appended to $OUT/variants.log.
#   bench/gpu/variant_rows.sh BUILD_DIR
set -uo pipefail
build=$1
OUT=${OUT:-/tmp/kvarn-out}
for row in "64 64 8 --window 128 --sinks|--window 128" "64 64 8 --sinks|" \
           "256 16 8 --window 1024|--window 1024"; do
  IFS='|' read -r args base <<<"$row"
  read -r d hq hk flags <<<"$args"
  "$build"/bench_cuda_attention --no-read-bw --decode-grid --head-dim "$d" --heads "$hq" "$hk" \
    $flags 2>&1 | tee -a "$OUT/variants.log" | tail -13
  python3 bench/gpu/sdpa_baseline.py --decode-grid --head-dim "$d" --heads "$hq" "$hk" $base \
    2>/dev/null | tee -a "$OUT/variants.log" | tail -13
done
