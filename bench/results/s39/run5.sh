#!/bin/bash
# Session 39, call 5: sharing at a long prompt. The GRPO-shaped step with prompts of
# 512 tokens and 128 generated, 8 samples a prompt
# (7 x 511 of every 8 x 640 rows shared), micro-batches of 16 samples, at 0.6B and 8B-4l: this build with the
# prompt rows unshared (jetd-noshare) and shared (jetd), interleaved, two runs each.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
JET_BENCH_ARGS="--train-steps 1 --batch 64 --group-size 8 --train-seqs 16 --prompt-len 512 --gen-len 128" bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 2 jetd-noshare,jetd > $OUT/main.log 2>&1
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
tail -3 $OUT/main.log
