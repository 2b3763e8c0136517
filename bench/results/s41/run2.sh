#!/bin/bash
# Session 41, call 2: every gpu_parity test on the final rollout code, then the
# whole loop (configs/qwen3-0.6b-arith.toml: SFT, then 20 GRPO steps with
# 5-token responses and held-out evaluations) with the fortieth session's build
# and this one, same seed: the runs' metrics must agree exactly (graphs kept
# across rollouts change no bits), their step times not.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 300 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E "KEPT|test result|panicked" $OUT/gpu_parity.log | cut -c1-220 | tail -8
pack
for b in jetd-prev jetd; do
  rm -rf /tmp/d-$b
  timeout 130 .carry/$b run configs/qwen3-0.6b-arith.toml --device cuda --data-dir /tmp/d-$b --metrics-out $OUT/run-$b.jsonl > $OUT/run-$b.txt 2>&1
  echo "$b rc $?"; tail -2 $OUT/run-$b.txt
done
pack
python3 - <<'PY'
import json
def load(b):
    return [json.loads(l) for l in open(f'/tmp/g/run-{b}.jsonl')]
a, b = load('jetd-prev'), load('jetd')
timing = {'rollout_s','train_s','step_s','rollout_tokens_per_s','train_tokens_per_s','seconds','elapsed_s','tokens_per_s'}
diff = []
for x, y in zip(a, b):
    for k in x:
        if k in timing or k.endswith('_s') or 'per_s' in k: continue
        if x.get(k) != y.get(k): diff.append((x.get('phase'), x.get('step'), k, x.get(k), y.get(k)))
print('records', len(a), len(b), 'non-timing fields that differ:', len(diff), diff[:5])
for ph in ('sft', 'rl'):
    for name, r in (('prev', a), ('new', b)):
        rs = [m for m in r if m.get('phase') == ph]
        if not rs: continue
        def mean(k): 
            v = [m[k] for m in rs if isinstance(m.get(k), (int, float))]
            return sum(v) / len(v) if v else float('nan')
        print(ph, name, 'steps', len(rs), 'step_s %.4f rollout_s %.4f train_s %.4f' % (mean('step_s'), mean('rollout_s'), mean('train_s')), 'last heldout', [m.get('heldout_accuracy') for m in rs][-1])
PY
