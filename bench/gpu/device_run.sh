#!/usr/bin/env bash
# One call on the lent H200: build the CUDA backend, run the GPU suites, benchmark, print a table.
#   bench/gpu/device_run.sh [all | test,python,bench,grid,step,sanitize,profile (any of them)] [ctest -R regex]
# Needs googletest sources in .devdeps/googletest (carried; Debian's /usr/src/googletest); the
# python mode also needs .devdeps/swig (swig binary + its lib), .devdeps/wheels (pytest
# and its deps) and .devdeps/austen-d128 (the model): see bench/gpu/README or the session notes.
# Logs and CSVs go to $OUT (the device tool brings them back). Environment knobs:
# KVARN_SANITIZE_CODEC_TOOLS (the compute-sanitizer tools run on the codec suite; default all
# three), KVARN_PROFILE=extend (profile the extend kernel only), KVARN_NCU_EXTRA (more ncu sections for the profile, e.g. "--section SourceCounters").
set -uo pipefail
mode=${1:-all}
filter=${2:-}
source "$(dirname "${BASH_SOURCE[0]}")/device_common.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"

py_args=()
if [[ $mode == *python* || $mode == all ]]; then
  # The Python binding needs SWIG (carried: .devdeps/swig) and pytest/ml_dtypes (carried wheels).
  export SWIG_LIB=$PWD/.devdeps/swig/share PATH=$PWD/.devdeps/swig/bin:$PATH
  # A swig binary copied from Debian 12 carries its libpcre2 in .devdeps/swig/lib.
  [[ -d .devdeps/swig/lib ]] && export LD_LIBRARY_PATH=$PWD/.devdeps/swig/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  py_args=(-DKVARN_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$(command -v python3)"
           -DSWIG_EXECUTABLE="$PWD/.devdeps/swig/bin/swig")
  python3 -m pip install -q --no-index --find-links .devdeps/wheels --target /tmp/pylib \
    pytest >"$OUT/pip.log" 2>&1 || tail -5 "$OUT/pip.log"
  export PYTHONPATH=/tmp/pylib${PYTHONPATH:+:$PYTHONPATH}
  python3 -c "import sys, numpy, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__)"
fi
device_configure -DKVARN_BUILD_BENCH=OFF "${py_args[@]}"
cmake --build build/dev -j"$J" >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

summary=()
if [[ $mode == *test* || $mode == all ]]; then
  args=(-L gpu -j2 --timeout 300)
  [[ -n $filter ]] && args+=(-R "$filter")
  ctest --test-dir build/dev "${args[@]}" --output-on-failure >"$OUT/ctest_gpu.log" 2>&1
  rc=$?
  grep -E "tests passed|Failed|\*\*\*|SKIPPED" "$OUT/ctest_gpu.log" | grep -v "^\s*$" | tail -25
  summary+=("gpu ctest rc=$rc: $(grep 'tests passed' "$OUT/ctest_gpu.log")")
  # The general attention kernel on the shapes the tensor-core kernel normally takes.
  KVARN_CUDA_ATTENTION=generic build/dev/tests/kvarn_test_cuda_attention --gtest_brief=1 \
    >"$OUT/attention_generic.log" 2>&1
  summary+=("attention (generic kernel forced) rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/attention_generic.log" | tr '\n' ' ')")
  # The tensor-core kernel with the sm_80 cp.async ring instead of sm_90 bulk copies.
  KVARN_CUDA_RING=cpasync build/dev/tests/kvarn_test_cuda_attention --gtest_brief=1 \
    >"$OUT/attention_cpasync.log" 2>&1
  summary+=("attention (cp.async ring forced) rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/attention_cpasync.log" | tr '\n' ' ')")
  # Extend batches on the decode kernels instead of the tensor-core extend kernel.
  KVARN_CUDA_EXTEND=off build/dev/tests/kvarn_test_cuda_attention --gtest_brief=1 \
    >"$OUT/attention_extend_off.log" 2>&1
  summary+=("attention (extend kernel off) rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/attention_extend_off.log" | tr '\n' ' ')")
  grep -E "Failure|Expected|Which is|actual|error" "$OUT/ctest_gpu.log" | head -30
  build/dev/tools/kvarn-selftest/kvarn-selftest --backend cuda >"$OUT/selftest_cuda.log" 2>&1
  summary+=("selftest cuda rc=$?: $(tail -1 "$OUT/selftest_cuda.log")")
