#!/bin/bash
# Fifty-fifth session, call 5: the headline at 2b334f9 (calls 1 and 4's changes): jetd bench
# (all flows, the defaults) at 0.6B and 8B-4l, then the torch.compile and SDPA
# training peers at 0.6B, back to back on one GPU.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 170 ./.carry/jetd bench --device cuda --preset qwen3-0.6b --json > $OUT/bench-qwen3-0.6b.json 2> $OUT/bench-qwen3-0.6b.err
echo "bench 0.6b rc $? (${SECONDS}s)"; pack
timeout 150 ./.carry/jetd bench --device cuda --preset qwen3-8b --layers 4 --json > $OUT/bench-qwen3-8b-4l.json 2> $OUT/bench-qwen3-8b-4l.err
echo "bench 8b rc $? (${SECONDS}s)"; pack
python3 - <<PY
import json
for f in ['bench-qwen3-0.6b', 'bench-qwen3-8b-4l']:
    try: d = json.load(open('$OUT/%s.json' % f))
    except Exception as e: print(f, 'no json', e); continue
    for r in d.get('rollout', []): print(f, 'rollout', r['flow'], r['batch'], round(r['tokens_per_s']), 'decode_of_floor', r.get('decode_of_floor'))
    for t in d.get('train', []): print(f, 'train', t['flow'], round(t['tokens_per_s']), round(t['step_s']*1e3, 2), 'of_floor', t.get('of_floor'))
    for s in d.get('step', []): print(f, 'step', s.get('flow'), round(s.get('total_s', 0), 4), round(s.get('rollout_s', 0), 4), round(s.get('train_s', 0), 4))
PY
for p in compile sdpa; do
  [ $SECONDS -gt 440 ] && break
  timeout $((585 - SECONDS)) python3 bench/peer_torch.py --peer $p --no-rollout --preset qwen3-0.6b --json > $OUT/peer-$p-qwen3-0.6b.txt 2> $OUT/peer-$p-qwen3-0.6b.err
  echo "peer $p rc $? (${SECONDS}s)"; grep -E '^train' $OUT/peer-$p-qwen3-0.6b.txt | cut -c1-120; pack
done
