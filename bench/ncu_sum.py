#!/usr/bin/env python3
"""Sum the kernel times of an Nsight Compute CSV (ncu --csv --metrics
gpu__time_duration.sum) by kernel and grid: where the GPU time of a run goes
when kernels run one at a time. Usage: ncu_sum.py RUN.csv"""
import collections
import csv
import sys

UNITS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}


def read(path):
    rows = [r for r in csv.reader(open(path)) if r]
    for i, r in enumerate(rows):
        if "Kernel Name" in r and "Metric Value" in r:
            hdr, rows = r, rows[i + 1:]
            break
    else:
        sys.exit(f"{path}: no ncu CSV header")
    k, v, u, g = (hdr.index(c) for c in ("Kernel Name", "Metric Value", "Metric Unit", "Grid Size"))
    total, count = collections.Counter(), collections.Counter()
    for r in rows:
        try:
            ms = float(r[v].replace(",", "")) * UNITS.get(r[u], 1e-6)
        except (ValueError, IndexError):
            continue
        name = r[k].split("(")[0].replace("void ", "").split("::")[-1].split("<")[0]
        total[(name, r[g])] += ms
        count[(name, r[g])] += 1
    return total, count


def show(path, total, count):
    print(f"{path}: {sum(total.values()):.2f} ms in {sum(count.values())} kernels")
    for (name, grid), ms in total.most_common(16):
        print(f"  {ms:10.3f} ms {count[(name, grid)]:5d}  {name} {grid}")


show(sys.argv[1], *read(sys.argv[1]))
