#!/usr/bin/env bash
# Installs the Debian 12 packages libkvarn's build and tests need, only those missing.
#
#   scripts/install-deps.sh [extra-package ...]
#   scripts/install-deps.sh --minimal      only what the library and kvarn-selftest need
#
# Used by .ci/run and (--minimal) scripts/selftest.sh. Uses sudo only when not root. Set
# KVARN_SKIP_DEPS=1 to skip it (for example on a machine that is not Debian-based).
set -euo pipefail

if [[ "${KVARN_SKIP_DEPS:-0}" == "1" ]]; then
  echo "install-deps: KVARN_SKIP_DEPS=1, not checking packages"
  exit 0
fi

# The library and kvarn-selftest (preset selftest): a compiler, CMake and Ninja.
minimal=(build-essential cmake ninja-build)
# The whole build and test toolchain (keep in sync with docs/BUILDING.md).
full=(
  "${minimal[@]}"
  pkg-config
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  g++-aarch64-linux-gnu
  qemu-user
  python3
  python3-venv
  python3-dev
  swig
  bindgen
  default-jdk-headless
  junit5
  clang
  libclang-rt-14-dev
  # ROCm backend (issue 14, preset hip): Debian 12's ROCm 5.2 HIP runtime and device libraries,
  # and the clang-15 that hipcc drives (the preset compiles with it).
  hipcc
  libamdhip64-dev
  rocm-device-libs
  clang-15
)
# Rust bindings (KVARN_BUILD_RUST): Debian's cargo and rustc only when no cargo is on PATH
# already (a rustup toolchain is kept); bindgen above regenerates kvarn-sys for its check.
if ! command -v cargo >/dev/null 2>&1; then
  full+=(cargo rustc)
fi
if [[ "${1:-}" == "--minimal" ]]; then
  shift
  packages=("${minimal[@]}")
else
  packages=("${full[@]}")
fi
packages+=("$@")

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-deps: dpkg-query not found (not a Debian-based system); install these yourself:" >&2
  echo "  ${packages[*]}" >&2
  exit 0
fi

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo_cmd=()
if [[ "$(id -u)" != "0" ]]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo_cmd=(sudo)
  else
    echo "install-deps: missing ${missing[*]}, and not root and no sudo to install them" >&2
    exit 1
  fi
fi

echo "install-deps: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends "${missing[@]}"
