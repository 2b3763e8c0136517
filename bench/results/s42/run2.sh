#!/bin/bash
# Session 42, call 2: the rows kernel in clusters of two blocks, the weight tile
# multicast (default build) against one block a tile (JET_ROWS_CLUSTER=1):
# cuda_invariant's bits, the rows GEMMs alone (cuda_timing), the 0.6B training
# step (bf16 and fp8), then gpu_parity (rollout == training bit for bit).
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 100 ./.carry/cuda_invariant --test-threads=1 --nocapture > $OUT/inv.log 2>&1
echo "invariant rc $?"; grep -E "test result|panicked" $OUT/inv.log | tail -3
grep -E "^INVARIANT" $OUT/inv.log | grep -v "cuBLASLt" | grep -v "| 0 \| 0 of\|: 0 " | head -5
pack
for c in 1 2; do
  JET_ROWS_CLUSTER=$c timeout 90 ./.carry/cuda_timing fp8_rows_timing --ignored --nocapture > $OUT/timing-c$c.log 2>&1
  echo "timing c$c rc $?"; grep "TIMING" $OUT/timing-c$c.log | grep " 4096x" | sed 's/split-K.*//' | cut -c1-120
done
pack
JET_BENCH_ARGS="--flow bf16 --batch 64 --gen-len 16 --train-steps 5" timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b 2 jetd-c1,jetd > $OUT/main.log 2>&1
pack
python3 bench/compare_builds.py $OUT/cmp jetd_c1 jetd | grep -E 'train' | cut -c1-220
timeout 170 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E "test result|panicked|MISMATCH" $OUT/gpu_parity.log | cut -c1-200 | tail -8
pack
