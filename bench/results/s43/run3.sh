#!/bin/bash
# Session 43, call 3: the gradient norm's sum of squares with sixteen loads in
# flight a thread (same order of adds) against the previous build (jetd-prev):
# cuda_parity, the 0.6B bf16 training step; then Nsight Compute metrics of the (failed: ncu could not replay colsum_final and timed out;
# bench/ncu_metrics.py, removed) bf16 step's memory-bound kernels.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 150 ./.carry/cuda_parity --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity rc $?"; grep -E "test result|panicked" $OUT/cuda_parity.log | head -4
grep -E "sum_squares|sumsq" $OUT/cuda_parity.log | head -8 | cut -c1-160
pack
JET_BENCH_ARGS="--flow bf16 --batch 64 --gen-len 16 --train-steps 4" timeout 150 bash bench/gpu_check.sh compare qwen3-0.6b 2 jetd-prev,jetd > $OUT/main-bf16.log 2>&1
pack
python3 bench/compare_builds.py $OUT/cmp jetd_prev jetd | grep -E 'train' | cut -c1-200
A=(bench --device cuda --json --no-kernels --no-cublaslt --flow bf16 --preset qwen3-0.6b --batch 1 --gen-len 2 --prompt-len 16 --train-steps 1)
K='qk_norm_rope|qk_norm_rope_bwd|swiglu_operand_gu16|softmax_chunk_stats_z16|sumsq_partial_multi|rmsnorm_operand_rows|rmsnorm_bwd_rows1|fa_bwd_prep|swiglu_bwd_bf16_dh16_gu16|colsum_final|token_logprobs_bwd_z16|grad_settle|adamw_multi|embedding_bwd|pad_bf16_f32_x4'
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
timeout 240 ncu --clock-control none --cache-control none -k "regex:^($K)\$" --metrics $M --csv --print-units base \
  --log-file $OUT/ncu-metrics-bf16.csv ./.carry/jetd "${A[@]}" > /dev/null 2> $OUT/ncu-metrics.err
echo "ncu rc $?"
python3 bench/ncu_metrics.py $OUT/ncu-metrics-bf16.csv | tee $OUT/ncu-metrics-bf16.txt
pack
