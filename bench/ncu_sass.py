#!/usr/bin/env python3
"""Where a kernel's warps spend their time, by how often the code runs.

Input: the SASS page of an Nsight Compute report with source counters,

    ncu -k regex:KERNEL -c 1 --set full --import-source yes -o prof PROGRAM ...
    ncu -i prof.ncu-rep --page source --csv --print-source sass > sass.csv

Straight-line code that ran the same number of times forms one group (in a
persistent attention kernel: once per work item and warp, once per key tile
and warp, the loader's per-tile loop...). The report gives each group's
share of the warp-stall samples, its top stall reasons, and the total per
execution count, which tells per-item from per-tile cost at a glance.

Usage: ncu_sass.py sass.csv [--kernel N] [--min PERCENT] [--show START-END]
  --kernel N   the report's N-th kernel (0 = first; default 0)
  --min P      list groups with at least P % of the samples (default 0.5)
  --show A-B   print SASS lines A..B (numbers from the group list) with
               their samples and executions
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def kernels(path):
    """[(name, header, rows)] of every kernel in the CSV."""
    out = []
    with open(path, newline="") as f:
        for line in csv.reader(f):
            if not line:
                continue
            if line[0] == "Kernel Name":
                out.append([line[1] if len(line) > 1 else "?", None, []])
            elif line[0] == "Address":
                if not out:
                    out.append(["?", None, []])
                out[-1][1] = line
            elif out and out[-1][1] is not None:
                out[-1][2].append(line)
    if not out:
        sys.exit(f"{path}: no SASS rows (ncu --page source --csv --print-source sass)")
    return out


def num(x):
    try:
        return float(x.replace(",", "")) if x else 0.0
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--kernel", type=int, default=0)
    ap.add_argument("--min", type=float, default=0.5)
    ap.add_argument("--show", default=None)
    a = ap.parse_args()
    ks = kernels(a.csv)
    if not 0 <= a.kernel < len(ks):
        sys.exit(f"--kernel {a.kernel}: the report has {len(ks)} kernel(s)")
    name, hdr, rows = ks[a.kernel]
    col = {h: i for i, h in enumerate(hdr)}
    for need in (SAMPLES, EXECUTED):
        if need not in col:
            sys.exit(f"no column '{need}': profile with --set full (source counters)")
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    samp = [num(r[col[SAMPLES]]) for r in rows]
    exe = [int(num(r[col[EXECUTED]])) for r in rows]
    total = sum(samp) or 1.0
    print(f"{name}\n{len(rows)} instructions, {int(total)} samples")

    if a.show:
        lo, hi = (int(x) for x in a.show.split("-"))
        for i in range(max(lo, 0), min(hi + 1, len(rows))):
            print(f"{i:6d} {samp[i] / total * 100:6.2f}% ex={exe[i]:9d}  {rows[i][1]}")
        return

    reasons = collections.Counter()
    for r in rows:
        for s in stalls:
            reasons[s[6:]] += num(r[col[s]])
    print("stalls: " + "  ".join(f"{k} {v / total * 100:.1f}%" for k, v in reasons.most_common(8)))

    groups = []  # [first, last, executions, samples]
    for i in range(len(rows)):
        if groups and groups[-1][2] == exe[i]:
            groups[-1][1] = i
            groups[-1][3] += samp[i]
        else:
            groups.append([i, i, exe[i], samp[i]])
    by_count = collections.Counter()
    for g in groups:
        by_count[g[2]] += g[3]
    print("\nsamples by execution count (code that ran that often):")
    for ex, n in by_count.most_common(12):
        print(f"  {ex:10d}  {n / total * 100:5.1f}%")

    print(f"\ngroups with >= {a.min} % of the samples:")
    for first, last, ex, n in groups:
        if n / total * 100 < a.min:
            continue
        why = collections.Counter()
        for i in range(first, last + 1):
            for s in stalls:
                why[s[6:]] += num(rows[i][col[s]])
        top = " ".join(f"{k} {v / total * 100:.1f}" for k, v in why.most_common(3))
        print(f"  {first:6d}-{last:<6d} ex={ex:9d} len={last - first + 1:4d} {n / total * 100:5.1f}%  "
              f"{rows[first][1][:44]:44s} {top}")


if __name__ == "__main__":
    main()
