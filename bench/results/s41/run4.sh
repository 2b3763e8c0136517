#!/bin/bash
# Session 41, call 4: the long-horizon task's whole loop (configs/qwen3-0.6b-longhorizon.toml,
# Qwen3-0.6B shape, responses up to 384 tokens of random length) with its SFT
# cut to 200 steps and 10 GRPO steps, the fortieth session's build and this one,
# same seed: metrics must agree exactly, the RL steps' rollout times not.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
sed -e 's/^steps = 1200/steps = 200/' configs/qwen3-0.6b-longhorizon.toml > /tmp/lh.toml
cp configs/tiny-arith.tokenizer.json /tmp/
grep -n "^steps" /tmp/lh.toml
for b in jetd-prev jetd; do
  rm -rf /tmp/d-$b
  timeout 250 .carry/$b run /tmp/lh.toml --steps 10 --device cuda --data-dir /tmp/d-$b --metrics-out $OUT/lh-$b.jsonl > $OUT/lh-$b.txt 2>&1
  echo "$b rc $?"; tail -2 $OUT/lh-$b.txt
  pack
done
python3 - <<'PY'
import json
def load(b): return [json.loads(l) for l in open(f'/tmp/g/lh-{b}.jsonl')]
a, b = load('jetd-prev'), load('jetd')
diff = []
for x, y in zip(a, b):
    for k in x:
        if k.endswith('_s') or 'per_s' in k: continue
        if x.get(k) != y.get(k): diff.append((x.get('phase'), x.get('step'), k))
print('records', len(a), len(b), 'non-timing fields that differ:', len(diff), diff[:5])
for name, r in (('prev', a), ('new', b)):
    rl = [m for m in r if m.get('phase') == 'rl']
    print(name, 'rl rollout_s', [round(m['rollout_s'], 3) for m in rl])
    print(name, 'rl train_s', [round(m['train_s'], 3) for m in rl])
    print(name, 'rl step_s', [round(m['step_s'], 3) for m in rl], 'len', [round(m.get('response_len_mean', 0), 1) for m in rl])
PY
