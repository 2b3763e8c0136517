#!/bin/bash
# Session 42, call 4: where the BF16 rows kernel's in-step time comes from: the
# rows GEMMs alone in the forms a step runs them (BF16 out, f32 + residual; hot
# and cold operands, cuda_timing bf16_rows_step_forms), and one bf16 training
# step's kernels under Nsight Compute (ncustep) for the in-step times.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 120 ./.carry/cuda_timing bf16_rows_step_forms --ignored --nocapture > $OUT/forms.log 2>&1
echo "forms rc $?"; grep TIMING $OUT/forms.log | cut -c1-250
pack
timeout 200 bash bench/gpu_check.sh ncustep bf16 qwen3-0.6b > $OUT/ncu.log 2>&1
echo "ncustep rc $?"; grep -iE "rows|total|sum" $OUT/ncu-step-bf16-qwen3-0.6b.txt | head -30
pack
