#!/bin/bash
# Session 43, call 1: (a) the rows kernel's prologue before its PDL wait
# (ROWS_EARLY=1: barrier init, tensor-map prefetch, L2 prefetch of the first
# weight boxes) against the landed kernel, one binary: cuda_invariant's bits and
# the 0.6B training step (bf16, fp8); (b) the bound on one launch for q, k, v and
# one for gate, up (cuda_timing bf16_rows_grouping_bound).
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for v in 0 1; do
  JET_NVRTC_DEFINES="ROWS_EARLY=$v" timeout 60 ./.carry/cuda_invariant --test-threads=1 --nocapture > $OUT/inv-early$v.log 2>&1
  echo "invariant early$v rc $?"; grep -E "test result|panicked" $OUT/inv-early$v.log | tail -2
  JET_NVRTC_DEFINES="ROWS_EARLY=$v" timeout 60 ./.carry/cuda_timing bf16_rows_grouping_bound --ignored --nocapture > $OUT/group-early$v.log 2>&1
  echo "grouping early$v rc $?"; grep TIMING $OUT/group-early$v.log | cut -c1-250
done
pack
for f in bf16 fp8; do
  JET_BENCH_ARGS="--flow $f --batch 64 --gen-len 16 --train-steps 4" timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b 2 jetd,jetd-early > $OUT/main-$f.log 2>&1
  mkdir -p $OUT/cmp-$f; mv $OUT/cmp/* $OUT/cmp-$f/
  pack
  python3 bench/compare_builds.py $OUT/cmp-$f jetd jetd_early | grep -E 'train' | cut -c1-200
done
pack
