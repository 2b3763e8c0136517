#!/bin/bash
# Session 39, call 3: cuda_parity with the row maps' test mended (its sums had not
# run); the GRPO-shaped step with 8 samples a prompt in micro-batches of 32
# sequences (4 groups, 8,192 tokens a micro-batch) at 0.6B and 8B-4l, main at the
# session's start (jetd-prev), this build unshared (jetd-noshare) and shared (jetd),
# interleaved; the SFT warm-up of qwen3-0.6b-arith (fp8, from random weights) with
# three seeds for jetd-prev and jetd, to see whether the LM head over the scored
# rows moves where SFT ends beyond the run-to-run spread.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
./.carry/cuda_parity --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity rc $?"; grep -E '^test result' $OUT/cuda_parity.log; grep -E 'row map|row sums' $OUT/cuda_parity.log | cut -c1-150
pack
JET_BENCH_ARGS="--train-steps 1 --batch 64 --group-size 8 --train-seqs 32" bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 2 jetd-prev,jetd-noshare,jetd > $OUT/main.log 2>&1
grep -E 'train' $OUT/compare.txt
pack
for seed in 1 2 3; do
  for b in jetd-prev jetd; do
    timeout 100 .carry/$b run configs/qwen3-0.6b-arith.toml --device cuda --steps 1 --seed $seed --data-dir /tmp/d-$b-$seed --metrics-out $OUT/sft-$b-$seed.jsonl > $OUT/sft-$b-$seed.txt 2>&1
    echo "rc $?" >> $OUT/sft-$b-$seed.txt
  done
  pack
done
python3 - <<'P'
import json, glob, collections, statistics
rows = collections.defaultdict(list)
for f in sorted(glob.glob('/tmp/g/cmp/*.json')):
    try: d = json.load(open(f))
    except Exception as e: print(f, 'ERR', e); continue
    shape, build, rep = f.split('/')[-1][:-5].split('-')
    for s in d.get('step', []):
        rows[(shape, s['flow'], build)].append((s['train_s'], s['rollout_s'], s['total_s']))
print('shape flow build: train_s / rollout_s / total_s per rep')
for k in sorted(rows):
    print(*k, ' '.join('%.3f/%.3f/%.3f' % x for x in rows[k]))
print('SFT: build seed | loss mean of steps 0-49, 100-149, 250-299 | held-out after SFT')
for f in sorted(glob.glob('/tmp/g/sft-*.jsonl')):
    ms = [json.loads(l) for l in open(f)]
    sft = [m['loss'] for m in ms if m.get('phase') == 'sft']
    ho = [m.get('heldout_accuracy') for m in ms if m.get('phase') == 'rl' and m.get('heldout_accuracy') is not None]
    if len(sft) < 300: print(f, 'short', len(sft)); continue
    print(f.split('/')[-1], '%.3f %.3f %.3f' % (statistics.mean(sft[:50]), statistics.mean(sft[100:150]), statistics.mean(sft[250:])), ho[:1])
P
