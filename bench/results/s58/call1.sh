#!/bin/bash
# Fifty-eighth session, call 1: main at 0a914e7 (the fifty-seventh session's final
# read: embedding_bwd's held-addend arguments from one map, not yet run on a GPU).
# cuda_parity's scatter and embedding tests; the rows kernels' turn-taking
# warpgroups (JET_NVRTC_DEFINES=ROWS_ORDER=1): cuda_invariant's bit equalities
# with it, and cuda_timing fp8_rows_timing (0.6B shapes) without / with it; then the
# headline: jetd bench (all flows, the defaults) at 0.6B and 8B-4l. Call 2 runs the
# peers on this machine.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
for t in scatter_settles_only_the_rows_it_writes embedding_matches_cpu; do
  timeout 60 ./.carry/cuda_parity --test-threads=1 --nocapture $t > $OUT/cp-$t.log 2>&1
  echo "cuda_parity $t rc $? (${SECONDS}s)"; grep -E '^test |test result' $OUT/cp-$t.log | tail -2
done
pack
JET_NVRTC_DEFINES=ROWS_ORDER=1 timeout 120 ./.carry/cuda_invariant --test-threads=1 > $OUT/ci-order.log 2>&1
echo "cuda_invariant ROWS_ORDER=1 rc $? (${SECONDS}s)"; grep -E '^test |test result' $OUT/ci-order.log | tail -8
for d in "" ROWS_ORDER=1 "" ROWS_ORDER=1; do
  JET_NVRTC_DEFINES=$d timeout 60 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/timing-$d-$SECONDS.log 2>&1
  echo "timing [$d] rc $? (${SECONDS}s)"
done
python3 - <<PY
import glob, re
rows = {}
for f in sorted(glob.glob('$OUT/timing-*.log')):
    tag = 'order' if 'ROWS_ORDER' in f else 'main'
    for l in open(f):
        m = re.match(r'TIMING (fp8|bf16) rows (\d+x\d+x\d+) (\S+)\s*: cuBLASLt\s+([\d.]+) us.*?\| rows(?:64)?\s+([\d.]+) us', l)
        if m: rows.setdefault((m[1], m[2], m[3]), {}).setdefault(tag, []).append(float(m[5])); rows[(m[1], m[2], m[3])]['lt'] = float(m[4])
for k, v in rows.items():
    print(*k, 'cuBLASLt %.1f' % v['lt'], 'rows main', v.get('main'), 'order', v.get('order'))
PY
pack
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
    for s in d.get('step', []): print(f, 'step', s.get('flow'), round(s.get('total_s', 0), 4), round(s.get('rollout_s', 0), 4), round(s.get('train_s', 0), 4), s.get('micro_batches'))
PY
