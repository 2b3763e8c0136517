#!/bin/bash
# Session 40, call 1: micro-batches by tokens (train.micro_batch_tokens, bench
# --train-tokens), measured for the first time. The GRPO-shaped step with responses
# of random length (1-512 tokens, prompt 128, 8 samples a prompt, batch 64), the same
# binary: micro-batches of 8 sequences (jetd-m8) against up to 64 sequences within
# 8,192 (jetd-t8k) or 16,384 tokens (jetd-t16k); 0.6B and 8B-4l.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
JET_BENCH_ARGS="--train-steps 1 --batch 64 --group-size 8 --prompt-len 128 --gen-len 512 --eos-random" bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 1 jetd-m8,jetd-t8k,jetd-t16k > $OUT/main.log 2>&1
pack
python3 bench/compare_builds.py $OUT/cmp jetd_m8 jetd_t8k jetd_t16k | grep -E 'step|phase' | cut -c1-200
grep -h "rc [^0]" $OUT/main.log | head; tail -2 $OUT/cmp/*.err | grep -iv "^$" | tail -12
