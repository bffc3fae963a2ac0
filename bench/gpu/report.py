"""Joins bench_cuda_attention's and sdpa_baseline.py's CSVs (same device run) into the markdown
table of bench/RESULTS.md: time, bytes read, bandwidth against the HBM peak and the measured read
bandwidth, the kernel the plan chose, and the speedup over the fastest fp16 SDPA backend on the
same shape (head dim, heads, batch, context, new tokens).

    python3 bench/gpu/report.py KVARN_CSV SDPA_CSV [--summary]

--summary: one line per (preset, D, heads) with the speedups the targets of bench/RESULTS.md
name (batch 32 / 8 / 1 at 32k and 128k, the worst shape from 4k up and at 1k), the bound (fp16
bytes over kvarn bytes at 32k) and the fraction of it reached at batch 32.
"""
import csv
import math
import sys

FP16_BACKENDS = ("flash", "cudnn", "efficient")


def speedups(kv_rows, sdpa):
    """(preset, D, hq, hk) -> {(batch, ctx): (speedup, kvarn bytes, fp16 bytes)}"""
    out = {}
    for r in kv_rows:
        d, hq, hk = r.get("D", "128"), r.get("hq", "32"), r.get("hk", "8")
        b, c, nq = int(r["batch"]), int(r["ctx"]), int(r["nq"])
        base = sdpa.get((d, hq, hk, b, c, nq), {})
        best = min(base.values()) if base else math.nan
        fp16_bytes = 2.0 * b * int(hk) * c * int(d) * 2
        key = (r.get("preset", "k4v2_g128"), d, hq, hk)
        out.setdefault(key, {})[(b, c)] = (best / float(r["ms"]), float(r["bytes"]), fp16_bytes)
    return out


def summary(kv_rows, sdpa):
    print("| preset | D | Hq/Hk | B32 32k | B32 128k | B8 32k | B1 32k | B1 128k | worst >= 4k "
          "| worst 1k | bound (bytes) | B32 32k of bound |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (preset, d, hq, hk), cells in speedups(kv_rows, sdpa).items():
        def x(b, c):
            v = cells.get((b, c))
            return f"{v[0]:.2f}x" if v and not math.isnan(v[0]) else "-"
        long_ = [v[0] for (b, c), v in cells.items() if c >= 4096 and not math.isnan(v[0])]
        short = [v[0] for (b, c), v in cells.items() if c == 1024 and not math.isnan(v[0])]
        ref = cells.get((32, 32768))
        bound = ref[2] / ref[1] if ref else math.nan
        frac = ref[0] / bound if ref and not math.isnan(ref[0]) else math.nan
        print(f"| {preset} | {d} | {hq}/{hk} | {x(32, 32768)} | {x(32, 131072)} | {x(8, 32768)} | "
              f"{x(1, 32768)} | {x(1, 131072)} | {min(long_) if long_ else math.nan:.2f}x | "
              f"{min(short) if short else math.nan:.2f}x | {bound:.2f}x | {100 * frac:.0f}% |")


def main():
    kv_rows = list(csv.DictReader(open(sys.argv[1])))
    sdpa = {}
    for r in csv.DictReader(open(sys.argv[2])):
        key = (r.get("D", "128"), r.get("hq", "32"), r.get("hk", "8"), int(r["batch"]),
               int(r["ctx"]), int(r["nq"]))
        if not math.isnan(float(r["ms"])):
            sdpa.setdefault(key, {})[r["backend"]] = float(r["ms"])
    if "--summary" in sys.argv:
        summary(kv_rows, sdpa)
        return
    print("| preset | D | Hq/Hk | batch | context | new tokens | kvarn ms | MB read | TB/s "
          "| of read BW | kernel | fastest fp16 ms (backend) | speedup vs fastest fp16 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in kv_rows:
        d, hq, hk = r.get("D", "128"), r.get("hq", "32"), r.get("hk", "8")
        b, c, nq = int(r["batch"]), int(r["ctx"]), int(r["nq"])
        ms = float(r["ms"])
        base = sdpa.get((d, hq, hk, b, c, nq), {})
        best_name, best = min(base.items(), key=lambda kv: kv[1]) if base else ("-", math.nan)
        print(f"| {r.get('preset', 'k4v2_g128')} | {d} | {hq}/{hk} | {b} | {c} | {nq} | {ms:.4f} | "
              f"{float(r['bytes']) / 1e6:.1f} | {float(r['tbps']):.2f} | "
              f"{100 * float(r['read_frac']):.0f}% | {r.get('kernel', '-')} | "
              f"{best:.4f} ({best_name}) | {best / ms:.2f}x |")


if __name__ == "__main__":
    main()
