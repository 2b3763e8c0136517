#!/bin/bash
# Session 43, call 6: the final build's full 0.6B bench (all flows, the -cublaslt
# twins, the GRPO-shaped step) and the torch.compile peer in the same call.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 260 ./.carry/jetd bench --device cuda --preset qwen3-0.6b --json > $OUT/bench-qwen3-0.6b.json 2> $OUT/bench.err
echo "bench rc $?"
pack
timeout 220 python3 bench/peer_torch.py --peer compile --no-rollout --preset qwen3-0.6b --json > $OUT/peer-compile.txt 2> $OUT/peer-compile.err
echo "peer rc $?"; grep -E '^(train)' $OUT/peer-compile.txt | cut -c1-300
pack
python3 - <<'PY'
import json
d=json.load(open('/tmp/g/bench-qwen3-0.6b.json'))
for t in d['train']: print('train', t['flow'], round(t['tokens_per_s']), 'mean %.2f ms' % (t['step_s']*1e3), 'median %.2f' % (t['step_median_s']*1e3), 'vs_bf16_median %.3f' % t['vs_bf16_median'])
for s in d['step']: print('step', s['flow'], 'total %.3f roll %.3f train %.3f' % (s['total_s'], s['rollout_s'], s['train_s']))
for r in d['rollout']: print('rollout', r['flow'], r['batch'], round(r['tokens_per_s']), 'of_floor %.3f decode_of_floor %.3f' % (r['of_floor'], r['decode_of_floor']))
PY
