# Sourced by the bench/gpu/device_*.sh calls. Sets OUT (the device tool's folder, else
# /tmp/kvarn-out), J (cores) and t0 (the start); device_configure installs googletest from
# .devdeps/googletest (carried) into /tmp/gt once per machine and configures build/dev for sm_90
# with it, plus any cmake arguments given.
OUT=${OUT:-/tmp/kvarn-out}
mkdir -p "$OUT"
J=$(nproc)
t0=$(date +%s)

device_configure() {
  if [[ ! -f /tmp/gt/lib/cmake/GTest/GTestConfig.cmake ]]; then
    { cmake -S .devdeps/googletest -B /tmp/gt-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX=/tmp/gt && cmake --build /tmp/gt-build -j"$J" &&
        cmake --install /tmp/gt-build; } >"$OUT/gtest.log" 2>&1 || { tail -20 "$OUT/gtest.log"; exit 1; }
  fi
  cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVARN_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH=/tmp/gt "$@" >"$OUT/configure.log" 2>&1 ||
    { tail -30 "$OUT/configure.log"; exit 1; }
}
