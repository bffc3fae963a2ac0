#!/usr/bin/env bash
# The README's first command: build libkvarn and kvarn-selftest (preset selftest: CPU, Release,
# nothing else) and run the selftest, which reports what works on this machine and how fast.
# Installs only what that needs (a C/C++ compiler, CMake, Ninja) when missing on Debian; the test
# suites, bindings and their toolchains are .ci/run's. Prints each command and its time.
#
#   scripts/selftest.sh [kvarn-selftest options]     (default: --quick)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

start=$SECONDS
# run <command...>: prints the command, runs it, prints how long it took.
run() {
  local t0=$SECONDS
  printf '+ %s\n' "$*"
  "$@"
  printf 'selftest.sh: %ds for: %s\n' $((SECONDS - t0)) "$*"
}

run scripts/install-deps.sh --minimal
# The presets use Ninja; without it (not Debian, no apt-get) Make does the same build.
generator=()
if ! command -v ninja >/dev/null 2>&1; then
  generator=(-G "Unix Makefiles")
fi
run cmake --preset selftest "${generator[@]}"
run cmake --build --preset selftest --parallel "$(nproc 2>/dev/null || echo 2)"

selftest=build/selftest/tools/kvarn-selftest/kvarn-selftest
if [[ ! -x "$selftest" ]]; then
  echo "selftest.sh: $selftest was not built" >&2
  exit 1
fi
if (($# == 0)); then
  set -- --quick
fi
status=0
run "$selftest" "$@" || status=$?
printf 'selftest.sh: %ds in all, exit status %d\n' $((SECONDS - start)) "$status"
exit "$status"
