#!/usr/bin/env python3
"""kernel_breakdown.py on a hand-made ncu CSV: per-step sums, launch counts, units, names, the
gap line, and clear failures on a file without the metric.

Usage: kernel_breakdown_test.py PATH_TO_kernel_breakdown.py
"""
import os
import subprocess
import sys
import tempfile

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
          '"Metric Value"\n')


def row(i, name, unit, value, grid="(4, 1, 1)"):
    return (f'"{i}","1","bench","host","{name}","1","14","(128, 1, 1)","{grid}","0","9.0",'
            f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"\n')


def run(script, *args):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True)


def main():
    script = sys.argv[1]
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as d:
        csv_path = os.path.join(d, "k.csv")
        norm = "void vamp::<unnamed>::RmsNormVecKernel<__nv_bfloat16>(const T1 *, long)"
        gemm = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
        with open(csv_path, "w") as f:
            f.write("==PROF== Connected to process 1\n")  # ncu's own lines are skipped
            f.write(HEADER)
            # Two steps of: norm 3 µs, gemm 9 µs (given in µs), norm 2 µs (given as "2,000" ns).
            step = [(norm, "ns", "3,000"), (gemm, "us", "9"), (norm, "ns", "2,000")]
            for i, (name, unit, value) in enumerate(step * 2):
                f.write(row(i, name, unit, value))
        out = os.path.join(d, "r.md")
        r = run(script, csv_path, "--steps", "2", "--step-ms", "0.020", "--first", "3",
                "--out", out)
        check(r.returncode == 0, f"exit {r.returncode}: {r.stderr}")
        text = open(out).read() if os.path.exists(out) else ""
        check("6 kernels over 2 steps: 3 launches and 14.0 µs of kernel time per step" in text,
              "per-step totals")
        check("| `RmsNormVecKernel<__nv_bfloat16>` | 2.0 | 5.0 | 35.7% | 2.50 |" in text,
              "norm row (names without namespaces, two launches per step)")
        check(f"| `{gemm}` | 1.0 | 9.0 | 64.3% | 9.00 |" in text, "gemm row")
        check("launches, gaps and host work not hidden: 6.0 µs (30.0%)" in text, "gap line")
        check("| 1 | `nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT` | (4, 1, 1) | (128, 1, 1) | 9.00 |"
              in text, "launch-order table (grid, then block)")

        # A step time below the kernel sum explains itself.
        r = run(script, csv_path, "--steps", "2", "--step-ms", "0.010")
        check(r.returncode == 0 and "Negative:" in r.stdout, "negative gap note")

        # A CSV without the metric, and a bad --steps, fail with a message.
        empty = os.path.join(d, "empty.csv")
        with open(empty, "w") as f:
            f.write(HEADER)
        r = run(script, empty, "--steps", "1")
        check(r.returncode != 0 and "no gpu__time_duration.sum rows" in r.stderr,
              "missing metric is an error")
        r = run(script, csv_path, "--steps", "0")
        check(r.returncode != 0 and "--steps must be at least 1" in r.stderr, "--steps 0")
        with open(empty, "a") as f:
            f.write(row(0, gemm, "furlong", "1"))
        r = run(script, empty, "--steps", "1")
        check(r.returncode != 0 and "unknown time unit 'furlong'" in r.stderr, "unknown unit")

    if failures:
        print("kernel_breakdown_test: FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("kernel_breakdown_test: ok")


if __name__ == "__main__":
    main()
