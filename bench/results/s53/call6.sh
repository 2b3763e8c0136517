#!/bin/bash
# Fifty-third session, call 6 (branch s53-qk16): q/k before their norms as BF16 with the
# backward loading x as words and shuffling it to the f32 layout. Bit checks first, then
# 0.6B JET_QK_PRE16=0 / default, bf16 and fp8, 3 reps; then the rollout == training check.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 60 ./.carry/cuda_parity qk_norm_rope --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity qk rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_parity.log | tail -1 | cut -c1-60)"
grep -hE "from BF16|from its f32|panicked" $OUT/cuda_parity.log | cut -c1-150; pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 70 bash bench/gpu_check.sh compare qwen3-0.6b 3 jetd-prev-bf16,jetd-main-bf16,jetd-prev-fp8,jetd-wd-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-330
python3 - <<PY
import json, glob
for b in ['jetd_prev_bf16', 'jetd_main_bf16', 'jetd_prev_fp8', 'jetd_wd_fp8']:
    for f in sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))[:1]:
        d = json.load(open(f)); t = d['train'][0]
        print(b, round(t['peak_gib'], 2), [(k[0][:24], round(k[1] * 1e3, 3), k[2]) for k in t['top_kernels'] if any(s in k[0] for s in ('qk_norm', 'rows_tma'))])
PY
timeout 60 ./.carry/gpu_parity rollout_equals_training --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rollout rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/gpu_parity.log | tail -1 | cut -c1-60)"
grep -hE "^PARITY|^MISMATCH" $OUT/gpu_parity.log | cut -c1-150; pack
