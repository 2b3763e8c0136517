"""Summarise a call's jetd bench JSON files and peer outputs in DIR (a short table last)."""
import glob
import json
import os
import sys

d = sys.argv[1]
for path in sorted(glob.glob(os.path.join(d, "bench-*.json"))):
    try:
        j = json.load(open(path))
    except Exception as e:  # a run cut short leaves no JSON
        print(os.path.basename(path), "no json:", e)
        continue
    print("==", os.path.basename(path), j.get("device"))
    for t in j["train"]:
        print(f"train {t['flow']:18} {t['tokens_per_s']:9.0f} tok/s {1e3 * t['step_s']:7.2f} ms"
              f" vs_bf16 {t['vs_bf16']:.3f} med {t['vs_bf16_median']:.3f} of_floor {t.get('of_floor') or 0:.3f}")
    for r in j["rollout"]:
        share = r.get("decode_of_floor")
        print(f"rollout {r['flow']:18} b{r['batch']:<4} {r['tokens_per_s']:9.0f} tok/s vs_bf16 {r['vs_bf16']:.3f}"
              f" decode share {100 * share if share else 0:5.1f}%")
    for s in j["step"]:
        print(f"step {s['flow']:18} {s['total_s']:.3f} / {s['rollout_s']:.3f} / {s['train_s']:.3f} s vs_bf16 {s['vs_bf16']:.3f}")
    tuned = j.get("gemm_tuned", [])
    print("gemm_tuned", len(tuned), "chosen", sum(1 for t in tuned if t.get("chosen")))
for path in sorted(glob.glob(os.path.join(d, "peer-*.txt"))):
    for line in open(path):
        if line.startswith("train") or '"tokens_per_s"' in line:
            print(os.path.basename(path), line.strip()[:200])
