#!/bin/bash
# Fifty-second session, call 1 (ran from .carry/): the backward GEMMs with FP8 WGrad swapped, the forward rows GEMMs with q/k/v and gate/up stacked, the quantizers alone.
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 90 ./.carry/cuda_timing backward_gemm_timing --ignored --nocapture > $OUT/bwd_timing.log 2>&1; echo "bwd rc $? (${SECONDS}s)"
timeout 120 ./.carry/cuda_timing fp8_rows_timing --ignored --nocapture > $OUT/rows_timing.log 2>&1; echo "rows rc $? (${SECONDS}s)"
timeout 60 ./.carry/cuda_timing quant_timing --ignored --nocapture > $OUT/quant_timing.log 2>&1; echo "quant rc $? (${SECONDS}s)"
grep TIMING $OUT/bwd_timing.log | cut -c17-300
grep TIMING $OUT/rows_timing.log | cut -c8-200
grep TIMING $OUT/quant_timing.log | cut -c8-200