fi
if [[ $mode == *python* || $mode == all ]]; then
  ctest --test-dir build/dev -L python -j4 --timeout 300 --output-on-failure >"$OUT/ctest_python.log" 2>&1
  rc=$?
  grep -E "tests passed|Failed|\*\*\*|Skipped" "$OUT/ctest_python.log" | tail -15
  summary+=("python ctest rc=$rc: $(grep 'tests passed' "$OUT/ctest_python.log")")
  pypath=build/dev/bindings/python
  export PYTHONPATH=$pypath:$PYTHONPATH
  python3 -m pytest -q -p no:cacheprovider -rs tests/python/test_gpu.py >"$OUT/pytest_gpu.log" 2>&1
  summary+=("pytest test_gpu.py rc=$?: $(tail -1 "$OUT/pytest_gpu.log")")
  [[ -n ${SKIP_EXAMPLES:-} ]] || timeout 150 python3 examples/multigpu/tp_attention.py --model .devdeps/austen-d128 \
    --windows 4 --new-tokens 96 2>&1 | grep -v Warning | tee "$OUT/tp_attention.txt" | tail -4
  summary+=("tp_attention rc=${PIPESTATUS[0]}: $(tail -1 "$OUT/tp_attention.txt")")
  [[ -n ${SKIP_EXAMPLES:-} ]] || timeout ${HF_TIMEOUT:-240} python3 examples/python/hf_cache.py --device cuda \
    --model .devdeps/austen-d128 ${HF_ARGS:-} 2>&1 | grep -v Warning | tee "$OUT/hf_cache_cuda.txt" | tail -14
  summary+=("hf_cache cuda rc=${PIPESTATUS[0]}")
  # Decode latency with the pointer checks in place (compare bench/RESULTS.md run 5).
  for shape in "1 32768" "32 32768"; do build/dev/bench_cuda_attention --shape $shape 2>&1 | tail -3; done
fi
if [[ $mode == *sanitize* || $mode == all ]]; then
  # The tensor-core kernel with both ring paths (bulk copies, cp.async), G 128 and 64.
  attn_filter='*k4v2_g128_decode*:*k4v2_g128_extend*:*k4v2_g64_*:*ring_one_split*:*gqa7*:*Errors*:*extend_fp16io*:*extend_bf16io*'
  for tool in memcheck racecheck synccheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 \
      build/dev/tests/kvarn_test_cuda_attention --gtest_filter="$attn_filter" \
      >"$OUT/sanitize_${tool}_attention.log" 2>&1
    summary+=("compute-sanitizer $tool attention rc=$?: $(grep -E 'SUMMARY' "$OUT/sanitize_${tool}_attention.log" | tail -1)")
    KVARN_CUDA_RING=cpasync compute-sanitizer --tool $tool --error-exitcode 9 \
      build/dev/tests/kvarn_test_cuda_attention --gtest_filter="$attn_filter" \
      >"$OUT/sanitize_${tool}_attention_cpasync.log" 2>&1
    summary+=("compute-sanitizer $tool attention (cp.async ring) rc=$?: $(grep -E 'SUMMARY' "$OUT/sanitize_${tool}_attention_cpasync.log" | tail -1)")
    # The capturable layer 2: append by slot, device-list flush, planned attention, faults.
    compute-sanitizer --tool $tool --error-exitcode 9 build/dev/tests/kvarn_test_paged_run \
      --gtest_filter='*cuda*' >"$OUT/sanitize_${tool}_paged_run.log" 2>&1
    summary+=("compute-sanitizer $tool paged_run rc=$?: $(grep -E 'SUMMARY' "$OUT/sanitize_${tool}_paged_run.log" | tail -1)")
    if [[ $tool == memcheck && -x build/dev/tests/kvarn_test_cuda_graph ]]; then
      compute-sanitizer --tool memcheck --error-exitcode 9 build/dev/tests/kvarn_test_cuda_graph \
        >"$OUT/sanitize_memcheck_cuda_graph.log" 2>&1
      summary+=("compute-sanitizer memcheck cuda_graph rc=$?: $(grep -E 'SUMMARY' "$OUT/sanitize_memcheck_cuda_graph.log" | tail -1)")
    fi
    # KVARN_SANITIZE_CODEC_TOOLS (default all three) limits the codec suite's tools: its
    # racecheck takes ~100 s of device time.
    if [[ -x build/dev/tests/kvarn_test_cuda_codec && " ${KVARN_SANITIZE_CODEC_TOOLS:-memcheck racecheck synccheck} " == *" $tool "* ]]; then
      compute-sanitizer --tool $tool --error-exitcode 9 build/dev/tests/kvarn_test_cuda_codec \
        --gtest_filter='*g128*:*Error*:*rror*' >"$OUT/sanitize_${tool}_codec.log" 2>&1
      summary+=("compute-sanitizer $tool codec rc=$?: $(grep -E 'SUMMARY' "$OUT/sanitize_${tool}_codec.log" | tail -1)")
    fi
  done
