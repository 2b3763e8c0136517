#!/bin/bash
# Session 42, call 9: the rows kernel's residual epilogue loading the whole tile's
# residual values (64 a thread) before its stores (RES_PARTS=1, this build's
# default) against half at a time (RES_PARTS=2, the previous kernel), one binary:
# cuda_invariant's bits, the step forms alone, the 0.6B bf16 training step.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 60 ./.carry/cuda_invariant --test-threads=1 --nocapture > $OUT/inv.log 2>&1
echo "invariant rc $?"; grep -E "test result|panicked" $OUT/inv.log | tail -3
pack
for v in 2 1; do
  JET_NVRTC_DEFINES="RES_PARTS=$v" timeout 40 ./.carry/cuda_timing bf16_rows_step_forms --ignored --nocapture > $OUT/forms-parts$v.log 2>&1
  echo "forms parts$v rc $?"; grep TIMING $OUT/forms-parts$v.log | grep -E "o_proj|down" | sed 's/TIMING bf16 step forms 4096x//' | cut -c1-200
done
pack
JET_BENCH_ARGS="--flow bf16 --batch 64 --gen-len 16 --train-steps 3" timeout 150 bash bench/gpu_check.sh compare qwen3-0.6b 2 jetd-parts2,jetd > $OUT/main.log 2>&1
pack
python3 bench/compare_builds.py $OUT/cmp jetd_parts2 jetd | grep -E 'train' | cut -c1-200
