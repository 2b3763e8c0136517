#!/bin/bash
# Sixtieth session, call 1: the fifty-ninth session's next-call.sh as prepared
# (cuda_parity with the tuning test, fp8_rows_timing staged/direct, gpu_parity with
# ROWS_BF16_DIRECT=1, the 0.6B step with responses of random length), then the 0.6B
# rollout alone (fp8, bf16; batch 64 and 256) for the decode share on this card.
R=$OUT
bash bench/results/s59/next-call.sh
export OUT=/tmp/g7 JET_KERNEL_CACHE_DIR=/tmp/jetk
for f in fp8 bf16; do
  timeout 60 ./.carry/jetd bench --device cuda --preset qwen3-0.6b --flow $f --train-steps 0 --no-kernels --no-cublaslt --json > $OUT/rollout-$f.json 2> $OUT/rollout-$f.err
  echo "rollout $f rc $? (${SECONDS}s)"
done
tar czf $R/logs.tgz -C /tmp g7
python3 bench/results/s60/rollout_share.py /tmp/g7/rollout-fp8.json /tmp/g7/rollout-bf16.json
