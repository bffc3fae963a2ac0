#!/usr/bin/env bash
# The repository's documents are self-contained (issue 16): no tracked file may point a reader at
# design files that live outside the repository. The normative algorithm and byte format are in
# docs/FORMAT.md (cite "docs/FORMAT.md section N"); measured targets are in bench/RESULTS.md.
#
#   scripts/check-doc-references.sh [repository directory]     (default: this script's repository)
#
# Exit status: 0 clean, 1 references found (each printed as path:line:text), 77 not a git work
# tree or no git (nothing to check; CTest reports the test as skipped).
set -uo pipefail

repo="${1:-$(dirname "${BASH_SOURCE[0]}")/..}"

if ! command -v git >/dev/null 2>&1; then
  echo "check-doc-references: git not found, nothing checked"
  exit 77
fi
# A checkout owned by another user (CI containers) is still read: it is only grepped.
g() { git -c safe.directory='*' "$@"; }
if ! g -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "check-doc-references: $repo is not a git work tree, nothing checked"
  exit 77
fi
top="$(g -C "$repo" rev-parse --show-toplevel)"

# The names are assembled from pieces so that this script does not match its own pattern.
ext='\.md'
names='ALGORITHM|TARGETS|ARCHITECTURE|STYLE'
up='\.\./'
pattern="(${names})${ext}|${up}shar""ed"

# git grep reads the work-tree content of tracked files only; build trees are excluded.
g -C "$top" grep -n -I -E "$pattern" -- . ':(exclude,glob)**/build/**'
rc=$?
if ((rc == 1)); then
  echo "check-doc-references: no tracked file refers to design files outside the repository"
  exit 0
fi
if ((rc == 0)); then
  echo "check-doc-references: the lines above refer to files outside the repository; cite" \
    "docs/FORMAT.md sections (algorithm, byte format) or bench/RESULTS.md (targets) instead" >&2
  exit 1
fi
echo "check-doc-references: git grep failed (status $rc)" >&2
exit 2
