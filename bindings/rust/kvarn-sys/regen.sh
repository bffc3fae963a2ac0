#!/usr/bin/env bash
# Generates src/bindings.rs, the raw FFI of kvarn-sys, from capi/include/kvarn/kvarn.h and
# capi/include/kvarn/kvarn_experimental.h (bindgen reads the experimental header, which includes
# kvarn.h: kvarn.h's items come first, then the experimental ones, the KVARN_ABLATE_* flags and
# kvarn_baseline_roundtrip) with Debian's bindgen (apt package `bindgen`, 0.60). The output is
# committed.
#
#   bindings/rust/kvarn-sys/regen.sh           rewrite src/bindings.rs
#   bindings/rust/kvarn-sys/regen.sh --check   regenerate into a temporary file and fail (exit 1)
#                                              on any difference from the committed file
#                                              (CTest: rust.kvarn_sys.bindings_current)
#
# The flags make the output depend only on the declarations of the header: no doc comments (so
# comment edits in kvarn.h change nothing), only kvarn_* / KVARN_* items (plus the libc integer
# typedefs they use), enum constants without a prepended enum name, size_t as usize. The layout
# tests bindgen emits assume an LP64 target (x86-64, aarch64 Linux), the platforms libkvarn
# supports. The check compares the token stream with all whitespace (and the trailing commas
# rustfmt adds) removed, so the formatting
# of the committed file (rustfmt, when it was available) does not matter, only its content.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
# KVARN_INCLUDE_DIR: another include directory holding kvarn/kvarn.h and kvarn_experimental.h
# (e.g. the committed headers, exported while kvarn.h has uncommitted edits).
include_dir="${KVARN_INCLUDE_DIR:-$root/capi/include}"
header="$include_dir/kvarn/kvarn_experimental.h"
committed="$here/src/bindings.rs"
BINDGEN="${BINDGEN:-bindgen}"

mode=write
if [[ "${1:-}" == "--check" ]]; then
  mode=check
elif [[ $# -gt 0 ]]; then
  echo "usage: $0 [--check]" >&2
  exit 2
fi

if ! command -v "$BINDGEN" >/dev/null 2>&1; then
  echo "regen.sh: '$BINDGEN' not found (Debian: apt-get install bindgen)" >&2
  exit 2
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$BINDGEN" "$header" \
  --no-rustfmt-bindings \
  --no-doc-comments \
  --no-prepend-enum-name \
  --size_t-is-usize \
  --allowlist-function 'kvarn_.*' \
  --allowlist-type 'kvarn_.*' \
  --allowlist-var 'KVARN_.*' \
  -o "$tmp/raw.rs" \
  -- -I"$include_dir" -std=c99

# Formatting for readability only; the check ignores whitespace.
format() {
  if command -v rustfmt >/dev/null 2>&1 && rustfmt --edition 2021 <"$1" >"$2" 2>/dev/null; then
    return 0
  fi
  cp "$1" "$2"
}

if [[ "$mode" == "write" ]]; then
  format "$tmp/raw.rs" "$tmp/bindings.rs"
  cp "$tmp/bindings.rs" "$committed"
  echo "regen.sh: wrote $committed"
  exit 0
fi

if [[ ! -f "$committed" ]]; then
  echo "regen.sh: $committed is missing; run $0" >&2
  exit 1
fi
# Whitespace and the trailing commas rustfmt adds before a closing bracket are not content.
tokens() { tr -d ' \t\r\n' <"$1" | sed -e 's/,)/)/g' -e 's/,}/}/g' -e 's/,]/]/g'; }
if cmp -s <(tokens "$tmp/raw.rs") <(tokens "$committed"); then
  echo "regen.sh: src/bindings.rs matches the bindgen output for kvarn.h + kvarn_experimental.h"
  exit 0
fi
echo "regen.sh: src/bindings.rs differs from the bindgen output for kvarn.h +" \
  "kvarn_experimental.h:" >&2
format "$tmp/raw.rs" "$tmp/fresh.rs"
diff -u "$committed" "$tmp/fresh.rs" >&2 || true
echo "regen.sh: run bindings/rust/kvarn-sys/regen.sh and commit src/bindings.rs (and make sure" >&2
echo "          the safe crate bindings/rust/kvarn still builds against it)" >&2
exit 1
