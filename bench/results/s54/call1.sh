#!/bin/bash
# Fifty-fourth session, call 1 (branch s54-qk16: the fifty-third session's prepared
# s53-qk16, q/k before their norms as BF16 with a word-loading backward, plus the
# q/k norm backward's occupancy switches QK_BWD_MINB / QK_BWD_QR).
# Bit checks (default and MINB=3 QR=3), then 0.6B bf16 / fp8: JET_QK_PRE16=0 (f32 q/k),
# the default, and the occupancy variants, 3 reps interleaved; then rollout == training.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 60 ./.carry/cuda_parity qk_norm_rope --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity qk rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_parity.log | tail -1 | cut -c1-60)"
JET_NVRTC_DEFINES="QK_BWD_MINB=3 QK_BWD_QR=3" timeout 60 ./.carry/cuda_parity qk_norm_rope --test-threads=1 --nocapture > $OUT/cuda_parity_m3.log 2>&1
echo "cuda_parity qk MINB=3 QR=3 rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_parity_m3.log | tail -1 | cut -c1-60)"
grep -hE "from BF16|from its f32|panicked" $OUT/cuda_parity*.log | cut -c1-150; pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
B=jb-f32,jb-x16,jb-m3,jb-m4,jf-f32,jf-x16,jf-m3,jf-m4
timeout 300 bash bench/gpu_check.sh compare qwen3-0.6b 3 $B > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-330
python3 - <<PY
import json, glob
for b in '$B'.split(','):
    b = b.replace('-', '_')
    for f in sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))[:1]:
        d = json.load(open(f)); t = d['train'][0]
        print(b, round(t['step_s'] * 1e3, 2), round(t['peak_gib'], 2), [(k[0][:20], round(k[1] * 1e3, 3)) for k in t['top_kernels'] if any(s in k[0] for s in ('qk_norm', 'rows_tma'))])
PY
timeout 60 ./.carry/gpu_parity rollout_equals_training --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rollout rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/gpu_parity.log | tail -1 | cut -c1-60)"
grep -hE "^PARITY|^MISMATCH" $OUT/gpu_parity.log | cut -c1-150; pack
