#!/bin/bash
# Fifty-seventh session, calls 4 and 5, on call 3's machine while it was warm (the
# commands as run; logs in call3-h100/): the GRPO-shaped step's old micro-batches
# (8 sequences, no token bound; eight WGrad outputs held) in the fp8 flow with the
# scatter settling its rows (JET_SCATTER_SETTLE=1, which now applies only where a
# gradient holds one addend) and without, two reps; then the torch.compile peer,
# which did not finish in the 140 s the session's device time left.
export JET_KERNEL_CACHE_DIR=/tmp/jetk
gunzip -f .carry/*.gz 2>/dev/null
for r in 1 2; do for v in 0 1; do
  JET_SCATTER_SETTLE=$v timeout 40 ./.carry/jetd bench --device cuda --preset qwen3-0.6b --json --no-cublaslt --no-kernels \
    --flow fp8 --batch 64 --gen-len 16 --train-steps 1 --step-micro-seqs 8 --step-micro-tokens 0 > $OUT/m8-s$v-$r.json 2>/dev/null
done; done
timeout 140 python3 bench/peer_torch.py --peer compile --no-rollout --preset qwen3-0.6b --json > $OUT/peer-compile-qwen3-0.6b.txt 2> $OUT/peer-compile-qwen3-0.6b.err
