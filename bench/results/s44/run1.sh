#!/bin/bash
# Session 44, call 1: the rows kernel with the tokens as wgmma's A operand
# (ROWS_TOK_M=1, the build's default; =2 also makes the FP8 token scales' products
# in the consumers, no scaler warp) against the weights as A (ROWS_TOK_M=0), one
# binary: cuda_invariant (rollout == training bits) for 1 and 2, the rows GEMMs
# alone (0.6B and 8B shapes, FP8 and BF16; BF16 step forms), cuda_parity.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for v in 1 2; do
  JET_NVRTC_DEFINES="ROWS_TOK_M=$v" timeout 90 ./.carry/cuda_invariant --test-threads=1 --nocapture > $OUT/inv-tm$v.log 2>&1
  echo "invariant tm$v rc $?"; grep -E "test result|panicked" $OUT/inv-tm$v.log | tail -3 | cut -c1-200
  pack
done
for v in 0 1 2; do
  JET_NVRTC_DEFINES="ROWS_TOK_M=$v" timeout 60 ./.carry/cuda_timing fp8_rows_timing --ignored --nocapture > $OUT/rows06-tm$v.log 2>&1
  JET_TIMING_SHAPES=8b JET_NVRTC_DEFINES="ROWS_TOK_M=$v" timeout 60 ./.carry/cuda_timing fp8_rows_timing --ignored --nocapture > $OUT/rows8b-tm$v.log 2>&1
  [ $v != 2 ] && JET_NVRTC_DEFINES="ROWS_TOK_M=$v" timeout 60 ./.carry/cuda_timing bf16_rows_step_forms --ignored --nocapture > $OUT/forms-tm$v.log 2>&1
  pack
done
timeout 150 ./.carry/cuda_parity --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity rc $?"; grep -E "test result|panicked|FAILED|failed" $OUT/cuda_parity.log | head -8 | cut -c1-200
pack
for v in 0 1 2; do echo "== tm$v"; grep -h TIMING $OUT/rows06-tm$v.log $OUT/rows8b-tm$v.log | grep " 4096x" | sed 's/TIMING //' | sed 's/split-K chunks.*//' | cut -c1-120; [ -f $OUT/forms-tm$v.log ] && grep -h TIMING $OUT/forms-tm$v.log | sed 's/TIMING bf16 step forms //' | cut -c1-170; done
