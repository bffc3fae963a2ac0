#!/usr/bin/env bash
# docs.readme_snippets: README.md's C, Python, Java and Rust code blocks are, byte for byte, the
# files of examples/readme/ that CTest builds and runs (example.readme.c, .python, .java, .rust),
# one block per language, so every snippet in the README is compiled or run by a test.
#
#   scripts/check-readme-snippets.sh [source dir]
set -euo pipefail

root=${1:-$(dirname "${BASH_SOURCE[0]}")/..}
readme=$root/README.md
declare -A file=([c]=start.c [python]=start.py [java]=Start.java [rust]=start.rs)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Each fenced block of a checked language into $work/<language>.<n>.
awk -v dir="$work" '
  /^```/ && !in_block { lang = substr($0, 4); in_block = 1; n[lang]++;
                        out = dir "/" lang "." n[lang]; printf "" > out; next }
  /^```/ && in_block  { in_block = 0; close(out); next }
  in_block            { print > out }
' "$readme"

status=0
for lang in c python java rust; do
  blocks=("$work/$lang".*)
  expected=$root/examples/readme/${file[$lang]}
  if [[ ! -e "${blocks[0]}" ]]; then
    echo "README.md has no \`\`\`$lang block (expected examples/readme/${file[$lang]})"
    status=1
  elif ((${#blocks[@]} > 1)); then
    echo "README.md has ${#blocks[@]} \`\`\`$lang blocks; one, examples/readme/${file[$lang]}, is tested"
    status=1
  elif ! diff -u "$expected" "${blocks[0]}"; then
    echo "README.md's \`\`\`$lang block differs from examples/readme/${file[$lang]} (above)"
    status=1
  else
    echo "README.md \`\`\`$lang block == examples/readme/${file[$lang]}"
  fi
done
exit $status