fi
if [[ $mode == *bench* || $mode == all ]]; then
  build/dev/bench_cuda_attention --csv "$OUT/kvarn_attention.csv" | tee "$OUT/bench_attention.txt"
  python3 bench/gpu/sdpa_baseline.py --csv "$OUT/sdpa.csv" 2>"$OUT/sdpa.err" | tee "$OUT/bench_sdpa.txt"
  [[ -x build/dev/bench/gpu/kvarn-bench-cuda-codec ]] &&
    build/dev/bench/gpu/kvarn-bench-cuda-codec | tee "$OUT/bench_codec.txt"
fi
if [[ $mode == *grid* || $mode == all ]]; then
  # Decode over every preset and head dim row against fp16 SDPA (bench/gpu/decode_grid.sh).
  bench/gpu/decode_grid.sh build/dev "$OUT" | tee "$OUT/grid_table.md"
fi
if [[ $mode == *step* || $mode == *bench* || $mode == all ]]; then
  # A whole decode step (32 layers of append + flush + attention), eager against a graph replay.
  build/dev/bench_decode_step 2>&1 | tee "$OUT/bench_decode_step.txt"
  summary+=("decode step rc=${PIPESTATUS[0]}: $(grep -E '^(eager|graph)' "$OUT/bench_decode_step.txt" | tr -s ' ' | tr '\n' ';')")
fi
if [[ ($mode == *profile* || $mode == all) && ${KVARN_PROFILE:-all} != extend ]]; then
  # What limits decode attention at B=32, 32k: one launch of the tensor-core kernel under ncu.
  ncu --clock-control none --kernel-name regex:MmaAttention --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats ${KVARN_NCU_EXTRA:-} \
    build/dev/bench_cuda_attention --shape 32 32768 >"$OUT/ncu_decode.txt" 2>&1
  summary+=("ncu rc=$?")
  # Batch 1: the split merge and the launch gaps matter there.
  nsys_like=$(ncu --clock-control none --kernel-name regex:"MmaAttention|MergeKernel" --launch-skip 6 \
    --launch-count 2 --section SpeedOfLight build/dev/bench_cuda_attention --shape 1 32768 2>&1 |
    grep -E "MmaAttention|MergeKernel|Duration" | tr -s ' ' | tr '\n' ';')
  summary+=("ncu batch 1: $nsys_like")
  grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Issue Slot|No Eligible|Stall|Warp Cycles Per Issued|Theoretical Occupancy|L2 Hit" \
    "$OUT/ncu_decode.txt" | head -30
fi
if [[ $mode == *profile* || $mode == all ]]; then
  # Extend (2048 new tokens over 32k): the tensor-core extend kernel.
  ncu --clock-control none --kernel-name regex:ExtendAttention --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis ${KVARN_NCU_EXTRA:-} \
    build/dev/bench_cuda_attention --shape 1 34816 2048 >"$OUT/ncu_extend.txt" 2>&1
  summary+=("ncu extend rc=$?")
  grep -E "Duration|Compute \(SM\)|Achieved Occupancy|Registers Per|Issue Slot|No Eligible|Stall|Warp Cycles Per Issued|Theoretical Occupancy|Tensor|Pipe" \
    "$OUT/ncu_extend.txt" | head -30
fi
if [[ -f "$OUT/kvarn_attention.csv" && -f "$OUT/sdpa.csv" ]]; then
  python3 bench/gpu/report.py "$OUT/kvarn_attention.csv" "$OUT/sdpa.csv" | tee "$OUT/table.md"
fi
echo "---- summary ($(( $(date +%s) - t0 )) s) ----"
printf '%s\n' "${summary[@]}"
# Few files come back from a device run: pack the logs and CSVs into one archive.
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.log ./*.csv ./*.err ./*.txt 2>/dev/null)
