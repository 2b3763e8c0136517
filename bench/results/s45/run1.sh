#!/bin/bash
# Forty-fifth session, call 1: the checks the tokens-as-A FP8 rows forms (ROWS_FP8_TOK_A=1,2)
# have not had (cuda_act's BF16-output epilogue, gpu_parity's whole step), then the 8B-4l and
# 0.6B fp8 steps of forms 0, 1, 2 in one binary, then 8B-4l bf16 for the fp8/bf16 ratio.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for v in 1 2; do
  export JET_NVRTC_DEFINES="ROWS_FP8_TOK_A=$v"
  timeout 60 ./.carry/cuda_act --test-threads=1 --nocapture > $OUT/act-$v.log 2>&1
  echo "cuda_act tma$v rc $?"; grep -E "test result|panicked" $OUT/act-$v.log | tail -2 | cut -c1-200
  timeout 90 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gp-$v.log 2>&1
  echo "gpu_parity tma$v rc $?"; grep -E "test result|panicked" $OUT/gp-$v.log | tail -2 | cut -c1-200
  timeout 60 ./.carry/cuda_invariant --test-threads=1 --nocapture > $OUT/inv-$v.log 2>&1
  echo "cuda_invariant tma$v rc $?"; grep -E "test result|panicked" $OUT/inv-$v.log | tail -2 | cut -c1-200
  pack
done
unset JET_NVRTC_DEFINES
export JET_BENCH_ARGS="--flow fp8 --batch 64 --gen-len 16 --train-steps 3"
for s in qwen3-8b:4 qwen3-0.6b; do
  t=${s//[-.:]/_}
  timeout 200 bash bench/gpu_check.sh compare $s 2 jetd,jetd-tma1,jetd-tma2 > $OUT/main-$t.log 2>&1
  mkdir -p $OUT/cmp-$t; mv $OUT/cmp/* $OUT/cmp-$t/; pack
  python3 bench/compare_builds.py $OUT/cmp-$t jetd jetd_tma1 jetd_tma2 | grep -E 'train' | cut -c1-200
done
export JET_BENCH_ARGS="--flow bf16 --batch 64 --gen-len 16 --train-steps 3"
timeout 80 bash bench/gpu_check.sh compare qwen3-8b:4 1 jetd > $OUT/bf16-8b4.log 2>&1
mkdir -p $OUT/cmp-bf16; mv $OUT/cmp/* $OUT/cmp-bf16/; pack
python3 bench/compare_builds.py $OUT/cmp-bf16 jetd | grep -E 'train' | cut -c1-200
