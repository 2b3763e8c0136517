#!/usr/bin/env python3
"""The rows kernels' timings side by side, from `cuda_timing fp8_rows_timing` logs.

Each log is named `timing-<tag>-<anything>.log`; its TIMING lines give, per
(type, shape), cuBLASLt's time and the rows kernel's. Prints one line a shape with
each tag's times (one per log of that tag), in the order the tags first appear.

    python3 bench/rows_timing_table.py $OUT/timing-*.log
    # exit status 0 only if tag B beat tag A (best of its runs) at every named shape
    # of 4,096 tokens (TYPE:NAME, or NAME for both types); an empty tag reads "main":
    python3 bench/rows_timing_table.py --wins main ts fp8:q_proj,fp8:gate/up $OUT/timing-*.log
"""
import os
import re
import sys

LINE = re.compile(
    r"TIMING (fp8|bf16) rows (\d+x\d+x\d+) (\S+)\s*: cuBLASLt\s+([\d.]+) us.*?\| rows(?:64)?\s+([\d.]+) us"
)


def table(paths):
    rows, tags = {}, []
    for p in sorted(paths):
        tag = re.sub(r"^timing-(.*)-[^-]*\.log$", r"\1", os.path.basename(p)) or "main"
        if tag not in tags:
            tags.append(tag)
        for line in open(p):
            m = LINE.match(line)
            if m:
                r = rows.setdefault((m[1], m[2], m[3]), {"lt": float(m[4])})
                r.setdefault(tag, []).append(float(m[5]))
    return rows, tags


def main(argv):
    wins = None
    if argv[:1] == ["--wins"]:
        wins, argv = (argv[1], argv[2], argv[3].split(",")), argv[4:]
    rows, tags = table(argv)
    try:
        for (ty, shape, name), r in rows.items():
            cells = " | ".join(f"{t} {r.get(t)}" for t in tags)
            print(f"{ty} {shape} {name} | cuBLASLt {r['lt']:.1f} | {cells}")
    except BrokenPipeError:
        pass
    if wins:
        a, b, names = wins
        big = [
            r
            for (ty, shape, name), r in rows.items()
            if (name in names or f"{ty}:{name}" in names) and shape.startswith("4096x")
        ]
        ok = bool(big) and all(min(r.get(b, [1e9])) < min(r.get(a, [0.0])) for r in big)
        print(f"{b} beats {a} at {','.join(names)}: {ok}")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
