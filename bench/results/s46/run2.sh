#!/bin/bash
# Forty-sixth session, call 2 (same warm H100): cuda_invariant on branch s46's build, then a record of both flows, 3 reps, interleaved.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g2; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g2; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 60 ./.carry/cuda_invariant --test-threads=1 --nocapture > $OUT/cuda_invariant.log 2>&1
echo "cuda_invariant rc $?"; grep -E "test result|panicked" $OUT/cuda_invariant.log | tail -2 | cut -c1-200
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
LOG=$OUT timeout 200 bash bench/gpu_check.sh compare qwen3-8b:4,qwen3-0.6b 3 jetd-bf16,jetd-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $?"; pack
python3 - <<PY
import json, glob, statistics as st
for shape in ['qwen3_8b_4l', 'qwen3_0.6b']:
    r = {}
    for fl in ['bf16', 'fp8']:
        xs = []
        for f in sorted(glob.glob('$OUT/cmp/%s-jetd_%s-*.json' % (shape, fl))):
            try: t = json.load(open(f))['train'][0]; xs.append((t['step_s'] * 1e3, t['step_median_s'] * 1e3))
            except Exception as e: print(f, e)
        r[fl] = xs
        print(shape, fl, ['%.2f/%.2f' % x for x in xs])
    if r['bf16'] and r['fp8']:
        mb = st.mean(x[0] for x in r['bf16']); mf = st.mean(x[0] for x in r['fp8'])
        print(shape, 'fp8/bf16 by means %.3f' % (mb / mf))
PY
