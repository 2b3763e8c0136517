#!/bin/bash
# Session 41, call 5: when to capture a bucket now that graphs are kept from one
# rollout to the next. jetd captures a bucket the batch shrinks into at its third
# step (JET_EAGER_STEPS 2, the default), jetd-e0 at its first: with kept graphs a
# bucket the batch passes in under three steps was launched step by step in every
# rollout, never captured. GRPO-shaped rollouts (8 samples of 8 prompts, prompt
# 128, responses of random length up to 512 or 64 tokens), then the arithmetic
# run (5-token responses) with each.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for n in 512 64; do
  mkdir -p $OUT/g$n
  OUT=$OUT/g$n JET_BENCH_ARGS="--train-steps 0 --batch 64 --group-size 8 --prompt-len 128 --gen-len $n --eos-random" timeout 170 bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 1 jetd,jetd-e0 > $OUT/g$n/main.log 2>&1
  pack; echo "== responses of 1-$n tokens"; grep -E 'rollout' $OUT/g$n/compare.txt | cut -c1-200
done
for b in jetd jetd-e0; do
  rm -rf /tmp/d-$b
  timeout 100 .carry/$b run configs/qwen3-0.6b-arith.toml --device cuda --data-dir /tmp/d-$b --metrics-out $OUT/run-$b.jsonl > $OUT/run-$b.txt 2>&1
  echo "$b rc $?"
done
pack
python3 - <<'PY'
import json
def load(b): return [json.loads(l) for l in open(f'/tmp/g/run-{b}.jsonl')]
a, b = load('jetd'), load('jetd-e0')
diff = sum(1 for x, y in zip(a, b) for k in x if not (k.endswith('_s') or 'per_s' in k) and x.get(k) != y.get(k))
print('records', len(a), len(b), 'non-timing fields that differ:', diff)
for name, r in (('eager2', a), ('eager0', b)):
    rl = [m for m in r if m.get('phase') == 'rl']
    med = lambda v: sorted(v)[len(v)//2]
    print(name, 'rl rollout_s median %.4f' % med([m['rollout_s'] for m in rl]), 'step_s median %.4f' % med([m['step_s'] for m in rl]), [round(m['rollout_s'], 4) for m in rl])
PY
