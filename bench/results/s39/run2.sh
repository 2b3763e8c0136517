#!/bin/bash
# Session 39, call 2: a GRPO group's prompt rows once in training. All five GPU test
# binaries (the row maps' parity, shared against unshared passes, rollout ==
# training with sharing on); main at the session's start (jetd-prev), this build
# with sharing off (jetd-noshare: call 1's LM head over the scored rows) and on
# (jetd) interleaved on the GRPO-shaped step with 8 samples a prompt (prompt 128 +
# 128 generated, batch 64: 7 x 127 of every 8 x 256 rows shared) at 0.6B and 8B-4l;
# the whole RL loop on the GPU with this build (8 samples a prompt, shared).
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
bash bench/gpu_check.sh tests > $OUT/tests.txt 2>&1
grep -E '^test ' $OUT/tests.txt
grep -hE '^MISMATCH' $OUT/gpu_parity.log | cut -c1-150
grep -hE 'shared|row map|row sums' $OUT/gpu_parity.log $OUT/cuda_parity.log | cut -c1-150
pack
JET_BENCH_ARGS="--train-steps 1 --batch 64 --group-size 8" bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 2 jetd-prev,jetd-noshare,jetd > $OUT/main.log 2>&1
cat $OUT/compare.txt
pack
timeout 150 .carry/jetd run configs/qwen3-0.6b-arith.toml --device cuda --data-dir /tmp/d-jetd --metrics-out $OUT/run-jetd.jsonl > $OUT/run-jetd.txt 2>&1
echo "rc $?" >> $OUT/run-jetd.txt
pack
python3 - <<'P'
import json, glob, collections
rows = collections.defaultdict(list)
for f in sorted(glob.glob('/tmp/g/cmp/*.json')):
    try: d = json.load(open(f))
    except Exception as e: print(f, 'ERR', e); continue
    name = f.split('/')[-1][:-5]
    shape, build, rep = name.split('-')
    for s in d.get('step', []):
        rows[(shape, s['flow'], build)].append((s['train_s'], s['rollout_s'], s['total_s']))
print('shape flow build: train_s / rollout_s / total_s per rep')
for k in sorted(rows):
    print(*k, ' '.join('%.3f/%.3f/%.3f' % x for x in rows[k]))
ms = [json.loads(l) for l in open('/tmp/g/run-jetd.jsonl')] if glob.glob('/tmp/g/run-jetd.jsonl') else []
rl = [m for m in ms if m.get('phase') == 'rl']
for m in rl:
    if m.get('heldout_accuracy') is not None:
        print({k: m.get(k) for k in ['step', 'heldout_accuracy', 'reward_mean', 'mismatch_kl']})
print('RL steps', len(rl), 'max mismatch_kl', max((m.get('mismatch_kl') or 0) for m in rl) if rl else None)
P
tail -2 /tmp/g/run-jetd.txt
