#!/usr/bin/env python3
"""The tax model's per-step formula against staging measured on a GPU.

OffloadTax prices g offloaded groups at exposed(g) = max(0, g*B/bw - f*compute) per step. The
step benchmark (bench/engine/run_gpu_step_bench.sh) measured forward times with 0..16 groups
offloaded; the fully resident forward is the step's compute. This prints measured and modelled
exposed stalls side by side, for the arbiter's defaults (f = 0.9, bw = the benchmark's own
pinned H2D peak). Usage: check_tax_formula.py STEP_BENCH_JSON [f]
"""
import json
import sys


def main():
    d = json.load(open(sys.argv[1]))
    f = float(sys.argv[2]) if len(sys.argv) > 2 else 0.9
    bw = d["device"]["h2d_peak_gbps"] * 1e9
    points = d["points"]
    compute = {p["mode"]: p["forward_ms"]["p50"] for p in points if p["groups"] == 0}
    print(f"f = {f}, bw = {bw / 1e9:.1f} GB/s (the benchmark's pinned H2D peak)\n")
    print("| step | groups | staged GB/step | compute ms | measured exposed ms | model ms | model − measured ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for p in points:
        if p["groups"] == 0 or p["mode"] not in compute:
            continue
        k = compute[p["mode"]]
        measured = p["forward_ms"]["p50"] - k
        model = max(0.0, p["staged_bytes_per_step"] / bw * 1e3 - f * k)
        print(f"| {p['mode']} | {p['groups']} | {p['staged_bytes_per_step'] / 1e9:.2f} | {k:.2f} | "
              f"{measured:.2f} | {model:.2f} | {model - measured:+.2f} |")


if __name__ == "__main__":
    main()
