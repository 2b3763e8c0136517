#!/usr/bin/env python3
"""Where one kernel's warps wait: Nsight Compute's stall reasons and its hottest SASS lines.

Reads two exports of one profiled launch (a report taken with `--set full`, whose
SourceCounters section samples warp states at each instruction):

    ncu -i K.ncu-rep --page raw --csv > K-raw.csv
    ncu -i K.ncu-rep --page source --print-source sass --csv > K-src.csv
    python3 bench/ncu_stalls.py K-raw.csv K-src.csv [--top N]

and prints the launch's duration, grid and registers, the stall reasons' shares of
all warp samples, and the SASS lines holding the most samples with their execution
counts (`bash bench/gpu_check.sh ncustalls FLOW PRESET BATCH KERNEL,...` runs it on the
decode step's kernels). A line's samples are the cycles warps sat on it, so a load's
latency shows on the first instruction that uses the loaded register.
"""
import argparse
import csv

KEEP = {
    "gpu__time_duration.sum": "duration (us)",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
    "launch__registers_per_thread": "registers",
    "launch__waves_per_multiprocessor": "waves",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy %",
    "dram__cycles_active.avg.pct_of_peak_sustained_elapsed": "DRAM active %",
    "gpc__cycles_elapsed.max.per_second": "clock (GHz)",
    "smsp__inst_executed.sum": "warp instructions",
}
STALL = "smsp__pcsamp_warps_issue_stalled_"


def num(s):
    try:
        return float(s.replace(",", "") or 0)
    except ValueError:
        return None


def raw_summary(path):
    rows = [r for r in csv.reader(open(path, errors="replace")) if r]
    if len(rows) < 2:
        return [f"{path}: no launch"]
    head, vals = rows[0], rows[-1]  # the header, then (after a units row) one launch
    out = [f"{KEEP[n]:>22s}  {v}" for n, v in zip(head, vals) if n in KEEP]
    stalls = [(n[len(STALL):], num(v)) for n, v in zip(head, vals) if n.startswith(STALL)]
    stalls = [(n, v) for n, v in stalls if v is not None and not n.endswith("not_issued")]
    total = sum(v for _, v in stalls) or 1.0
    out.append("stall reasons (share of warp samples):")
    out += [f"  {100 * v / total:5.1f}%  {n}" for n, v in sorted(stalls, key=lambda t: -t[1])[:10] if v > 0]
    return out


def hot_lines(path, top):
    rows = list(csv.reader(open(path, errors="replace")))
    for i, r in enumerate(rows):
        if "Address" in r and "Source" in r:
            head, body = r, rows[i + 1 :]
            break
    else:
        return [f"{path}: no SASS table"]
    ia, isrc = head.index("Address"), head.index("Source")
    isamp = next((j for j, c in enumerate(head) if c.startswith("Warp Stall Sampling (All")), None)
    iexe = head.index("Instructions Executed") if "Instructions Executed" in head else None
    if isamp is None:
        return [f"{path}: no warp stall sampling column"]
    lines = []
    for r in body:
        if len(r) > max(ia, isrc, isamp) and num(r[isamp]) is not None:
            lines.append((num(r[isamp]), r[ia], r[isrc].strip(), r[iexe] if iexe is not None else ""))
    total = sum(s for s, *_ in lines) or 1.0
    out = [f"hottest SASS lines ({len(lines)} lines, {total:.0f} samples; share, address, executed):"]
    for s, a, src, ex in sorted(lines, key=lambda t: -t[0])[:top]:
        out.append(f"  {100 * s / total:5.1f}%  {a[-5:]:>5s}  {ex:>6s}  {src[:72]}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw")
    ap.add_argument("source")
    ap.add_argument("--top", type=int, default=20, help="SASS lines listed (default 20)")
    a = ap.parse_args()
    print("\n".join(raw_summary(a.raw) + hot_lines(a.source, a.top)))


if __name__ == "__main__":
    main()
