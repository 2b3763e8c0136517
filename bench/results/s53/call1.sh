#!/bin/bash
# Fifty-third session, call 1: branch s52-dgrad (stacked FP8 DGrad) checks, then 0.6B
# sep (no stacking) / w (stacked WGrad only: main's path) / wd (WGrad + DGrad stacked) / bf16, 3 reps interleaved.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_stacked gpu_parity cuda_parity; do
  timeout 120 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-80)"; grep -E "panicked|FAILED|failed" $OUT/$t.log | head -5 | cut -c1-200
done
grep -E "PARITY|bit-identical" $OUT/cuda_stacked.log | cut -c1-150
pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout $((570 - SECONDS)) bash bench/gpu_check.sh compare qwen3-0.6b 3 jetd-sep-fp8,jetd-w-fp8,jetd-wd-fp8,jetd-main-bf16 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-300
python3 - <<PY
import json, glob
for b in ['jetd_w_fp8', 'jetd_wd_fp8']:
    for f in sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))[:1]:
        d = json.load(open(f))
        t = d['train'][0]
        print(b, 'train', [(k[0][:24], round(k[1] * 1e3, 3), k[2]) for k in t['top_kernels'] if any(s in k[0] for s in ('cublas', 'quant', 'swiglu_bwd', 'adamw'))])
PY
