#!/usr/bin/env python3
"""Per-kernel device time of a whole Nsight Compute trace (any workload).

Sums `gpu__time_duration.sum` by kernel name over every launch in the CSV, with
the launch count and the time a launch; kernels inside CUDA graphs count when
the trace was taken with `--graph-profiling node` (what `gpu_check.sh ncudecode`
does for the decode step). bench/ncu_step.py is the training-step view, and
parses the CSV for both.

    python3 bench/ncu_kernels.py trace.csv [--top N]
"""
import argparse

from ncu_step import launches, per_kernel


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30, help="kernels listed (default 30)")
    a = ap.parse_args()
    ls = launches(a.csv)
    print(f"{a.csv}: {len(ls)} launches, {sum(us for _, us, _ in ls) / 1e3:.3f} ms of kernels")
    for n, us, c in per_kernel(ls)[: a.top]:
        print(f"{us / 1e3:9.3f} ms {c:6d}x {us / c:8.2f} us  {n}")


if __name__ == "__main__":
    main()
