#!/bin/bash
# Session 40, call 9: when a shrinking rollout captures a decode bucket's graph. A
# GRPO step's rollout (8 samples of each of 8 prompts, prompt 128, responses of
# random length up to 512 or 64 tokens) with each bucket captured at its third
# step (jetd, JET_EAGER_STEPS 2, the default) or at its first (jetd-e0).
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for n in 512 64; do
  mkdir -p $OUT/g$n
  OUT=$OUT/g$n JET_BENCH_ARGS="--train-steps 0 --batch 64 --group-size 8 --prompt-len 128 --gen-len $n --eos-random" bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 2 jetd,jetd-e0 > $OUT/g$n/main.log 2>&1
  pack; echo "== responses of 1-$n tokens"; grep -E 'rollout' $OUT/g$n/compare.txt | cut -c1-220
done
