#!/usr/bin/env bash
# Cross-builds libkvarn for aarch64 (NEON kernels) with Debian's cross compiler and runs the CPU
# parity suites under qemu-aarch64: NEON against the scalar reference (byte-identical records,
# attention within tolerance), the golden records and the codec unit tests.
#
#   scripts/neon-qemu-test.sh [build-dir]      (default: build/neon)
#
# Needs g++-aarch64-linux-gnu and qemu-user (scripts/install-deps.sh installs them) and the
# GoogleTest sources of libgtest-dev (/usr/src/googletest), which it cross-builds once.
# Exits 77 (CTest: skipped) when a tool is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
build=$(realpath -m "${1:-build/neon}")
jobs=${KVARN_NEON_JOBS:-2}

for tool in aarch64-linux-gnu-g++ qemu-aarch64 cmake; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "neon-qemu-test: $tool not found; skipping (apt-get install g++-aarch64-linux-gnu qemu-user)"
    exit 77
  fi
done
if [[ ! -f /usr/src/googletest/CMakeLists.txt ]]; then
  echo "neon-qemu-test: /usr/src/googletest not found; skipping (apt-get install libgtest-dev)"
  exit 77
fi
toolchain=$root/cmake/toolchains/aarch64-linux-gnu.cmake
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)

# GoogleTest for aarch64, from Debian's sources (no download).
gtest=$build/gtest
if [[ ! -f $gtest/install/lib/cmake/GTest/GTestConfig.cmake ]]; then
  cmake -S /usr/src/googletest -B "$gtest/build" "${gen[@]}" -DCMAKE_TOOLCHAIN_FILE="$toolchain" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$gtest/install" >/dev/null
  cmake --build "$gtest/build" -j "$jobs" >/dev/null
  cmake --install "$gtest/build" >/dev/null
fi

cmake -S "$root" -B "$build/kvarn" "${gen[@]}" -DCMAKE_TOOLCHAIN_FILE="$toolchain" \
  -DCMAKE_BUILD_TYPE=Release -DKVARN_WERROR=ON -DKVARN_BUILD_BENCH=OFF \
  -DKVARN_BUILD_EXAMPLES=OFF -DKVARN_BUILD_TOOLS=OFF -DCMAKE_FIND_ROOT_PATH="$gtest/install" >/dev/null
targets=(kvarn_test_simd_parity kvarn_test_golden kvarn_test_format kvarn_test_rtn_pack)
cmake --build "$build/kvarn" -j "$jobs" --target "${targets[@]}"

emu=(qemu-aarch64 -L /usr/aarch64-linux-gnu)
# Under emulation (~10-50x slower than native) the parity suite runs its NEON cases for every
# preset at D128 (and one at D64), the edge-case tests, and attention for three presets and GQA 7;
# the other suites run whole. (test_cpu_isa is x86-centric: its cap check expects an AVX-512 cap
# to admit the best ISA, which the cap rule does not do on Arm.)
parity_filter='*QuantizeParity*neon_*_D128:*QuantizeParity*neon_k4v2_g64_D64:*SimdLevel*neon'
parity_filter+=':*PagedParity*neon_k4v2_g128_D128_*:*PagedParity*neon_k2v2_g128_D128_extend'
parity_filter+=':*PagedParity*neon_k8v8_g128_D128_decode:*PagedParity*neon_gqa7_extend'
status=0
for t in "${targets[@]}"; do
  exe=$build/kvarn/tests/$t
  [[ -x $exe ]] || { echo "neon-qemu-test: $exe was not built"; status=1; continue; }
  filter='-*avx2*:*avx512*'  # the x86 levels skip on Arm anyway
  [[ $t == kvarn_test_simd_parity ]] && filter=$parity_filter
  start=$SECONDS
  if "${emu[@]}" "$exe" --gtest_filter="$filter" >"$build/$t.log" 2>&1; then
    echo "PASS $t (qemu-aarch64, $((SECONDS - start)) s): $(grep -E '^\[  PASSED' "$build/$t.log")"
  else
    echo "FAIL $t (qemu-aarch64):"
    tail -40 "$build/$t.log"
    status=1
  fi
  # The NEON level must really have run, not skipped on a build or detection problem.
  if [[ $t == kvarn_test_simd_parity ]] && grep -q SKIPPED "$build/$t.log"; then
    echo "FAIL: NEON parity cases were skipped:"
    grep SKIPPED "$build/$t.log" | head
    status=1
  fi
done
exit $status
