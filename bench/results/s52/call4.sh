#!/bin/bash
# Fifty-second session, call 4: one FP8 DGrad too over q/k/v and gate/up (their W^T stacked, written in place by
# AdamW). Builds (one binary; wrappers set the knobs): sep = JET_WGRAD_STACK=0 JET_DGRAD_STACK=0 (main's GEMMs),
# w = JET_DGRAD_STACK=0 (call 2's stacked WGrad), wd = both stacked (default), bf16.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_stacked cuda_parity gpu_parity; do
  timeout 150 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-80)"; grep -E "panicked|FAILED|failed" $OUT/$t.log | head -5 | cut -c1-200
done
grep -E "PARITY" $OUT/cuda_stacked.log | cut -c1-150
pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b 3 jetd-sep-fp8,jetd-w-fp8,jetd-wd-fp8,jetd-main-bf16 > $OUT/cmp.log 2>&1
echo "compare 0.6b rc $? (${SECONDS}s)"; mv $OUT/compare.txt $OUT/compare-06b.txt; pack
grep -E "train \||step training" $OUT/compare-06b.txt | cut -c1-300
python3 - <<PY
import json, glob
for b in ['jetd_sep_fp8', 'jetd_w_fp8', 'jetd_wd_fp8']:
    for f in sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))[:1]:
        d = json.load(open(f)); t = d['train'][0]
        print(b, 'train', [(k[0][:24], round(k[1] * 1e3, 3), k[2]) for k in t['top_kernels'] if any(s in k[0] for s in ('cublas', 'quant_dual', 'swiglu_bwd', 'rmsnorm_bwd', 'adamw'))])
        for s in d.get('step', []):
            print(b, 'grpo', [(k[0][:24], round(k[1] * 1e3, 2), k[2]) for k in s.get('train_top_kernels', []) if any(x in k[0] for x in ('cublas', 'quant_dual', 'rmsnorm_bwd'))])
PY
if [ $SECONDS -lt 330 ]; then
  timeout $((560 - SECONDS)) bash bench/gpu_check.sh compare qwen3-8b:4 2 jetd-sep-fp8,jetd-wd-fp8,jetd-main-bf16 > $OUT/cmp8.log 2>&1
  echo "compare 8b-4l rc $? (${SECONDS}s)"; pack
  grep -E "train \||step training" $OUT/compare.txt | cut -c1-300
fi
