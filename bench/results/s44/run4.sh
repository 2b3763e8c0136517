#!/bin/bash
# Session 44, call 2 (run3.sh never ran: no machine; this is its trimmed form for the
# device time left): the landed form (FP8 rows kernel with the tokens as A, the scale
# products made by its consumers, no scaler warp; BF16 unchanged) against main at the
# session's start (jetd-prev): cuda_invariant, cuda_parity, gpu_parity, the 8B-4l
# training step (fp8 both builds, bf16 this build), the 0.6B fp8 step (both builds),
# the FP8 rows GEMMs alone at 8B shapes. One run each (no time for two).
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 60 ./.carry/cuda_invariant --test-threads=1 --nocapture > $OUT/cuda_invariant.log 2>&1
echo "invariant rc $?"; grep -E "test result|panicked" $OUT/cuda_invariant.log | tail -3 | cut -c1-200
timeout 70 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E "test result|panicked" $OUT/gpu_parity.log | cut -c1-200 | tail -4
pack
timeout 80 ./.carry/cuda_parity --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity rc $?"; grep -E "test result|panicked|FAILED|failed" $OUT/cuda_parity.log | head -8 | cut -c1-200
pack
A="--device cuda --json --no-kernels --no-cublaslt --batch 64 --gen-len 16 --train-steps 3"
for r in "jetd-prev fp8 qwen3-8b" "jetd fp8 qwen3-8b" "jetd bf16 qwen3-8b" "jetd-prev fp8 qwen3-0.6b" "jetd fp8 qwen3-0.6b"; do
  set -- $r; L=(); [ $3 = qwen3-8b ] && L=(--layers 4)
  n=bench-$3-$2-$1
  timeout 60 ./.carry/$1 bench $A --preset $3 "${L[@]}" --flow $2 > $OUT/$n.json 2> $OUT/$n.err
  echo "$n rc $?"; pack
  python3 -c "
import json; d=json.load(open('$OUT/$n.json'))
for t in d['train']: print('  train', t['flow'], round(t['tokens_per_s']), 'median %.2f ms' % (t['step_median_s']*1e3))
" 2>/dev/null
done
JET_TIMING_SHAPES=8b timeout 30 ./.carry/cuda_timing fp8_rows_timing --ignored --nocapture > $OUT/rows8b.log 2>&1
grep -h "TIMING fp8" $OUT/rows8b.log | grep " 4096x" | sed 's/TIMING //; s/split-K chunks.*//' | cut -c1-110
pack
