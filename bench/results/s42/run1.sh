#!/bin/bash
# Session 42, call 1: the BF16 rows kernel in half-group stages with one stage's
# MMAs kept queued (default build) against whole-group stages (ROWS_BF16_WHOLE=1:
# the previous kernel) and the half stages without the early residual
# (ROWS_RES_EARLY=0), one binary switched by JET_NVRTC_DEFINES: cuda_invariant's
# bits, the rows GEMMs alone (cuda_timing), and the 0.6B bf16 training step.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for v in "" "ROWS_RES_EARLY=0"; do
  JET_NVRTC_DEFINES="$v" timeout 100 ./.carry/cuda_invariant --test-threads=1 --nocapture > $OUT/inv-${v:-default}.log 2>&1
  echo "invariant [$v] rc $?"; grep -E "test result|panicked" $OUT/inv-${v:-default}.log | tail -3
  grep -E "^INVARIANT" $OUT/inv-${v:-default}.log | grep -v " 0 of\| 0 differ\|: 0 \|cuBLASLt" | head -5
done
pack
for v in "ROWS_BF16_WHOLE=1" ""; do
  JET_NVRTC_DEFINES="$v" timeout 90 ./.carry/cuda_timing fp8_rows_timing --ignored --nocapture > $OUT/timing-${v:-default}.log 2>&1
  echo "timing [$v] rc $?"; grep "TIMING bf16" $OUT/timing-${v:-default}.log | cut -c1-140
done
pack
JET_BENCH_ARGS="--flow bf16 --batch 64 --gen-len 16 --train-steps 5" timeout 300 bash bench/gpu_check.sh compare qwen3-0.6b 2 jetd-whole,jetd,jetd-noearly > $OUT/main.log 2>&1
pack
python3 bench/compare_builds.py $OUT/cmp jetd_whole jetd jetd_noearly | grep -E 'train|step' | cut -c1-220
