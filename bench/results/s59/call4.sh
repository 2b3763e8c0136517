#!/bin/bash
# The fifty-ninth session's call 4 (call 3's machine, warm): the 8B-4l jetd bench and
# the PyTorch training peers at 0.6B, for the headline with call 3's 0.6B bench.
# jetd as call 3's, run with JET_NVRTC_DEFINES=ROWS_RES_PREFETCH=0 (the prefetch is
# not landed: this is main's kernel).
R=$OUT; export OUT=/tmp/g4; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g4; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
JET_NVRTC_DEFINES=ROWS_RES_PREFETCH=0 timeout 200 ./.carry/jetd bench --device cuda --preset qwen3-8b --layers 4 --json > $OUT/bench-qwen3-8b-4l.json 2> $OUT/bench-qwen3-8b-4l.err
echo "bench 8B-4l rc $? (${SECONDS}s)"; pack
python3 - $OUT/bench-qwen3-8b-4l.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for t in d["train"]:
    print("train", t["flow"], round(t["tokens_per_s"]), round(t["step_s"] * 1e3, 2), "ms vs_bf16 %.3f med %.3f" % (t["vs_bf16"], t["vs_bf16_median"]))
for r in d["rollout"]:
    print("rollout", r["flow"], r["batch"], round(r["tokens_per_s"]), "vs_bf16 %.3f" % r["vs_bf16"])
for s in d["step"]:
    print("step", s["flow"], round(s["total_s"], 3), round(s["rollout_s"], 3), round(s["train_s"], 3), "vs_bf16 %.3f" % s["vs_bf16"])
PY
timeout 250 python3 bench/peer_torch.py --peer compile --no-rollout --preset qwen3-0.6b --json > $OUT/peer-compile-qwen3-0.6b.txt 2> $OUT/peer-compile-qwen3-0.6b.err
echo "peer compile rc $? (${SECONDS}s)"; grep -E '^train' $OUT/peer-compile-qwen3-0.6b.txt | cut -c1-160; pack
timeout 100 python3 bench/peer_torch.py --peer sdpa --no-rollout --preset qwen3-0.6b --json > $OUT/peer-sdpa-qwen3-0.6b.txt 2> $OUT/peer-sdpa-qwen3-0.6b.err
echo "peer sdpa rc $? (${SECONDS}s)"; grep -E '^train' $OUT/peer-sdpa-qwen3-0.6b.txt | cut -c1-160; pack
