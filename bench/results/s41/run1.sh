#!/bin/bash
# Session 41, call 1: decode graphs kept across rollouts (gpu::kept, the KV cache
# in a reserved address range). GPU tests of the rollout paths, then the
# GRPO-shaped step (prompt 128, responses of 1-512 tokens, 8 samples a prompt,
# batch 64) and its rollout rows, the fortieth session's build (jetd-prev)
# against this one (jetd), 0.6B and 8B-4l.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 ./.carry/gpu_parity --test-threads=1 --nocapture decode_graphs paged_cache continuous_batching rollout_equals_training_bitwise_at_qwen3 trainer_runs_on_gpu > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E "^test |KEPT|GRAPHS|test result|panicked" $OUT/gpu_parity.log | cut -c1-220 | tail -30
pack
JET_BENCH_ARGS="--train-steps 1 --batch 64 --group-size 8 --prompt-len 128 --gen-len 512 --eos-random" timeout 330 bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 1 jetd-prev,jetd > $OUT/main.log 2>&1
pack
python3 bench/compare_builds.py $OUT/cmp jetd_prev jetd | grep -E 'step|phase|rollout' | cut -c1-200
for f in $OUT/cmp/*jetd-1.json; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['rollout']: print(sys.argv[1].split('/')[-1][:22], r['flow'], round(r['seconds'],3), 'cap',r.get('graphs_captured'),'reuse',r.get('graphs_reused'),'ahead',r.get('steps_kept_ahead'),'steps',r['steps'], [(b[0],round(b[1],4)) for b in r['breakdown'] if b[0] in ('graph','other')], [(b[0],round(b[1],4),b[2]) for b in r['idle_before'][:2]])
for s in d['step']: print(' step', s['flow'], 'total', round(s['total_s'],3), 'roll', round(s['rollout_s'],3), 'train', round(s['train_s'],3), 'first', round(s['first_total_s'],3), round(s['first_rollout_s'],3))
PY
done
for f in $OUT/cmp/*jetd_prev-1.json; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['rollout']: print(sys.argv[1].split('/')[-1][:22], r['flow'], round(r['seconds'],3), [(b[0],round(b[1],4)) for b in r['breakdown'] if b[0] in ('graph','other')], [(b[0],round(b[1],4),b[2]) for b in r['idle_before'][:2]])
for s in d['step']: print(' step', s['flow'], 'total', round(s['total_s'],3), 'roll', round(s['rollout_s'],3), 'train', round(s['train_s'],3))
PY
done
grep -h "rc [^0]" $OUT/main.log | head; tail -3 $OUT/cmp/*.err | grep -iv "^$" | tail -12
