#!/bin/bash
# Forty-eighth session, call 3 (prepared, NOT run: too little device time was left to start a machine;
# binaries in .carryz/c.tar.xz, rebuild if main moved):
#   jetd      = main 06efdc6 (call 2's jetd: the attention's output quantized to both groupings in the training
#               forward at every size);
#   jetd-gate = main 6c90929: that only where quantize_dual's grid fills the GPU (dual_fills_gpu: two 128 x 128
#               tiles an SM), the old path for the GRPO-shaped step's small micro-batches; and the bench's
#               GRPO-shaped step with a profiled third step (train_top_kernels; not yet run on a GPU either).
# 0.6B, four reps interleaved: the 8 x 512 step (should not move), the GRPO-shaped step's training phase (should
# come back by ~2 ms), and the fp8 and bf16 flows' training-phase kernels of that step side by side.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b 4 jetd-fp8,jetd-gate-fp8,jetd-gate-bf16 > $OUT/cmp.log 2>&1
echo "compare rc $?"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-250
python3 - <<PY
import json, glob
for b in ['jetd_gate_fp8', 'jetd_gate_bf16']:
    f = sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))
    if not f: print(b, 'no JSON'); continue
    for s in json.load(open(f[0])).get('step', []):
        print(b, s.get('flow'), [(k[0][:28], round(k[1] * 1e3, 2), k[2]) for k in s.get('train_top_kernels', [])[:14]])
PY
