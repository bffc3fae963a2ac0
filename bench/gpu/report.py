"""Joins bench_cuda_attention's and sdpa_baseline.py's CSVs (same device run) into the markdown
table of bench/RESULTS.md: time, bytes read, bandwidth against the HBM peak and the measured read
bandwidth, the kernel the plan chose, and the speedup over the fastest fp16 SDPA backend on the
same shape (head dim, heads, batch, context, new tokens).

    python3 bench/gpu/report.py KVARN_CSV SDPA_CSV
"""
import csv
import math
import sys

FP16_BACKENDS = ("flash", "cudnn", "efficient")


def main():
    kv_rows = list(csv.DictReader(open(sys.argv[1])))
    sdpa = {}
    for r in csv.DictReader(open(sys.argv[2])):
        key = (r.get("D", "128"), r.get("hq", "32"), r.get("hk", "8"), int(r["batch"]),
               int(r["ctx"]), int(r["nq"]))
        if not math.isnan(float(r["ms"])):
            sdpa.setdefault(key, {})[r["backend"]] = float(r["ms"])
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
