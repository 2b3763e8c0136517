#!/usr/bin/env python3
"""Per-kernel device time of a whole Nsight Compute trace (any workload).

Sums `gpu__time_duration.sum` by kernel name over every launch in the CSV, with
the launch count and the time a launch; kernels inside CUDA graphs count when
the trace was taken with `--graph-profiling node` (what `gpu_check.sh ncudecode`
does for the decode step). bench/ncu_step.py is the training-step view.

    python3 bench/ncu_kernels.py trace.csv [--top N]
"""
import argparse
import collections
import csv
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30, help="kernels listed (default 30)")
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        rows = [r for r in csv.reader(f) if len(r) > 10]
    if not rows:
        sys.exit(f"{a.csv}: no ncu CSV rows (was it written with --csv?)")
    hdr, rows = rows[0], rows[1:]
    try:
        ki, mi, vi = hdr.index("Kernel Name"), hdr.index("Metric Name"), hdr.index("Metric Value")
    except ValueError as e:
        sys.exit(f"{a.csv}: not an ncu CSV with kernel names and metric values ({e})")
    us = collections.defaultdict(float)
    n = collections.Counter()
    for r in rows:
        if r[mi] != "gpu__time_duration.sum":
            continue
        k = r[ki].split("(")[0]
        us[k] += float(r[vi].replace(",", "")) / 1e3  # ns -> us
        n[k] += 1
    if not n:
        sys.exit(f"{a.csv}: no gpu__time_duration.sum rows")
    print(f"{a.csv}: {sum(n.values())} launches, {sum(us.values()) / 1e3:.3f} ms of kernels")
    for k, v in sorted(us.items(), key=lambda x: -x[1])[: a.top]:
        print(f"{v / 1e3:9.3f} ms {n[k]:6d}x {v / n[k]:8.2f} us  {k}")


if __name__ == "__main__":
    main()
