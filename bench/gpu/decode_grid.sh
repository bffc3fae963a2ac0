#!/usr/bin/env bash
# The decode grid of bench/RESULTS.md on a GPU machine: for each (preset, head dim, query/KV
# heads) row, bench_cuda_attention --decode-grid and sdpa_baseline.py --decode-grid with the same
# options in the same run, joined by report.py into one table.
#   bench/gpu/decode_grid.sh BUILD_DIR OUT_DIR ["preset D HQ HK" ...]
# GRAPH=1: both sides replay one call per CUDA graph launch (--graph), as an engine's step does.
set -uo pipefail
build=$1
out=$2
shift 2
rows=("$@")
if [[ ${#rows[@]} -eq 0 ]]; then
  rows=("k4v2_g128 128 32 8" "k4v4_g128 128 32 8" "k8v8_g128 128 32 8" "k2v2_g128 128 32 8"
        "k4v2_g128 64 64 8" "k4v2_g128 256 16 8" "k4v4_g128 64 64 8" "k4v4_g128 256 16 8"
        "k4v2_g128 512 16 8")
fi
mkdir -p "$out"
kv_csv=$out/grid_kvarn.csv
sd_csv=$out/grid_sdpa.csv
: >"$kv_csv"
: >"$sd_csv"
for row in "${rows[@]}"; do
  read -r preset d hq hk <<<"$row"
  graph=()
  [[ ${GRAPH:-0} == 1 ]] && graph=(--graph)
  "$build"/bench_cuda_attention --decode-grid --no-read-bw "${graph[@]}" --preset "$preset" --head-dim "$d" \
    --heads "$hq" "$hk" --csv "$out/k.csv" >"$out/grid_${preset}_d${d}.txt" 2>&1 ||
    { echo "bench $row failed"; tail -3 "$out/grid_${preset}_d${d}.txt"; continue; }
  # One fp16 baseline per (D, heads): the preset does not change it.
  if ! grep -q "^$d,$hq,$hk," "$sd_csv" 2>/dev/null; then
    python3 bench/gpu/sdpa_baseline.py --decode-grid "${graph[@]}" --head-dim "$d" --heads "$hq" "$hk" \
      ${SDPA_ARGS:-} --csv "$out/s.csv" >"$out/grid_sdpa_d${d}.txt" 2>&1 ||
      echo "sdpa $row failed: $(tail -2 "$out/grid_sdpa_d${d}.txt")"
    if [[ -s $sd_csv ]]; then tail -n +2 "$out/s.csv" >>"$sd_csv"; else cat "$out/s.csv" >>"$sd_csv"; fi
  fi
  if [[ -s $kv_csv ]]; then tail -n +2 "$out/k.csv" >>"$kv_csv"; else cat "$out/k.csv" >>"$kv_csv"; fi
done
python3 bench/gpu/report.py "$kv_csv" "$sd_csv"
