#!/usr/bin/env bash
# The README's main job: build libkvarn (preset cpu) and run kvarn-selftest, which reports what
# works on this machine and how fast.
#
#   scripts/selftest.sh [kvarn-selftest options]     (default: --quick)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/install-deps.sh

cmake --preset cpu
cmake --build --preset cpu

selftest=build/cpu/tools/kvarn-selftest/kvarn-selftest
if [[ ! -x "$selftest" ]]; then
  echo "selftest.sh: $selftest was not built (is KVARN_BUILD_TOOLS on?)" >&2
  exit 1
fi
if (($# == 0)); then
  set -- --quick
fi
exec "$selftest" "$@"
