#!/usr/bin/env python3
"""One training step's kernels as the GPU ran them, from an Nsight Compute CSV.

`jetd bench`'s breakdown brackets every launch with two events, which serialises
the stream and adds the host's lateness to the span it lands in (a 0.6B step's
breakdown sums to ~6 ms more than the unprofiled step). ncu times each kernel alone
(`gpu__time_duration.sum`, caches and clocks left as the step leaves them), so its
sum over a step is the step's device time, comparable with a torch.profiler
(CUPTI) trace of the PyTorch peer (`bench/peer_torch.py --profile`).

    ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum \\
        --csv --print-units base --launch-count 6000 --log-file step.csv \\
        jetd bench --device cuda --json --no-kernels --no-cublaslt --flow bf16 \\
        --batch 1 --gen-len 2 --prompt-len 16 --train-steps 1
    python3 bench/ncu_step.py step.csv [--json]

The step is the trace's Nth training update (`--update`, default 2: the bench's
first timed update, after its warm-up): from the last `embedding_fwd` before the
Nth run of AdamW launches through that run (`adamw_block128_multi` then
`adamw_multi` in the FP8-weight flows). The rows kernels (the batch-invariant
forward GEMMs) are also listed by their place in a layer (q, k, v, o, gate, up,
down) and the LM head.
"""
import argparse
import collections
import csv
import json
import sys

LAYER_GEMMS = ["q", "k", "v", "o", "gate", "up", "down"]


def launches(path):
    """(kernel name, microseconds, grid) of every timed launch, in order."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if len(r) > 10]
    if not rows:
        sys.exit(f"{path}: no ncu CSV rows (was it written with --csv?)")
    hdr, rows = rows[0], rows[1:]
    try:
        ki, mi, vi, gi = (hdr.index(c) for c in ("Kernel Name", "Metric Name", "Metric Value", "Grid Size"))
    except ValueError as e:
        sys.exit(f"{path}: not an ncu CSV with per-launch metrics ({e})")
    out = []
    for r in rows:
        if r[mi] != "gpu__time_duration.sum":
            continue
        name = r[ki].split("(")[0].split("<")[0].strip()
        out.append((name, float(r[vi].replace(",", "")) / 1e3, r[gi]))  # ns -> us
    return out


def per_kernel(ls):
    """[(name, microseconds, launches)] of launches `ls`, most time first."""
    per = collections.defaultdict(lambda: [0.0, 0])
    for n, us, _ in ls:
        per[n][0] += us
        per[n][1] += 1
    return sorted(((n, us, c) for n, (us, c) in per.items()), key=lambda k: -k[1])


def is_rows(name):
    """The batch-invariant forward GEMM (wgmma + TMA, or the mma.sync family)."""
    return name.endswith("_rows_tma") or (name.startswith("gemm_") and name.endswith("_rows"))


def step_of(ks, path, update):
    """The launches of the update-th training update (1-based)."""
    runs = []  # [first, last] index of each run of consecutive AdamW launches
    for i, k in enumerate(ks):
        if k[0].startswith("adamw"):
            if runs and runs[-1][1] == i - 1:
                runs[-1][1] = i
            else:
                runs.append([i, i])
    if len(runs) < update:
        sys.exit(f"{path}: {len(runs)} AdamW updates in the trace, asked for update {update} "
                 "(raise ncu's --launch-count)")
    first, last = runs[update - 1]
    emb = [i for i in range(first) if ks[i][0] == "embedding_fwd"]
    if not emb:
        sys.exit(f"{path}: no embedding_fwd before AdamW update {update}")
    return ks[emb[-1]:last + 1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--update", type=int, default=2,
                   help="which training update of the trace (1: the bench's warm-up)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    a = p.parse_args()
    if a.update < 1:
        sys.exit("--update counts from 1")
    step = step_of(launches(a.csv), a.csv, a.update)
    kernels = per_kernel(step)
    rows = [us for n, us, g in step if is_rows(n)]
    by_place = {}
    if len(rows) > 1 and len(rows) % 7 == 1:  # 7 a layer, then the LM head
        layers = len(rows) // 7
        by_place = {g: sum(rows[j::7][:layers]) / layers for j, g in enumerate(LAYER_GEMMS)}
        by_place["lm_head"] = rows[-1]
    res = dict(launches=len(step), kernel_ms=round(sum(us for _, us, _ in step) / 1e3, 3),
               kernels=[dict(name=n, ms=round(us / 1e3, 4), launches=c) for n, us, c in kernels],
               rows_us_by_place={k: round(v, 1) for k, v in by_place.items()})
    if a.json:
        print(json.dumps(res))
        return
    print(f"training update {a.update}: {res['launches']} launches, {res['kernel_ms']:.2f} ms of kernels")
    for k in res["kernels"][:a.top]:
        print(f"{k['ms']:9.3f} ms {k['launches']:5d}x  {k['name'][:90]}")
    if by_place:
        print("rows kernel, us a launch by place: " +
              ", ".join(f"{k} {v:.1f}" for k, v in res["rows_us_by_place"].items()))


if __name__ == "__main__":
    main()
