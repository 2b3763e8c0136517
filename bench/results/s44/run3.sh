#!/bin/bash
# Session 44, call 3: the landed form (FP8 rows kernel with the tokens as A and the
# scale products made by its consumers, no scaler warp; BF16 unchanged) against
# main at the session's start (jetd-prev): cuda_invariant, cuda_parity, the rows
# GEMMs alone, the fp8 training step at 0.6B and at Qwen3-8B shapes with 4 layers
# (both builds), the 8B-4l bf16 step (this build) for fp8 / bf16, gpu_parity.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 90 ./.carry/cuda_invariant --test-threads=1 --nocapture > $OUT/cuda_invariant.log 2>&1
echo "invariant rc $?"; grep -E "test result|panicked" $OUT/cuda_invariant.log | tail -3 | cut -c1-200
timeout 100 ./.carry/cuda_parity --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity rc $?"; grep -E "test result|panicked|FAILED|failed" $OUT/cuda_parity.log | head -8 | cut -c1-200
pack
timeout 50 ./.carry/cuda_timing fp8_rows_timing --ignored --nocapture > $OUT/rows06.log 2>&1
JET_TIMING_SHAPES=8b timeout 50 ./.carry/cuda_timing fp8_rows_timing --ignored --nocapture > $OUT/rows8b.log 2>&1
grep -h "TIMING fp8" $OUT/rows06.log $OUT/rows8b.log | grep " 4096x" | sed 's/TIMING //; s/split-K chunks.*//' | cut -c1-110
pack
export JET_BENCH_ARGS="--flow fp8 --batch 64 --gen-len 16 --train-steps 3"
timeout 150 bash bench/gpu_check.sh compare qwen3-0.6b 2 jetd-prev,jetd > $OUT/main-06.log 2>&1
mkdir -p $OUT/cmp-06; mv $OUT/cmp/* $OUT/cmp-06/; pack
python3 bench/compare_builds.py $OUT/cmp-06 jetd_prev jetd | grep -E 'train' | cut -c1-200
timeout 170 bash bench/gpu_check.sh compare qwen3-8b:4 2 jetd-prev,jetd > $OUT/main-8b.log 2>&1
mkdir -p $OUT/cmp-8b; mv $OUT/cmp/* $OUT/cmp-8b/; pack
python3 bench/compare_builds.py $OUT/cmp-8b jetd_prev jetd | grep -E 'train' | cut -c1-200
timeout 60 ./.carry/jetd bench --device cuda --preset qwen3-8b --layers 4 --json --no-kernels --no-cublaslt \
  --flow bf16 --batch 64 --gen-len 16 --train-steps 3 > $OUT/bench-8b4l-bf16.json 2> $OUT/bench-8b4l-bf16.err
echo "8b bf16 rc $?"; pack
python3 - <<'PY'
import json, glob
def med(f):
    d = json.load(open(f)); return [(t['flow'], t['step_median_s'] * 1e3) for t in d['train']]
b = med('/tmp/g/bench-8b4l-bf16.json')[0][1]
for f in sorted(glob.glob('/tmp/g/cmp-8b/*.json')):
    for fl, m in med(f): print(f.split('/')[-1], fl, 'median %.2f ms' % m, 'bf16 (this build) %.2f -> %.3fx' % (b, b / m))
PY
timeout 110 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E "test result|panicked" $OUT/gpu_parity.log | cut -c1-200 | tail -4
pack
