#!/bin/bash
# Session 39, call 4: the review's mends and the shared backward's dO prep on the
# compact rows (flash_backward_prep / flash_backward_kernels: delta and dO's BF16
# copy made once a row and copied out, no copy of O), sample_chunks greedy-only. All
# five GPU test binaries (gpu_parity's shared-rows test now at T 1 and 0.8, with and
# without gradients); call 3's build (jetd-prev) against this one on the 0.6B
# GRPO-shaped step, micro-batches of 32 samples, interleaved.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
bash bench/gpu_check.sh tests > $OUT/tests.txt 2>&1
grep -E '^test ' $OUT/tests.txt
grep -hE 'shared vs unshared|sample_logits greedy' $OUT/gpu_parity.log $OUT/cuda_parity.log | cut -c1-150
grep -hE '^MISMATCH' $OUT/gpu_parity.log | grep 'invariant true' | cut -c1-120
pack
JET_BENCH_ARGS="--train-steps 1 --batch 64 --group-size 8 --train-seqs 32" bash bench/gpu_check.sh compare qwen3-0.6b 2 jetd-prev,jetd > $OUT/main.log 2>&1
pack
python3 - <<'P'
import json, glob, collections
rows = collections.defaultdict(list)
for f in sorted(glob.glob('/tmp/g/cmp/*.json')):
    try: d = json.load(open(f))
    except Exception as e: print(f, 'ERR', e); continue
    shape, build, rep = f.split('/')[-1][:-5].split('-')
    for s in d.get('step', []):
        rows[(shape, s['flow'], build)].append((s['train_s'], s['rollout_s'], s['total_s']))
print('shape flow build: train_s / rollout_s / total_s per rep')
for k in sorted(rows):
    print(*k, ' '.join('%.4f/%.3f/%.3f' % x for x in rows[k]))
P
