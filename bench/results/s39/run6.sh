#!/bin/bash
# Session 39, call 6: micro-batches by tokens (train.micro_batch_tokens, bench
# --train-tokens) and micro-batches that keep a prompt's samples together. gpu_parity
# on this build (its shared-rows test with micro-batches of 4 and 2); the 0.6B
# GRPO-shaped step with responses of random length (1-512 tokens, prompt 128, 8
# samples a prompt): micro-batches of 8 sequences (jetd-count) against up to 64
# sequences and 8,192 tokens (jetd-tok), the same binary, one run each.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E '^test result' $OUT/gpu_parity.log; grep -E 'shared vs unshared' $OUT/gpu_parity.log | cut -c1-140
pack
JET_BENCH_ARGS="--train-steps 1 --batch 64 --group-size 8 --prompt-len 128 --gen-len 512 --eos-random" bash bench/gpu_check.sh compare qwen3-0.6b 1 jetd-count,jetd-tok > $OUT/main.log 2>&1
pack
python3 bench/compare_builds.py $OUT/cmp jetd_count jetd_tok | grep -E 'step|phase' | cut -c1-170
tail -3 $OUT/main.log
