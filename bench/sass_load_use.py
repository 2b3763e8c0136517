#!/usr/bin/env python3
"""How many of a kernel's global loads are in flight when each is first used, from its SASS.

No GPU needed. For each kernel of a cubin (bench/ptxas_info.py writes one) it walks the
SASS in address order and, for every global load (LDG), finds the first later
instruction that reads one of the load's destination registers; the loads issued in
between are the ones in flight with it. A kernel whose loads are meant to overlap but
whose first uses come before the next load issues waits out one memory round trip a
load: the forty-fifth session found the dual quantizers doing that row by row (ncu:
28-31% of their samples), which load_rows4 (common.cuh) mends.

    PATH=/tmp/nv/x/nvidia/cu13/bin:$PATH python3 bench/sass_load_use.py /tmp/q.cubin [KERNEL_REGEX]

prints a kernel a line: its loads (LDG, and LD through generic pointers) whose
registers are read before another load writes them in address order (one that does
is a branch's other arm, a slow path), how many of those are used before any other
load issues ("alone"), and the median of loads in flight
at first use; then the same for the 8- and 16-byte loads alone (the fast paths). Address order is not
execution order across branches (rare slow paths count too), so read it as a lead,
then check the kernel's SASS.
"""
import re
import statistics
import subprocess
import sys

REG = re.compile(r"\bR(\d+)(?:\.64|\.128)?\b")


def regs_of(op):
    """Registers an operand names (R14.64: R14, R15)."""
    out = set()
    for m in re.finditer(r"\bR(\d+)(\.64|\.128)?\b", op):
        n = {"": 1, ".64": 2, ".128": 4}[m.group(2) or ""]
        out.update(range(int(m.group(1)), int(m.group(1)) + n))
    return out


def parse(sass):
    """{kernel: [(opcode, text)]} from cuobjdump -sass output."""
    kernels, cur = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            cur = kernels.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(.*?);", line)
        if m and cur is not None:
            text = re.sub(r"^@!?U?P\w+\s+", "", m.group(1).strip())
            cur.append((text.split()[0] if text else "", text))
    return kernels


def is_load(op):
    """A global (LDG) or generic (LD, e.g. through a pointer table) load."""
    return op.startswith("LDG") or op == "LD" or op.startswith("LD.")


def analyse(ins, vector_only):
    loads, alone, inflight = 0, 0, []
    for i, (op, text) in enumerate(ins):
        if not is_load(op) or (vector_only and not (".64" in op or ".128" in op)):
            continue
        loads += 1
        parts = text.split(None, 1)[1].split(",") if " " in text else []
        width = {"64": 2, "128": 4}.get(next((w for w in ("128", "64") if f".{w}" in op), ""), 1)
        m = REG.search(parts[0]) if parts else None
        if not m:
            continue
        dst = set(range(int(m.group(1)), int(m.group(1)) + width))
        between, used = 0, False
        for op2, text2 in ins[i + 1:]:
            ops2 = text2.split(None, 1)[1].split(",") if " " in text2 else []
            srcs = ops2 if op2.startswith(("ST", "RED", "ATOM")) else ops2[1:]
            if any(regs_of(o) & dst for o in srcs):
                used = True
                break
            if is_load(op2):
                if ops2 and regs_of(ops2[0]) & dst:
                    break  # another load's register now (a slow path's scalar loads)
                between += 1
        if not used:
            continue
        inflight.append(between)
        alone += between == 0
    return loads, alone, inflight


def main():
    cubin = sys.argv[1]
    pat = re.compile(sys.argv[2]) if len(sys.argv) > 2 else None
    sass = subprocess.run(["cuobjdump", "-sass", cubin], capture_output=True, text=True, check=True).stdout
    print(f"{'kernel':40s} {'loads':>5s} {'alone':>6s} {'in flight':>9s} | {'vector':>6s} {'alone':>6s} {'in flight':>9s}")
    for name, ins in sorted(parse(sass).items()):
        if pat and not pat.search(name):
            continue
        cols = []
        for vector_only in (False, True):
            loads, alone, inflight = analyse(ins, vector_only)
            med = statistics.median(inflight) if inflight else 0.0
            cols.append(f"{loads:5d} {alone:6d} {med:9.1f}")
        if not cols[0].startswith("    0"):
            print(f"{name:40s} {cols[0]} | {cols[1]}")


if __name__ == "__main__":
    main()
