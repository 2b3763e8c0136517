#!/bin/bash
# Session 40, call 3: the decode attention's shared-prefix pass (fa_dec2_pre: a
# GRPO group's full prompt pages read once for a block of 16 / group rows, each
# row going on from its state; the same bits). cuda_flash (the new
# flash_decode_shared_pages_equal_forward_rows), cuda_invariant, gpu_parity; then
# the rollout with the pass on (jetd) and off (jetd-noshare, JET_DEC_SHARE=0):
# batch 64, 8 samples a prompt, 128 new tokens, prompts of 512 and 128.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_flash cuda_invariant gpu_parity; do
  timeout 300 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1; echo "$t rc $?"; grep -E '^test result' $OUT/$t.log
done
grep -hE 'shared|PLAN' $OUT/cuda_flash.log | cut -c1-150
grep -hE 'FAIL|panicked|differ' $OUT/cuda_flash.log $OUT/cuda_invariant.log | grep -v ' 0 differ' | head -20
grep -hE 'PAGED|paged and preempted' $OUT/gpu_parity.log | cut -c1-150
pack
for p in 512 128; do
  mkdir -p $OUT/p$p
  OUT=$OUT/p$p JET_BENCH_ARGS="--train-steps 0 --batch 64 --group-size 8 --prompt-len $p --gen-len 128" bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 2 jetd-noshare,jetd > $OUT/p$p/main.log 2>&1
  pack
  echo "== prompt $p, 8 samples a prompt, batch 64"; grep -E 'rollout' $OUT/p$p/compare.txt | cut -c1-230
done
