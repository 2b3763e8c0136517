#!/bin/bash
# Session 41, call 6: the final build (the cache's parts mapped one by one, only
# those a rollout uses; buckets captured at their first step by default): every
# gpu_parity test, the GRPO-shaped step with 1-512-token responses against the
# fortieth session's build, and the arithmetic run with each (same seed).
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E "KEPT|test result|panicked" $OUT/gpu_parity.log | cut -c1-220 | tail -8
pack
JET_BENCH_ARGS="--train-steps 1 --batch 64 --group-size 8 --prompt-len 128 --gen-len 512 --eos-random" timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 1 jetd-prev,jetd > $OUT/main.log 2>&1
pack
python3 bench/compare_builds.py $OUT/cmp jetd_prev jetd | grep -E 'step whole|rollout' | cut -c1-200
for f in $OUT/cmp/*.json; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for s in d['step']: print(sys.argv[1].split('/')[-1][:24], 'step', s['flow'], 'roll %.3f train %.3f total %.3f' % (s['rollout_s'], s['train_s'], s['total_s']), 'first %.3f' % s.get('first_rollout_s', float('nan')))
for r in d['rollout']: print('   ', r['flow'], 'cap', r.get('graphs_captured'), 'adopted', r.get('graphs_reused'), 'ahead', r.get('steps_kept_ahead'), [(b[0], round(b[1], 4), b[2]) for b in r['idle_before'][:2]], 'peak', round(r['peak_gib'], 2))
PY
done
for b in jetd-prev jetd; do
  rm -rf /tmp/d-$b
  timeout 100 .carry/$b run configs/qwen3-0.6b-arith.toml --device cuda --data-dir /tmp/d-$b --metrics-out $OUT/run-$b.jsonl > $OUT/run-$b.txt 2>&1
  echo "$b rc $?"
done
pack
python3 - <<'PY'
import json
def load(b): return [json.loads(l) for l in open(f'/tmp/g/run-{b}.jsonl')]
a, b = load('jetd-prev'), load('jetd')
diff = sum(1 for x, y in zip(a, b) for k in x if not (k.endswith('_s') or 'per_s' in k) and x.get(k) != y.get(k))
print('records', len(a), len(b), 'non-timing fields that differ:', diff)
for name, r in (('prev', a), ('new', b)):
    rl = [m for m in r if m.get('phase') == 'rl']
    med = lambda v: sorted(v)[len(v)//2]
    print(name, 'rl rollout_s median %.4f' % med([m['rollout_s'] for m in rl]), 'step_s median %.4f' % med([m['step_s'] for m in rl]))
PY
