#!/usr/bin/env python3
"""Summarises the tax-model vamp-sim reports of one date as markdown tables.

For every bench/results/sim-<date>-tax-*.md it reads the "All runs" table (and the phase table
where there is one) and prints, per workload setting, each policy's TTFT p50 / p99, mean TPOT and
request throughput next to the static split's, as ratios (policy / static), and whether the
policy stays within 5 % of static on TTFT p99 and TPOT ("≤ 1.05" on both).
Usage: summarize_tax_model.py DATE
"""
import glob
import os
import re
import sys


def tables(text):
    """Yields (heading, header cells, rows) for each markdown table, with the heading above it."""
    heading = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if (line.startswith("|") and i + 1 < len(lines)
                and lines[i + 1].replace(" ", "").startswith("|---")):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip("|").split("|")])
                i += 1
            yield heading, header, rows
            continue
        i += 1


def num(cell):
    m = re.match(r"[-+]?[0-9]*\.?[0-9]+", cell.strip())
    return float(m.group(0)) if m else float("nan")


def ratio(a, b):
    return a / b if b > 0 else float("nan")


def summarize(path):
    text = open(path).read()
    title = text.splitlines()[0].lstrip("# ").strip()
    out = [f"### {title}", "", f"Report: [{os.path.basename(path)}]({os.path.basename(path)})", ""]
    # Q against static and E2E over the window, per (c, policy), for the columns below.
    q_ratio, e2e = {}, {}
    for heading, header, rows in tables(text):
        if "Q ratio" in header:
            for r in rows:
                q_ratio[(r[0] if r[0] != "–" else "", r[1])] = r[2].split(" (")[0]
        if heading.startswith("Over the measurement window") and "policy" in header:
            col = {h: k for k, h in enumerate(header)}
            for r in rows:
                c = r[col["c"]] if "c" in col else ""
                e2e[(c, r[col["policy"]])] = num(r[col["E2E p50 / p99 (s)"]].split("/")[0])
    for heading, header, rows in tables(text):
        if heading != "All runs" and not heading.startswith("Late phase"):
            continue
        if "policy" not in header:
            continue
        col = {h: k for k, h in enumerate(header)}
        ttft_col = next((h for h in header if h.startswith("TTFT")), None)
        if ttft_col is None:
            continue
        has_p90 = "p90" in ttft_col
        key = "c" if "c" in col else None
        static = {}
        for r in rows:
            if r[col["policy"]] == "static":
                static[r[col[key]] if key else ""] = r
        out.append(f"{heading}:" if heading != "All runs" else "All turns:")
        out.append("")
        whole = heading == "All runs"
        out.append("| " + ("c | " if key else "") + "policy | TTFT p50 (s) | TTFT p99 (s) | TPOT (ms) | "
                   "req/s | p99 / static | TPOT / static | " +
                   ("E2E p50 / static (window) | Q(T, P) / static | " if whole else "") +
                   "worse than static by > 5 % |")
        out.append("| " + ("---: | " if key else "") + "--- | ---: | ---: | ---: | ---: | ---: | ---: | " +
                   ("---: | ---: | " if whole else "") + "--- |")
        for r in rows:
            base = static.get(r[col[key]] if key else "")
            ttft = [num(x) for x in r[col[ttft_col]].split("/")]
            p50, p99 = ttft[0], ttft[-1]
            tpot = num(r[col["TPOT mean (ms)"]])
            rps = num(r[col["req/s"]]) if "req/s" in col else float("nan")
            if base is None:
                continue
            bt = [num(x) for x in base[col[ttft_col]].split("/")]
            bp99 = bt[-1]
            btpot = num(base[col["TPOT mean (ms)"]])
            rp, rt = ratio(p99, bp99), ratio(tpot, btpot)
            brps = num(base[col["req/s"]]) if "req/s" in col else float("nan")
            worse = []
            if ratio(p50, bt[0]) > 1.05:
                worse.append(f"TTFT p50 ×{ratio(p50, bt[0]):.2f}")
            if rp > 1.05:
                worse.append(f"TTFT p99 ×{rp:.2f}")
            if rt > 1.05:
                worse.append(f"TPOT ×{rt:.2f}")
            if rps == rps and brps > 0 and rps < brps / 1.05:
                worse.append(f"req/s ×{rps / brps:.2f}")
            c = r[col[key]] if key else ""
            extra = []
            if whole:
                be, pe = e2e.get((c, "static")), e2e.get((c, r[col["policy"]]))
                re2e = ratio(pe, be) if be and pe else float("nan")
                qr = q_ratio.get((c, r[col["policy"]]), "—")
                extra = ["-" if re2e != re2e else f"{re2e:.2f}", qr]
                if re2e == re2e and re2e > 1.05:
                    worse.append(f"E2E p50 ×{re2e:.2f}")
                if qr.startswith("×") and num(qr[1:]) < 0.95:
                    worse.append(f"Q {qr}")
            ok = "—" if r[col["policy"]] == "static" else (", ".join(worse) if worse else "none")
            cells = ([r[col[key]]] if key else []) + [
                r[col["policy"]], f"{p50:.2f}", f"{p99:.2f}", f"{tpot:.1f}",
                "-" if rps != rps else f"{rps:.3f}", f"{rp:.2f}", f"{rt:.2f}"] + extra + [ok]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main():
    date = sys.argv[1]
    folder = sys.argv[2] if len(sys.argv) > 2 else "bench/results"
    paths = sorted(glob.glob(f"{folder}/sim-{date}-tax-*.md"))
    if not paths:
        sys.exit(f"no {folder}/sim-{date}-tax-*.md reports")
    print(f"# Tax model vs static and the paper's cost model: summary tables ({date})\n")
    print("Generated by bench/arbiter/summarize_tax_model.py from the vamp-sim reports. Ratios are "
          "policy / static on the same workload (and concurrency); E2E p50 is over the measurement "
          "window by vamp-bench's rules, Q(T, P) / static the geometric mean over the grid's cells "
          "of the report; the last column lists every metric (TTFT p50, TTFT p99, mean TPOT, request "
          "throughput, E2E p50, Q) on which the policy is more than 5 % worse than static.\n")
    for p in paths:
        print(summarize(p))


if __name__ == "__main__":
    main()
