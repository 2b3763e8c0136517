#!/bin/bash
# Session 43, call 5: SwiGLU's BF16 operand four (row, group) pairs a warp and the attention backward's prep four heads a warp
# at once, all their loads first (one pair, one head a warp before)
# against main (jetd-prev): cuda_invariant (rollout == training bits), cuda_parity,
# gpu_parity, the 0.6B training step in bf16 and fp8.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_invariant cuda_parity gpu_parity; do
  timeout 150 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $?"; grep -E "test result|panicked" $OUT/$t.log | head -3
  pack
done
for f in bf16 fp8; do
  JET_BENCH_ARGS="--flow $f --batch 64 --gen-len 16 --train-steps 4" timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b 2 jetd-prev,jetd > $OUT/main-$f.log 2>&1
  mkdir -p $OUT/cmp-$f; mv $OUT/cmp/* $OUT/cmp-$f/
  pack
  python3 bench/compare_builds.py $OUT/cmp-$f jetd_prev jetd | grep -E 'train|rollout' | cut -c1-200
done
pack
