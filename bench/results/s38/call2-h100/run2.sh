#!/bin/bash
# Session 38, call 2 (stages in order of need; the logs are packed after each, so a
# call cut short still brings back what ran): all five GPU test binaries of the final
# build (the review's mends: vocabularies of 8,212 and 33 chunks, signed-zero maxima
# in the draw's tests); 8 samples a prompt at 8B-4l and 0.6B, both builds interleaved;
# the 0.6B rollout's floor shares (full `jetd bench`, both builds); the whole RL loop
# on the GPU with each build.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
bash bench/gpu_check.sh tests > $OUT/tests.txt 2>&1
grep -E '^test ' $OUT/tests.txt
grep -hE 'draw|special values' $OUT/cuda_parity.log | cut -c1-150
pack
JET_BENCH_ARGS="--train-steps 0 --batch 64,256 --group-size 8" bash bench/gpu_check.sh compare qwen3-8b:4,qwen3-0.6b 2 jetd-prev,jetd > $OUT/main.log 2>&1
cat $OUT/compare.txt
pack
for b in jetd-prev jetd; do
  .carry/$b bench --device cuda --preset qwen3-0.6b --train-steps 0 --json > $OUT/full-$b.json 2> $OUT/full-$b.err
done
pack
for b in jetd-prev jetd; do
  timeout 150 .carry/$b run configs/qwen3-0.6b-arith.toml --device cuda --data-dir /tmp/d-$b --metrics-out $OUT/run-$b.jsonl > $OUT/run-$b.txt 2>&1
  echo "rc $?" >> $OUT/run-$b.txt
done
pack
python3 - <<'P'
import json, glob
for f in sorted(glob.glob('/tmp/g/full-*.json')):
    try: d = json.load(open(f))
    except Exception as e: print(f, 'ERR', e); continue
    for r in d['rollout']:
        print(f.split('/')[-1], r['flow'], r['batch'], round(r['tokens_per_s']), r['of_floor'], r['decode_of_floor'])
for b in ['jetd-prev', 'jetd']:
    try: ms = [json.loads(l) for l in open(f'/tmp/g/run-{b}.jsonl')]
    except Exception as e: print(b, 'ERR', e); continue
    rl = [m for m in ms if m.get('phase') == 'rl']
    for m in rl:
        if m.get('heldout_accuracy') is not None:
            print(b, {k: m.get(k) for k in ['step', 'heldout_accuracy', 'reward_mean', 'mismatch_kl']})
    print(b, 'RL steps', len(rl), 'max mismatch_kl', max((m.get('mismatch_kl') or 0) for m in rl) if rl else None)
P
tail -2 /tmp/g/run-*.txt
