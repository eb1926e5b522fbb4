#!/usr/bin/env python3
"""Scores a tax-model summary (the tables summarize_tax_model.py writes) per VAMP cap.

For VAMP-10/15/25 over every row of the first table of each section (all turns; one row per
workload and concurrency): the geometric mean of Q(T, P) / static, the worst row, the rows below
0.95, and the rows where TTFT p99 or mean TPOT is more than 5 % worse than static (issue 12's
criterion for the low-reuse family). With --rows, those rows are listed, worst Q first.

Usage: bench/arbiter/score_tax_tables.py TABLES.md [--rows]

Q(T, P)'s grid comes from the percentiles of every policy's values in a report, so two tables
compare only when they were made with the same --policies.
"""
import collections
import math
import re
import sys


def load(path):
    """{(section, c): {policy: {column: cell}}}, from each section's first table."""
    rows = collections.defaultdict(dict)
    section, header = None, None
    for line in open(path, encoding="utf-8"):
        if line.startswith("### "):
            section, header = line[4:].strip(), None
            continue
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("c", "policy"):
            header = cells
            continue
        if header is None or set(cells[0]) <= set("-: "):
            continue
        d = dict(zip(header, cells))
        policy = d.get("policy")
        key = (section, d.get("c", ""))
        if policy and policy not in rows[key]:
            rows[key][policy] = d
    return rows


def number(cell):
    m = re.search(r"[\d.]+", cell.replace("×", ""))
    return float(m.group()) if m else None


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows = load(sys.argv[1])
    for policy in ("vamp-10", "vamp-15", "vamp-25"):
        qs, fails = [], []
        for key, by_policy in rows.items():
            d = by_policy.get(policy)
            if d is None or d.get("Q(T, P) / static", "—") == "—":
                continue
            q = number(d["Q(T, P) / static"])
            p99, tpot = number(d["p99 / static"]), number(d["TPOT / static"])
            qs.append((q, key))
            if p99 > 1.05 or tpot > 1.05:
                fails.append((q, key, p99, tpot))
        if not qs:
            continue
        geo = math.exp(sum(math.log(q) for q, _ in qs) / len(qs))
        worst = min(qs)
        print(f"{policy}: {len(qs)} rows, Q geomean {geo:.3f}, worst {worst[0]:.3f} "
              f"({worst[1][0]}{' c=' + worst[1][1] if worst[1][1] else ''}), "
              f"{sum(q < 0.95 for q, _ in qs)} below 0.95, "
              f"{len(fails)} with TTFT p99 or TPOT > 5 % worse")
        if "--rows" in sys.argv:
            for q, key, p99, tpot in sorted(fails):
                c = f" c={key[1]}" if key[1] else ""
                print(f"    Q {q:.3f}  TTFT p99 x{p99:.2f}  TPOT x{tpot:.2f}  {key[0]}{c}")


if __name__ == "__main__":
    main()
