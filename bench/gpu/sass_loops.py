#!/usr/bin/env python3
"""Instruction counts of the tensor-core attention kernel's loops, from its SASS, without a GPU.

The decode kernel is bound by how many warp instructions it issues per record (bench/RESULTS.md,
sessions 4 and 5), so every change to backends/gpu/attention_mma.cuh is weighed here first:

  bench/gpu/sass_loops.py                      # sm_90, the D128 decode family's kernels
  bench/gpu/sass_loops.py --unmasked-path      # the record loop as decode runs it (see below)
  bench/gpu/sass_loops.py --kernel 'ShapeILi128ELi128ELi4ELi2ELi128E'   # one member: k4v2_g128
  bench/gpu/sass_loops.py --file attention_mma_d256.cu                  # another head dim
  bench/gpu/sass_loops.py --file attention_kernels.cu --kernel ExtendAttentionKernel
  git worktree add /tmp/old d9d4fb2 && bench/gpu/sass_loops.py --source /tmp/old   # another commit

It compiles one translation unit of backends/gpu/ (--file; the decode family has one per head
dim, attention_mma_d<D>.cu) to a cubin with nvcc (-O3, the library's defines,
ptxas -v for registers and spills), disassembles it with cuobjdump and prints, per kernel, every
loop (a backward branch) of more than --min instructions with its opcode histogram. The record
loop is the largest one; its count is per record (one warp takes a whole record).

--unmasked-path: RecordTile holds two copies of the softmax (masked for tiles that reach past a
query row's limit, unmasked below every row's limit, which is every record tile of a decode
step). The static loop contains both; this option compiles a temporary copy of the sources with
the masked branch disabled, so the loop holds exactly the instructions a decode record executes.

Needs nvcc (CUDA 12.8+ for sm_90 bulk copies; $CUDACXX or /usr/local/cuda/bin/nvcc) and
cuobjdump with the nvdisasm it runs for -sass: $CUOBJDUMP (nvdisasm beside it or on PATH), PATH,
or a virtual environment this script creates under build/sass-venv with PyPI's
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels (the first run downloads them).
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MASK_BRANCH = "  if (key0 + G > lim_min) {"


def find_nvcc():
    for c in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if c and os.path.exists(c):
            return c
    sys.exit("sass_loops: nvcc not found (set CUDACXX)")


def find_cuobjdump():
    for c in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")):
        if c and os.path.exists(c):
            return c
    venv = os.path.join(ROOT, "build", "sass-venv")
    lib = os.path.join(venv, "lib")

    def installed():
        return [os.path.join(d, "cuobjdump") for d, _, fs in os.walk(lib)
                if "cuobjdump" in fs and "nvdisasm" in fs]

    if not installed():
        print("sass_loops: installing cuobjdump and nvdisasm (PyPI) into build/sass-venv",
              file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "nvidia-cuda-cuobjdump",
                        "nvidia-cuda-nvdisasm"], check=True)
    found = installed()
    if not found:
        sys.exit("sass_loops: no cuobjdump with nvdisasm beside it (set CUOBJDUMP)")
    return found[0]


def compile_cubin(nvcc, src_root, arch, out, source_file):
    # The kvarn target's flags for this file (CMakeLists.txt), without -lineinfo.
    cmd = [nvcc, "-DKVARN_BUILDING_LIBRARY", "-DKVARN_WITH_CUDA=1",
           "-I" + os.path.join(src_root, "capi", "include"), "-I" + src_root, "-O3", "-DNDEBUG",
           "-arch=" + arch, "--expt-relaxed-constexpr", "-std=c++17", "-Xptxas", "-v", "-cubin",
           "-x", "cu", os.path.join(src_root, "backends", "gpu", source_file), "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("sass_loops: nvcc failed\n" + r.stderr[-4000:])
    return r.stderr


def resources(ptxas_log, kernel):
    """kernel name fragment -> (registers, spill stores, spill loads) per instantiation."""
    out = {}
    name = None
    spill = (0, 0)
    for line in ptxas_log.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            spill = (int(m.group(1)), int(m.group(2)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name and kernel in name:
            out[name] = (int(m.group(1)),) + spill
    return out


def loops(sass, kernel, min_len):
    for func in re.split(r"\n\s+Function : ", sass)[1:]:
        name = func.split("\n")[0].strip()
        if kernel not in name:
            continue
        ins = []
        for line in func.split("\n"):
            m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
            if m:
                ins.append((int(m.group(1), 16), m.group(2).strip()))
        at = {a: i for i, (a, _) in enumerate(ins)}
        found = []
        for i, (a, text) in enumerate(ins):
            if "BRA" not in text:
                continue
            m = re.search(r"0x([0-9a-f]+)", text)
            if not m:
                continue
            target = int(m.group(1), 16)
            if target < a and target in at and i - at[target] + 1 >= min_len:
                body = ins[at[target]:i + 1]
                ops = collections.Counter(t.split()[1] if t.startswith("@") else t.split()[0]
                                          for _, t in body)
                found.append((target, a, len(body), ops))
        yield name, len(ins), found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--kernel", default="MmaAttentionKernel", help="substring of the mangled name")
    ap.add_argument("--min", type=int, default=500, help="smallest loop to list (instructions)")
    ap.add_argument("--top", type=int, default=12, help="opcodes per loop")
    ap.add_argument("--unmasked-path", action="store_true")
    ap.add_argument("--source", default=ROOT, help="the source tree to compile (default: this one)")
    ap.add_argument("--file", default="attention_mma_d128.cu",
                    help="the backends/gpu/ translation unit to compile")
    args = ap.parse_args()
    nvcc, cuobjdump = find_nvcc(), find_cuobjdump()
    with tempfile.TemporaryDirectory() as tmp:
        src_root = os.path.abspath(args.source)
        if args.unmasked_path:
            copy = os.path.join(tmp, "src")
            for d in ("capi", "backends", "core"):
                if os.path.isdir(os.path.join(src_root, d)):
                    shutil.copytree(os.path.join(src_root, d), os.path.join(copy, d))
            src_root = copy
            path = os.path.join(src_root, "backends", "gpu", "attention_mma.cuh")
            text = open(path).read()
            if text.count(MASK_BRANCH) != 1:
                sys.exit("sass_loops: the masked-softmax branch of RecordTile was not found")
            open(path, "w").write(text.replace(MASK_BRANCH, "  if (false && key0 + G > lim_min) {"))
        cubin = os.path.join(tmp, "attention.cubin")
        log = compile_cubin(nvcc, src_root, args.arch, cubin, args.file)
        env = dict(os.environ)  # cuobjdump -sass runs nvdisasm: the one beside it first
        env["PATH"] = os.path.dirname(cuobjdump) + os.pathsep + env.get("PATH", "")
        r = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit("sass_loops: cuobjdump failed\n" + r.stderr[-2000:])
        sass = r.stdout
    res = resources(log, args.kernel)
    for name, total, found in loops(sass, args.kernel, args.min):
        regs = res.get(name)
        head = f"{name[:110]}\n  {total} instructions"
        if regs:
            head += f", {regs[0]} registers, spills {regs[1]} B stored / {regs[2]} B loaded"
        print(head)
        for start, end, n, ops in found:
            top = ", ".join(f"{op} {k}" for op, k in ops.most_common(args.top))
            print(f"  loop {start:#x}..{end:#x}: {n} instructions ({top})")


if __name__ == "__main__":
    main()
