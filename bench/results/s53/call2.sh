#!/bin/bash
# Fifty-third session, call 2: stacked WGrad+DGrad at 8B shapes (4 layers), then the torch.compile peer at 0.6B.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 330 bash bench/gpu_check.sh compare qwen3-8b:4 2 jetd-sep-fp8,jetd-w-fp8,jetd-wd-fp8,jetd-main-bf16 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "train \||step training|rollout" $OUT/compare.txt | cut -c1-300
timeout $((560 - SECONDS)) python3 bench/peer_torch.py --peer compile --no-rollout --preset qwen3-0.6b --json > $OUT/peer-compile.txt 2> $OUT/peer-compile.err
echo "peer rc $? (${SECONDS}s)"; grep -E '^(#|train)' $OUT/peer-compile.txt | cut -c1-200; tail -3 $OUT/peer-compile.err; pack
