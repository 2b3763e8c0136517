#!/usr/bin/env python3
"""Plot a `jetd compare --metrics-dir DIR` run: mismatch and accuracy per flow.

    jetd compare configs/qwen3-0.6b-longhorizon.toml --metrics-dir cmp
    python3 bench/plot_compare.py cmp                # writes cmp/compare.png and .svg
    python3 bench/plot_compare.py cmp --out fig/lh   # writes fig/lh.png and fig/lh.svg

Reads every *.jsonl in DIR (one metrics record per line, as `jetd compare` and
`jetd run --metrics-out` write them; the flow is taken from each record, so
per-flow `jetd run` files work too) and draws three panels:

1. mismatch_kl per response-length bucket, per flow, on a log scale: the
   token-weighted mean over all RL steps of the `mismatch_by_length` buckets
   (powers of two of the response length in tokens). A flow whose mismatch is
   exactly 0 (fp8 and bf16 when rollout and training compute the same numbers)
   cannot sit on a log axis: it is drawn on the panel's floor and labelled so.
2. held-out accuracy at each evaluation step, per flow;
3. rollout accuracy (share correct) per length bucket, per flow.

Needs matplotlib (pip install matplotlib); nothing else beyond the standard library.
"""

import argparse
import glob
import json
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")  # files only: the GPU machine has no display
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_compare.py needs matplotlib: pip install matplotlib")

FLOW_ORDER = ["bf16", "bf16-fp8rollout", "fp8", "f32"]
# Distinct markers: fp8 and bf16 both sit on the floor when exactly 0.
MARKERS = {"bf16": "s", "bf16-fp8rollout": "o", "fp8": "^", "f32": "x"}


def load(folder):
    """{flow: [rl records in step order]} from every *.jsonl in folder."""
    if not os.path.isdir(folder):
        sys.exit(f"{folder}: no such folder (give the --metrics-dir of jetd compare)")
    files = sorted(glob.glob(os.path.join(folder, "*.jsonl")))
    if not files:
        sys.exit(f"{folder}: no *.jsonl metrics files")
    flows = {}
    for path in files:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}:{n}: not JSON ({e})")
                if not isinstance(rec, dict) or "flow" not in rec:
                    sys.exit(f"{path}:{n}: not a metrics record (no `flow` field)")
                if rec.get("phase") == "rl":
                    flows.setdefault(rec["flow"], []).append(rec)
    if not flows:
        sys.exit(f"{folder}: no RL steps in {len(files)} file(s)")
    for recs in flows.values():
        recs.sort(key=lambda r: r.get("step", 0))
    return dict(sorted(flows.items(), key=lambda kv: rank(kv[0])))


def rank(flow):
    return FLOW_ORDER.index(flow) if flow in FLOW_ORDER else len(FLOW_ORDER)


def buckets(recs):
    """[(lo, hi, kl_mean, accuracy, responses)] merged over steps, by lo."""
    acc = {}
    for r in recs:
        for b in r.get("mismatch_by_length", []):
            t = acc.setdefault(b["lo"], {"hi": b["hi"], "kl": 0.0, "tok": 0, "ok": 0, "n": 0})
            t["kl"] += b["kl_mean"] * b["tokens"]
            t["tok"] += b["tokens"]
            t["ok"] += b["correct"]
            t["n"] += b["responses"]
    return [
        (lo, t["hi"], t["kl"] / max(t["tok"], 1), t["ok"] / max(t["n"], 1), t["n"])
        for lo, t in sorted(acc.items())
    ]


def label(lo, hi):
    return f"{lo}-{hi - 1}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="the --metrics-dir of jetd compare")
    ap.add_argument("--out", help="output path without extension (default DIR/compare)")
    ap.add_argument("--dpi", type=int, default=120, help="PNG resolution (default 120)")
    a = ap.parse_args()
    flows = load(a.dir)
    per_flow = {f: buckets(r) for f, r in flows.items()}
    if not any(per_flow.values()):
        sys.exit(
            f"{a.dir}: no record has `mismatch_by_length` (written by a jetd older than"
            " the per-length buckets): run jetd compare again"
        )
    edges = sorted({(lo, hi) for bs in per_flow.values() for lo, hi, *_ in bs})
    xs = {e: i for i, e in enumerate(edges)}
    positive = [kl for bs in per_flow.values() for _, _, kl, _, _ in bs if kl > 0]
    floor = min(positive) / 100 if positive else 1e-12

    fig, (ax_kl, ax_ho, ax_acc) = plt.subplots(1, 3, figsize=(17, 4.8))
    for flow, bs in per_flow.items():
        mk = MARKERS.get(flow, "d")
        x = [xs[(lo, hi)] for lo, hi, *_ in bs]
        kl = [k for _, _, k, _, _ in bs]
        if all(k == 0 for k in kl):
            ax_kl.plot(x, [floor] * len(x), mk + "--", label=f"{flow} (exactly 0, drawn at floor)")
        else:
            ax_kl.plot(x, [max(k, floor) for k in kl], mk + "-", label=flow)
        ax_acc.plot(x, [acc for _, _, _, acc, _ in bs], mk + "-", label=flow)
        ho = [(r["step"], r["heldout_accuracy"]) for r in flows[flow] if "heldout_accuracy" in r]
        if ho:
            ax_ho.plot(*zip(*ho), mk + "-", label=flow)
    names = [label(lo, hi) for lo, hi in edges]
    for ax in (ax_kl, ax_acc):
        ax.set_xticks(range(len(edges)), names)
        ax.set_xlabel("response length (tokens)")
    ax_kl.set_yscale("log")
    ax_kl.set_ylabel("mismatch_kl (K3, mean over tokens)")
    ax_kl.set_title("rollout vs trainer mismatch by response length")
    ax_ho.set_xlabel("RL step")
    ax_ho.set_ylabel("held-out accuracy (greedy)")
    ax_ho.set_ylim(0, 1)
    ax_ho.set_title("held-out accuracy over RL steps")
    ax_acc.set_ylabel("rollout accuracy (share correct)")
    ax_acc.set_ylim(0, 1)
    ax_acc.set_title("rollout accuracy by response length")
    for ax in (ax_kl, ax_ho, ax_acc):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = a.out or os.path.join(a.dir, "compare")
    if os.path.dirname(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
    for ext in ("png", "svg"):
        fig.savefig(f"{out}.{ext}", dpi=a.dpi)
        print(f"wrote {out}.{ext}")


if __name__ == "__main__":
    main()
