#!/usr/bin/env python3
"""Side-by-side table of `jetd bench --json` reports of several builds.

Reads DIR/<shape>-<build>-<rep>.json (what `gpu_check.sh compare` writes) and
prints, per shape, flow and batch: the decode step in ms (the captured step's
time over its replays, `top_kernels` "decode step") and tokens/s of each build,
each rep's value and their mean, and the decode phase's tokens/s where the report
has it (`decode_tokens_per_s`, twenty-ninth session on) and the GPU's mean idle
before a replay (`idle_before` "decode step": the host's turn between steps); a
rollout that captured no
step (every step launched) shows "-" for the step and its tokens/s still; training
rows give the step in ms; the GRPO-shaped step's rows (`step`: one rollout, training
over its samples, one AdamW step) give its training phase and its whole in ms. The
last column is the first build's mean over the last build's (> 1: the last is
faster).

    python3 bench/compare_builds.py DIR [BUILD ...]   # builds in column order
"""
import collections
import glob
import json
import os
import sys


def rows(report):
    """(kind, flow, batch, step ms, tokens/s, decode-phase tokens/s, idle us a
    replay) of one report."""
    for r in report.get("rollout", []):
        step = dict((k, (s, n)) for k, s, n in r.get("top_kernels", []))
        s, n = step.get("decode step", (None, 0))
        ms = 1e3 * s / n if s is not None and n else None
        idle = dict((k, (s, n)) for k, s, n in r.get("idle_before", []))
        i, c = idle.get("decode step", (None, 0))
        idle_us = 1e6 * i / c if i is not None and c else None
        yield ("rollout", r["flow"], r["batch"], ms, r["tokens_per_s"], r.get("decode_tokens_per_s"), idle_us)
    for t in report.get("train", []):
        yield ("train", t["flow"], "", 1e3 * t["step_s"], t["tokens_per_s"], None, None)
    for s in report.get("step", []):
        yield ("step training", s["flow"], s["batch"], 1e3 * s["train_s"], None, None, None)
        yield ("step whole", s["flow"], s["batch"], 1e3 * s["total_s"], None, None, None)


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    d, order = argv[1], argv[2:]
    acc = collections.defaultdict(list)
    builds, shapes = [], []
    for f in sorted(glob.glob(os.path.join(d, "*.json"))):
        parts = os.path.basename(f)[: -len(".json")].rsplit("-", 2)
        if len(parts) != 3:
            continue
        shape, build, _rep = parts
        try:
            report = json.load(open(f))
        except (OSError, ValueError) as e:
            print(f"{f}: unreadable ({e})", file=sys.stderr)
            continue
        if build not in builds:
            builds.append(build)
        if shape not in shapes:
            shapes.append(shape)
        for kind, flow, batch, ms, tps, dtps, idle in rows(report):
            acc[(shape, kind, flow, batch, build)].append((ms, tps, dtps, idle))
    builds = order or builds
    if not builds:
        sys.exit(f"no reports in {d}")
    head = ["shape", "phase", "flow", "batch"] + [f"{b} ms (tok/s)" for b in builds]
    print(" | ".join(head + [f"{builds[0]} / {builds[-1]}"]))
    keys = sorted(
        {k[:4] for k in acc},
        key=lambda k: (shapes.index(k[0]), k[1], k[2], k[3] if k[3] != "" else -1),
    )
    for key in keys:
        cells, means = [], []
        for b in builds:
            runs = acc.get(key + (b,), [])
            if not runs:
                cells.append("-")
                means.append(None)
                continue
            ms, tps, dtps, idle = (mean([r[i] for r in runs]) for i in range(4))
            rate = f"{tps:,.0f}" if tps is not None else "-"
            rate += f"; decode {dtps:,.0f}" if dtps is not None else ""
            rate += f"; idle {idle:.0f} us" if idle is not None else ""
            if ms is None:
                cells.append(f"- ({rate})")
            else:
                each = "/".join(f"{r[0]:.3f}" for r in runs if r[0] is not None)
                cells.append(f"{ms:.3f} [{each}] ({rate})")
            means.append(ms)
        ratio = f"{means[0] / means[-1]:.3f}" if means[0] and means[-1] else "-"
        print(" | ".join([str(k) for k in key] + cells + [ratio]))


if __name__ == "__main__":
    main(sys.argv)
