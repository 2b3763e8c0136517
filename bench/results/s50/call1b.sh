#!/bin/bash
# call1.sh cut to a short lease (the session's last device time): the GPU tests that check this branch's kernels,
# 0.6B two reps interleaved, then the backward GEMMs' timing. Builds as in call1.sh.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_parity cuda_flash gpu_parity; do
  timeout 120 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-80)"; grep -E "panicked" $OUT/$t.log | head -5 | cut -c1-200
done
pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b 2 jetd-main-fp8,jetd-s50-fp8,jetd-main-bf16,jetd-s50-bf16 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-250
python3 - <<PY
import json, glob
for b in ['jetd_main_fp8', 'jetd_s50_fp8', 'jetd_main_bf16', 'jetd_s50_bf16']:
    for f in sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))[:1]:
        d = json.load(open(f))
        t = d['train'][0]
        print(b, 'train', [(k[0][:24], round(k[1] * 1e3, 3)) for k in t['top_kernels'] if any(s in k[0] for s in ('softmax', 'settle', 'sumsq', 'bwd_prep', 'qk_norm_rope', 'rows'))])
        for s in d.get('step', []):
            print(b, 'grpo', [(k[0][:24], round(k[1] * 1e3, 2), k[2]) for k in s.get('train_top_kernels', []) if any(x in k[0] for x in ('settle', 'qk_norm', 'colsum', 'rmsnorm_bwd', 'sumsq'))])
PY
timeout 60 ./.carry/cuda_timing backward_gemm_timing --ignored --nocapture > $OUT/bwd_timing.log 2>&1
echo "bwd timing rc $? (${SECONDS}s)"; grep TIMING $OUT/bwd_timing.log | cut -c17-250
pack
