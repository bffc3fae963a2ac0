"""Joins bench_cuda_attention's and sdpa_baseline.py's CSVs (same device run) into the markdown
table of bench/RESULTS.md: time, bytes read, bandwidth against the HBM peak and the measured read
bandwidth, and the speedup over the fastest fp16 SDPA backend on the same shape.

    python3 bench/gpu/report.py KVARN_CSV SDPA_CSV [READ_TBPS]
"""
import csv
import math
import sys


def main():
    kv_rows = list(csv.DictReader(open(sys.argv[1])))
    sdpa = {}
    for r in csv.DictReader(open(sys.argv[2])):
        key = (int(r["batch"]), int(r["ctx"]), int(r["nq"]))
        sdpa.setdefault(key, {})[r["backend"]] = float(r["ms"])
    print("| batch | context | new tokens | kvarn k4v2 ms | MB read | TB/s | of 4.8 TB/s | of read BW "
          "| fp16 flash ms | fp16 cuDNN ms | speedup vs fastest fp16 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in kv_rows:
        b, c, nq = int(r["batch"]), int(r["ctx"]), int(r["nq"])
        ms = float(r["ms"])
        base = sdpa.get((b, c, nq), {})
        flash, cudnn = base.get("flash", math.nan), base.get("cudnn", math.nan)
        best = min(x for x in (flash, cudnn) if not math.isnan(x)) if base else math.nan
        print(f"| {b} | {c} | {nq} | {ms:.4f} | {float(r['bytes']) / 1e6:.1f} | "
              f"{float(r['tbps']):.2f} | {100 * float(r['peak_frac']):.0f}% | "
              f"{100 * float(r['read_frac']):.0f}% | {flash:.4f} | {cudnn:.4f} | {best / ms:.2f}x |")


if __name__ == "__main__":
    main()
