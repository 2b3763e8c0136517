#!/bin/bash
# Fifty-fourth session, call 3: fa_bwd_prep with a warp's four heads' loads in flight (cuda_flash),
# then main (6b751f2) against the branch at 0.6B (3 reps), then the headline: jetd bench (all flows,
# the defaults) at 0.6B and 8B-4l, and the torch.compile and SDPA training peers at 0.6B.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
mk() { printf '#!/bin/bash\nexec "$(dirname "$0")/%s" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk jm-bf16 jetd-main bf16; mk jn-bf16 jetd bf16; mk jm-fp8 jetd-main fp8; mk jn-fp8 jetd fp8
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 90 ./.carry/cuda_flash --test-threads=1 --nocapture > $OUT/cuda_flash.log 2>&1
echo "cuda_flash rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_flash.log | tail -1 | cut -c1-60)"; grep -E "panicked|FAILED|failed" $OUT/cuda_flash.log | head -5 | cut -c1-200
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 150 bash bench/gpu_check.sh compare qwen3-0.6b 3 jm-bf16,jn-bf16,jm-fp8,jn-fp8 > $OUT/cmp.log 2>&1
echo "compare 0.6b rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-300
unset JET_BENCH_ARGS
timeout 170 ./.carry/jetd bench --device cuda --preset qwen3-0.6b --json > $OUT/bench-qwen3-0.6b.json 2> $OUT/bench-qwen3-0.6b.err
echo "bench 0.6b rc $? (${SECONDS}s)"; tail -2 $OUT/bench-qwen3-0.6b.err | cut -c1-200; pack
timeout 150 ./.carry/jetd bench --device cuda --preset qwen3-8b --layers 4 --json > $OUT/bench-qwen3-8b-4l.json 2> $OUT/bench-qwen3-8b-4l.err
echo "bench 8b rc $? (${SECONDS}s)"; tail -2 $OUT/bench-qwen3-8b-4l.err | cut -c1-200; pack
python3 - <<PY
import json
for f in ['bench-qwen3-0.6b', 'bench-qwen3-8b-4l']:
    try: d = json.load(open('$OUT/%s.json' % f))
    except Exception as e: print(f, 'no json', e); continue
    for r in d.get('rollout', []): print(f, 'rollout', r['flow'], r['batch'], round(r['tokens_per_s']), 'of_floor', r.get('of_floor'), 'decode_of_floor', r.get('decode_of_floor'))
    for t in d.get('train', []): print(f, 'train', t['flow'], round(t['tokens_per_s']), round(t['step_s']*1e3, 2), 'floor', t.get('floor_s'), t.get('of_floor'), 'peak', round(t['peak_gib'], 1))
    for s in d.get('step', []): print(f, 'step', {k: (round(v, 4) if isinstance(v, float) else v) for k, v in s.items() if not isinstance(v, (list, dict))})
PY
for p in compile sdpa; do
  [ $SECONDS -gt 420 ] && break
  timeout $((585 - SECONDS)) python3 bench/peer_torch.py --peer $p --no-rollout --preset qwen3-0.6b --json > $OUT/peer-$p-qwen3-0.6b.txt 2> $OUT/peer-$p-qwen3-0.6b.err
  echo "peer $p rc $? (${SECONDS}s)"; grep -E '^train' $OUT/peer-$p-qwen3-0.6b.txt | cut -c1-120; pack
done
