#!/bin/bash
# Session 43, call 2: rmsnorm's backward in one kernel for rows other than 128
# (rmsnorm_bwd_rows: dx, its BF16 operand and the blocks' dw column sums in one read
# of dy, x and the residual; was rmsnorm_bwd_dx then colsum_partial) against main
# (jetd-prev): cuda_parity (CPU parity and the norm's fused-path bit checks),
# gpu_parity, the 0.6B training step in bf16 and fp8.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 150 ./.carry/cuda_parity --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity rc $?"; grep -E "test result|panicked|FAILED|failed" $OUT/cuda_parity.log | head -8
grep -iE "rmsnorm" $OUT/cuda_parity.log | head -40 | cut -c1-160
pack
for f in bf16 fp8; do
  JET_BENCH_ARGS="--flow $f --batch 64 --gen-len 16 --train-steps 4" timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b 2 jetd-prev,jetd > $OUT/main-$f.log 2>&1
  mkdir -p $OUT/cmp-$f; mv $OUT/cmp/* $OUT/cmp-$f/
  pack
  python3 bench/compare_builds.py $OUT/cmp-$f jetd_prev jetd | grep -E 'train' | cut -c1-200
done
timeout 150 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E "test result|panicked" $OUT/gpu_parity.log | cut -c1-200 | tail -4
pack
