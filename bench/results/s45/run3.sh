#!/bin/bash
# Forty-fifth session, call 3: the dual quantizers' loads all in flight before their
# first use (load_rows4): the bitwise checks (cuda_parity's and cuda_act's fused-vs-
# unfused equalities, gpu_parity), then the 8B-4l and 0.6B fp8 steps against call 2's
# binary (jetd-prev) in one call, 8B-4l fp8 with its kernel table, and bf16 for the ratio.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_parity cuda_act gpu_parity; do
  timeout 100 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $?"; grep -E "test result|panicked" $OUT/$t.log | tail -2 | cut -c1-200
done
pack
export JET_BENCH_ARGS="--flow fp8 --batch 64 --gen-len 16 --train-steps 3"
timeout 170 bash bench/gpu_check.sh compare qwen3-8b:4 2 jetd-prev,jetd > $OUT/c8.log 2>&1
mkdir -p $OUT/cmp-8b; mv $OUT/cmp/* $OUT/cmp-8b/; pack
python3 bench/compare_builds.py $OUT/cmp-8b jetd_prev jetd | grep -E 'train' | cut -c1-200
timeout 70 bash bench/gpu_check.sh compare qwen3-0.6b 1 jetd-prev,jetd > $OUT/c06.log 2>&1
mkdir -p $OUT/cmp-06; mv $OUT/cmp/* $OUT/cmp-06/; pack
python3 bench/compare_builds.py $OUT/cmp-06 jetd_prev jetd | grep -E 'train' | cut -c1-200
timeout 60 ./.carry/jetd bench --device cuda --json --no-cublaslt --preset qwen3-8b --layers 4 --flow fp8 --batch 64 --gen-len 16 --train-steps 3 > $OUT/k8-fp8.json 2> $OUT/k8-fp8.err; echo "kernels rc $?"; pack
export JET_BENCH_ARGS="--flow bf16 --batch 64 --gen-len 16 --train-steps 3"
timeout 100 bash bench/gpu_check.sh compare qwen3-8b:4,qwen3-0.6b 1 jetd > $OUT/cb.log 2>&1
mkdir -p $OUT/cmp-bf16; mv $OUT/cmp/* $OUT/cmp-bf16/; pack
python3 bench/compare_builds.py $OUT/cmp-bf16 jetd | grep -E 'train' | cut -c1-200
python3 -c "
import json; d=json.load(open('$OUT/k8-fp8.json'))
for k in d['train'][0]['top_kernels'][:14]: print('%-34s %7.3f ms %3d' % (k[0], k[1]*1e3, k[2]))
"
