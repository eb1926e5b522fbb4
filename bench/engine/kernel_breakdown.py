#!/usr/bin/env python3
"""Per-kernel time of the step benchmark's timed steps, from Nsight Compute's CSV.

Run the step bench under ncu with collection off until the bench's cudaProfilerStart, one metric:

  ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
      --log-file kernels.csv vamp_gpu_step_bench --cuda_profiler=true --ratios=0 \
      --prefill_tokens=0 --steps=2 ...
  bench/engine/kernel_breakdown.py kernels.csv --steps 4 [--step-ms 6.61] [--out report.md]

--steps is the number of profiled steps (with --ratios=0 and no mixed steps the bench times two
variants, graphs off and on, so 2 x --steps). ncu serialises kernels and times each alone, so the
sum is the step's kernel time without launch gaps or overlap; next to the step's wall time
(--step-ms, from the same bench without ncu) the difference is what launches and gaps cost.
"""
import argparse
import collections
import csv
import re
import sys


def short_name(name):
    """The kernel's function name: no parameter list, template arguments kept but compacted."""
    name = re.sub(r"\(.*$", "", name.strip())
    name = re.sub(r"^void ", "", name)
    for scope in ("vamp::kernels::cuda::internal::", "vamp::kernels::cuda::", "vamp::",
                  "<unnamed>::", "(anonymous namespace)::"):
        name = name.replace(scope, "")
    return name if len(name) <= 90 else name[:87] + "..."


def read_kernels(path):
    """[(kernel name, grid, block, duration µs)] in launch order."""
    rows = []
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    reader = csv.DictReader(lines)
    for r in reader:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3,
                 "ms": 1e3, "second": 1e6, "s": 1e6}.get(unit)
        if scale is None:
            sys.exit(f"kernel_breakdown: unknown time unit '{unit}' in {path}")
        rows.append((short_name(r["Kernel Name"]), r.get("Grid Size", ""),
                     r.get("Block Size", ""), value * scale))
    if not rows:
        sys.exit(f"kernel_breakdown: no gpu__time_duration.sum rows in {path} (was the bench run "
                 "with --cuda_profiler=true under ncu --profile-from-start off?)")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu --csv output (--log-file)")
    ap.add_argument("--steps", type=int, required=True, help="profiled steps in the file")
    ap.add_argument("--step-ms", type=float, default=0,
                    help="the step's wall time without the profiler (adds the gap line)")
    ap.add_argument("--first", type=int, default=40,
                    help="list this many of the first step's kernels in launch order")
    ap.add_argument("--title", default="Kernel time per step")
    ap.add_argument("--out", help="write the Markdown here (default: stdout)")
    a = ap.parse_args()
    if a.steps < 1:
        sys.exit("kernel_breakdown: --steps must be at least 1")
    rows = read_kernels(a.csv)
    if len(rows) % a.steps:
        print(f"kernel_breakdown: {len(rows)} kernels do not divide into {a.steps} steps; the "
              "per-step figures are averages", file=sys.stderr)
    total = collections.defaultdict(float)
    count = collections.Counter()
    for name, _, _, us in rows:
        total[name] += us
        count[name] += 1
    step_us = sum(total.values()) / a.steps
    out = [f"# {a.title}", "",
           f"{len(rows)} kernels over {a.steps} steps: {len(rows) / a.steps:.0f} launches and "
           f"{step_us:.1f} µs of kernel time per step (each kernel timed alone by ncu).", ""]
    if a.step_ms > 0:
        gap = a.step_ms * 1e3 - step_us
        out += [f"Step wall time without the profiler: {a.step_ms * 1e3:.1f} µs; launches, gaps "
                f"and host work not hidden: {gap:.1f} µs ({gap / (a.step_ms * 1e3):.1%})."]
        if gap < 0:
            out.append("Negative: each kernel timed alone includes its launch ramp and drain, "
                       "which overlap neighbouring kernels in a real (CUDA graph) step.")
        out.append("")
    out += ["| kernel | launches / step | µs / step | share | µs / launch |",
            "| --- | ---: | ---: | ---: | ---: |"]
    for name, us in sorted(total.items(), key=lambda kv: -kv[1]):
        n = count[name] / a.steps
        out.append(f"| `{name}` | {n:.1f} | {us / a.steps:.1f} | {us / a.steps / step_us:.1%} | "
                   f"{us / count[name]:.2f} |")
    per_step = len(rows) // a.steps
    if a.first > 0:
        out += ["", f"First {min(a.first, per_step)} kernels of the first profiled step:", "",
                "| # | kernel | grid | block | µs |", "| ---: | --- | --- | --- | ---: |"]
        for i, (name, grid, block, us) in enumerate(rows[:min(a.first, per_step)]):
            out.append(f"| {i} | `{name}` | {grid} | {block} | {us:.2f} |")
    text = "\n".join(out) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
