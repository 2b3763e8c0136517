#!/bin/bash
# Fifty-second session, call 3: the stacked FP8 WGrad at 8B shapes (4 layers: no regression of #11's 1.3x row?),
# then the torch.compile peer at 0.6B on the same machine (#11's bf16 row).
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 330 bash bench/gpu_check.sh compare qwen3-8b:4 3 jetd-sep-fp8,jetd-stack-fp8,jetd-main-bf16 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-250
if [ $SECONDS -lt 400 ]; then
  timeout 170 python3 bench/peer_torch.py --peer compile --no-rollout --preset qwen3-0.6b --json > $OUT/peer-compile.txt 2> $OUT/peer-compile.err
  echo "peer rc $? (${SECONDS}s)"; grep -E '^(#|train)' $OUT/peer-compile.txt | cut -c1-200; pack
fi
