#!/bin/bash
# Fifty-fourth session, call 9 (the last device time): the q/k norms' forward loading BF16 heads as
# words (qk_norm_rope_128_x16w) - its bit checks, then JET_QKNR_WORDS=0 against the default at 0.6B,
# two reps, bf16 and fp8.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk j2-bf16 "JET_QKNR_WORDS=0" bf16; mk jw-bf16 "" bf16; mk j2-fp8 "JET_QKNR_WORDS=0" fp8; mk jw-fp8 "" fp8
timeout 40 ./.carry/cuda_parity qk_norm_rope --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity qk rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_parity.log | tail -1 | cut -c1-60)"
grep -hE "from BF16 q, k == from their f32" $OUT/cuda_parity.log | cut -c1-140
timeout 40 ./.carry/gpu_parity rollout_equals_training --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rollout rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/gpu_parity.log | tail -1 | cut -c1-60)"
grep -hE "^PARITY.*rollout vs training" $OUT/gpu_parity.log | cut -c1-100; pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 75 bash bench/gpu_check.sh compare qwen3-0.6b 2 j2-bf16,jw-bf16,j2-fp8,jw-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-260
python3 - <<PY
import json, glob, collections
for b in ['j2_bf16', 'jw_bf16', 'j2_fp8', 'jw_fp8']:
    for key in ['train', 'step']:
        acc = collections.defaultdict(float); fs = sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))
        for f in fs:
            d = json.load(open(f)); ks = d['train'][0]['top_kernels'] if key == 'train' else d['step'][0]['train_top_kernels']
            for k in ks: acc[k[0]] += k[1] * 1e3 / len(fs)
        print(b, key, [(k, round(v, 3)) for k, v in acc.items() if k.startswith('qk_norm_rope_1')])
PY
