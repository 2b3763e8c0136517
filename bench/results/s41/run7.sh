#!/bin/bash
# Session 41, call 7: the final build (each part of the cache mapped with a
# handle of its own: cuMemMap maps a handle from its start only, which call 6's
# one-handle build broke on; buckets captured at their first step): every
# gpu_parity test, the 0.6B GRPO-shaped step with 1-512-token responses against
# the fortieth session's build, and the arithmetic run.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 150 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E "KEPT|test result|panicked" $OUT/gpu_parity.log | cut -c1-220 | tail -8
pack
rm -rf /tmp/d-jetd
timeout 60 .carry/jetd run configs/qwen3-0.6b-arith.toml --device cuda --data-dir /tmp/d-jetd --metrics-out $OUT/run-jetd.jsonl > $OUT/run-jetd.txt 2>&1
echo "arith rc $?"; tail -1 $OUT/run-jetd.txt
pack
JET_BENCH_ARGS="--train-steps 1 --batch 64 --group-size 8 --prompt-len 128 --gen-len 512 --eos-random" timeout 150 bash bench/gpu_check.sh compare qwen3-0.6b 1 jetd-prev,jetd > $OUT/main.log 2>&1
pack
python3 bench/compare_builds.py $OUT/cmp jetd_prev jetd | grep -E 'step whole|rollout' | cut -c1-200
for f in $OUT/cmp/*.json; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for s in d['step']: print(sys.argv[1].split('/')[-1][:24], 'step', s['flow'], 'roll %.3f train %.3f total %.3f' % (s['rollout_s'], s['train_s'], s['total_s']), 'first %.3f' % s.get('first_rollout_s', float('nan')))
for r in d['rollout']: print('   ', r['flow'], 'cap', r.get('graphs_captured'), 'adopted', r.get('graphs_reused'), 'ahead', r.get('steps_kept_ahead'), [(b[0], round(b[1], 4), b[2]) for b in r['idle_before'][:2]])
PY
done
