#!/bin/bash
# Session 41, call 8: the final build (adjacent parts of the cache mapped as one:
# a cache that fills its layout is one mapping again, as in calls 1-5, a smaller
# one a mapping a part, as in call 7): the rollout tests of gpu_parity, then the
# arithmetic run (5-token responses: a rollout's fixed costs show) with the
# fortieth session's build and this one, same seed.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 100 ./.carry/gpu_parity --test-threads=1 --nocapture decode_graphs paged_cache trainer_runs > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E "KEPT|test result|panicked" $OUT/gpu_parity.log | cut -c1-220 | tail -6
pack
for b in jetd-prev jetd; do
  rm -rf /tmp/d-$b
  timeout 50 .carry/$b run configs/qwen3-0.6b-arith.toml --device cuda --data-dir /tmp/d-$b --metrics-out $OUT/run-$b.jsonl > $OUT/run-$b.txt 2>&1
  echo "$b rc $?"
  python3 - $b <<'PY'
import json,sys
b=sys.argv[1]
r=[json.loads(l) for l in open(f'/tmp/g/run-{b}.jsonl')]
rl=[m for m in r if m.get('phase')=='rl']
med=lambda v: sorted(v)[len(v)//2]
print(b, 'rl rollout_s median %.4f step_s median %.4f heldout %s' % (med([m['rollout_s'] for m in rl]), med([m['step_s'] for m in rl]), rl[-1].get('heldout_accuracy')))
PY
done
pack
