#!/bin/bash
# Fifty-fifth session, call 2: the attention backward's dq and dk as BF16 values
# (staged 16-byte stores) read by the q/k norms' backward (_y16 builds). Checks;
# JET_QK_GRAD16=0 against the default at 0.6B (3 reps, both flows); then, if the
# checks passed, the headline: jetd bench at 0.6B and 8B-4l, torch.compile and SDPA.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk c0-bf16 "JET_QK_GRAD16=0" bf16; mk c1-bf16 "" bf16; mk c0-fp8 "JET_QK_GRAD16=0" fp8; mk c1-fp8 "" fp8
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
ok=0
timeout 60 ./.carry/cuda_flash --test-threads=1 --nocapture > $OUT/cuda_flash.log 2>&1; rc=$?; ok=$((ok + rc))
echo "cuda_flash rc $rc (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_flash.log | tail -1 | cut -c1-60)"
grep -hE "BF16 dq, dk == RNE" $OUT/cuda_flash.log | cut -c1-160 | head -4
timeout 60 ./.carry/cuda_parity qk_norm_rope --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1; rc=$?; ok=$((ok + rc))
echo "cuda_parity qk rc $rc (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_parity.log | tail -1 | cut -c1-60)"
grep -hE "dy16 true" $OUT/cuda_parity.log | grep -c "0 differing" | sed 's/^/dy16 passes bit-exact: /'
timeout 40 ./.carry/cuda_stacked_bf16 --test-threads=1 --nocapture > $OUT/cuda_stacked_bf16.log 2>&1; rc=$?; ok=$((ok + rc))
echo "cuda_stacked_bf16 rc $rc (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_stacked_bf16.log | tail -1 | cut -c1-60)"
timeout 200 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1; rc=$?; ok=$((ok + rc))
echo "gpu_parity rc $rc (${SECONDS}s): $(grep -E '^test result' $OUT/gpu_parity.log | tail -1 | cut -c1-60)"
grep -hE "^PARITY.*(: gradients|gradient norm|shared vs unshared)|FAILED|panicked" $OUT/gpu_parity.log | cut -c1-120 | head -14; pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 130 bash bench/gpu_check.sh compare qwen3-0.6b 3 c0-bf16,c1-bf16,c0-fp8,c1-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-260
python3 - <<PY
import json, glob, collections
for b in ['c0_bf16', 'c1_bf16', 'c0_fp8', 'c1_fp8']:
    for key in ['train', 'step']:
        acc = collections.defaultdict(float); fs = sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))
        for f in fs:
            d = json.load(open(f)); ks = d['train'][0]['top_kernels'] if key == 'train' else d['step'][0]['train_top_kernels']
            for k in ks: acc[k[0]] += k[1] * 1e3 / len(fs)
        print(b, key, [(k, round(v, 3)) for k, v in acc.items() if k.startswith(('qk_norm_rope_bwd', 'fa_bwd_'))])
PY
[ $ok -ne 0 ] && { echo "checks failed: no headline"; exit 0; }
unset JET_BENCH_ARGS
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
