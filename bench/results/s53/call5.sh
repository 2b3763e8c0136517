#!/bin/bash
# Fifty-third session, call 5: q and k before their norms kept as BF16 (qk_norm_rope_*_x16,
# qk_norm_rope_bwd_x16): checks, then 0.6B JET_QK_PRE16=0 (prev) / default, bf16 and fp8, 3 reps interleaved.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_parity gpu_parity; do
  timeout 120 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-60)"; grep -E "panicked|FAILED|failed" $OUT/$t.log | head -5 | cut -c1-200
done
grep -hE "from BF16|from its f32" $OUT/cuda_parity.log | cut -c1-150
grep -hE "rollout.*training|bit-identical|mismatch" $OUT/gpu_parity.log | head -8 | cut -c1-150
pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout $((400 - SECONDS)) bash bench/gpu_check.sh compare qwen3-0.6b 3 jetd-prev-bf16,jetd-main-bf16,jetd-prev-fp8,jetd-wd-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-330
python3 - <<PY
import json, glob
for b in ['jetd_prev_bf16', 'jetd_main_bf16', 'jetd_prev_fp8', 'jetd_wd_fp8']:
    for f in sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))[:1]:
        d = json.load(open(f)); t = d['train'][0]
        print(b, round(t['peak_gib'], 2), [(k[0][:24], round(k[1] * 1e3, 3), k[2]) for k in t['top_kernels'] if any(s in k[0] for s in ('qk_norm', 'rows_tma'))])
PY
