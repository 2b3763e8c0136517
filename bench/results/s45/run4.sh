#!/bin/bash
# Forty-fifth session, call 4 (the record): fp8 and bf16 training steps of this
# session's build, interleaved, three reps each, 8B-4l and 0.6B (wrappers jetd-fp8 /
# jetd-bf16 add --flow), then one full bench a flow at 8B-4l with its kernel table.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 170 bash bench/gpu_check.sh compare qwen3-8b:4,qwen3-0.6b 3 jetd-fp8,jetd-bf16 > $OUT/cmp.log 2>&1
echo "compare rc $?"; pack
python3 bench/compare_builds.py $OUT/cmp jetd_fp8 jetd_bf16 | grep -E 'train' | cut -c1-250
for f in fp8 bf16; do
  timeout 45 ./.carry/jetd bench --device cuda --json --no-cublaslt --preset qwen3-8b --layers 4 --flow $f --batch 64 --gen-len 16 --train-steps 3 > $OUT/k8-$f.json 2> $OUT/k8-$f.err; echo "k8 $f rc $?"; pack
done
python3 - <<PY
import json, statistics as st, glob
for shape in ['qwen3_8b_4l', 'qwen3_0.6b']:
    r = {}
    for f in ['fp8', 'bf16']:
        xs = []
        for p in sorted(glob.glob('$OUT/cmp/%s-jetd_%s-*.json' % (shape, f))):
            d = json.load(open(p)); xs.append(d['train'][0]['step_s'] * 1e3)
        r[f] = xs
        print(shape, f, ' '.join('%.2f' % x for x in xs), 'median %.2f' % st.median(xs) if xs else '')
    if r['fp8'] and r['bf16']:
        print(shape, 'bf16/fp8 of medians %.3f, of means %.3f' % (st.median(r['bf16']) / st.median(r['fp8']), st.mean(r['bf16']) / st.mean(r['fp8'])))
PY
