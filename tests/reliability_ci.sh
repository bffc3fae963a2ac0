#!/usr/bin/env bash
# The reliability jobs of .ci/run (issue 15). What they cover, what they cost and what they
# found: docs/RELIABILITY.md.
#   1. ASan + UBSan (preset cpu-asan, GCC): the whole CPU suite except the labels slow (128k
#      contexts), style, neon (the qemu cross build), abi (install and header checks), simd
#      (SIMD-vs-scalar parity) and packaging (a wheel build), which the main job runs; with the
#      Python binding (the ASan runtime preloaded into the interpreter: the binding-lifetime
#      scenarios of issue 28 among its tests) when .ci/run's virtual environment exists.
#   2. TSan (preset cpu-tsan, GCC): the labels cache and reliability (the fault-injection test
#      with 2 threads only: the 1-thread variant takes 2.5 min under TSan and has no second
#      thread; the plan/run isolation suite of issue 28 on a 2-thread context) and the attention
#      tests that vary thread count and splits.
#   3. libFuzzer (preset fuzz, clang): each target (import, codec, cache_ops, paged_run) for
#      KVARN_FUZZ_SECONDS (environment, default 60) from its seed corpus; skipped with a message
#      when clang++ is missing.
# KVARN_CI_RELIABILITY=0 skips them all (a quick local run of .ci/run).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ "${KVARN_CI_RELIABILITY:-1}" == "0" ]]; then
  echo "reliability: KVARN_CI_RELIABILITY=0, skipped"
  exit 0
fi

step() { echo "== reliability: $* ($(date -u +%H:%M:%S))"; }
no_extras=(-DKVARN_BUILD_BENCH=OFF -DKVARN_BUILD_EXAMPLES=OFF)

step "ASan + UBSan, CPU suite"
python_args=()
if [[ -x build/ci-venv/bin/python ]]; then
  python_args=(-DKVARN_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$PWD/build/ci-venv/bin/python")
fi
cmake --preset cpu-asan "${no_extras[@]}" "${python_args[@]}"
cmake --build --preset cpu-asan
# The SIMD-vs-scalar parity suite (label simd) runs in the main job; under ASan it would be
# ~350 of ~620 s of test time for code the other CPU suites also reach.
ctest --preset cpu-asan -LE '^(slow|style|neon|abi|simd|packaging)$'

step "TSan, threaded suites"
cmake --preset cpu-tsan "${no_extras[@]}" -DKVARN_BUILD_TOOLS=OFF
cmake --build --preset cpu-tsan --target test_managed_cache test_concurrency test_reliability \
  test_fault_injection test_enum_ranges test_run_isolation kvarn_test_paged_attention \
  kvarn_test_paged_cache
ctest --preset cpu-tsan -L '^(cache|reliability)$' -E 'FaultInjection.*/1_threads'
ctest --preset cpu-tsan -R '^(AttentionDeterminism|AttentionSplits)\.'

step "libFuzzer targets"
if command -v clang++ >/dev/null 2>&1; then
  cmake --preset fuzz -DKVARN_FUZZ_SECONDS="${KVARN_FUZZ_SECONDS:-60}"
  cmake --build --preset fuzz
  ctest --preset fuzz
else
  echo "reliability: clang++ not found, fuzzers skipped (scripts/install-deps.sh installs clang)"
fi
step "done"
