#!/usr/bin/env bash
# Proves that an edit left the CUDA code generation of backends/gpu/*.cu unchanged, without a GPU.
#
#   scripts/check-cuda-unchanged.sh ref     # before the edit: compile, save PTX/cubin/fatbin as the reference
#   scripts/check-cuda-unchanged.sh check   # after it: compile again and compare with the reference
#
# Build dir: build/hip-cudaref (KVARN_ENABLE_CUDA=ON, CMAKE_CUDA_ARCHITECTURES="80;90"). Each .cu is
# compiled with the exact nvcc command of the kvarn target (from compile_commands.json) plus
# --keep, which leaves the PTX of compute_80/compute_90 and the sm_80/sm_90 cubins beside the
# object. Compared, per file and per architecture:
#   ptx      the PTX with the -lineinfo directives (.loc/.file lines, debug sections) removed:
#            must be identical (this is the code generation);
#   sass     every non-debug section of the cubin (the SASS of each kernel in .text.<kernel>,
#            constants, .nv.info, symbols), by name, size and sha256;
#   fatbin   the object's .nv_fatbin section as is. -lineinfo puts source line numbers in it, so it
#            differs whenever a line moves in a .cu/.cuh; reported, not a failure.
# Environment: KVARN_CUDAREF_DIR (default build/hip-cudaref), JOBS (default 2).
set -euo pipefail
mode=${1:-check}
root=$(cd "$(dirname "$0")/.." && pwd)
bdir=${KVARN_CUDAREF_DIR:-$root/build/hip-cudaref}
jobs=${JOBS:-2}
case $mode in ref | check) ;; *)
  echo "usage: $0 ref|check" >&2
  exit 2
  ;;
esac
out=$bdir/cuda-$mode
if [[ ! -f $bdir/compile_commands.json ]]; then
  cmake -S "$root" -B "$bdir" -G Ninja -DKVARN_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="80;90" \
    -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DKVARN_BUILD_BENCH=OFF -DKVARN_BUILD_EXAMPLES=OFF >/dev/null
fi
rm -rf "$out" && mkdir -p "$out"
# One shell command per .cu of the kvarn target, rewritten to keep intermediates in $out/<name>/.
python3 - "$bdir/compile_commands.json" "$root/backends/gpu" "$out" >"$out/commands.txt" <<'PY'
import json, os, shlex, sys
db, gpu, out = sys.argv[1:]
seen = set()
for e in json.load(open(db)):
    f = os.path.realpath(e["file"])
    if os.path.dirname(f) != os.path.realpath(gpu) or not f.endswith(".cu") or "/kvarn.dir/" not in e["command"]:
        continue
    name = os.path.basename(f)[:-3]
    if name in seen:
        continue
    seen.add(name)
    args = shlex.split(e["command"])
    o = args.index("-o")
    kd = os.path.join(out, name)
    args[o + 1] = os.path.join(kd, name + ".o")
    args += ["--keep", "--keep-dir", kd]
    print("mkdir -p %s && cd %s && %s" % (shlex.quote(kd), shlex.quote(e["directory"]), shlex.join(args)))
PY
echo "compiling $(wc -l <"$out/commands.txt") CUDA sources (-j$jobs) into $out"
start=$(date +%s)
tr '\n' '\0' <"$out/commands.txt" | xargs -0 -P "$jobs" -I{} bash -c '{}'
echo "compiled in $(($(date +%s) - start)) s"

strip_ptx() { grep -v -E '^[[:space:]]*\.(loc|file)[[:space:]]' "$1" | sed '/^[[:space:]]*\.section[[:space:]]*\.debug/,/^[[:space:]]*}/d'; }
# A cubin's sections except the debug ones (.debug_*, .nv_debug_*, their relocations), one line
# each: name, size, sha256 of the contents. The SASS is in .text.<kernel>.
cubin_code() {
  python3 - "$1" <<'PY'
import hashlib, struct, sys
d = open(sys.argv[1], "rb").read()
assert d[:4] == b"\x7fELF" and d[4] == 2, "64-bit ELF expected"
shoff, = struct.unpack_from("<Q", d, 0x28)
shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
secs = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
names = secs[shstrndx]
def name(off):
    s = names[4] + off
    return d[s:d.index(b"\0", s)].decode()
for sh in secs[1:]:
    n = name(sh[0])
    if "debug" in n:
        continue
    body = b"" if sh[1] == 8 else d[sh[4]:sh[4] + sh[5]]  # SHT_NOBITS has no contents
    print(n, sh[5], hashlib.sha256(body).hexdigest())
PY
}
# Recomputes the compared forms (.code) of one output tree from its raw PTX/cubin/objects.
normalize() {
  local d n
  for d in "$1"/*/; do
    n=$(basename "$d")
    for p in "$d"/*.ptx; do strip_ptx "$p" >"$p.code"; done
    for c in "$d"/*.cubin; do cubin_code "$c" >"$c.code"; done
    objcopy -O binary --only-section=.nv_fatbin "$d/$n.o" "$d/$n.fatbin"
  done
}
normalize "$out"
[[ $mode == ref ]] && {
  echo "reference saved in $out"
  exit 0
}

ref=$bdir/cuda-ref
normalize "$ref"
fail=0
for d in "$ref"/*/; do
  n=$(basename "$d")
  for p in "$d"/*.ptx.code "$d"/*.cubin.code; do
    b=$(basename "$p")
    kind=ptx && [[ $b == *.cubin.code ]] && kind=sass
    if [[ ! -f $out/$n/$b ]]; then
      echo "MISSING  $n/$b"
      fail=1
    elif cmp -s "$p" "$out/$n/$b"; then
      echo "same     $kind $n/${b%.code}"
    else
      echo "DIFFERS  $kind $n/${b%.code}"
      diff "$p" "$out/$n/$b" | head -20
      fail=1
    fi
  done
  if cmp -s "$d/$n.fatbin" "$out/$n/$n.fatbin"; then
    echo "same     fatbin $n.o .nv_fatbin"
  else
    echo "note     fatbin $n.o .nv_fatbin differs (line-number info from -lineinfo; code compared above)"
  fi
done
if ((fail)); then
  echo "CUDA code generation CHANGED"
  exit 1
fi
echo "CUDA code generation unchanged: PTX and SASS identical for sm_80 and sm_90 in every backends/gpu/*.cu"
