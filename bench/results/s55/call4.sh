#!/bin/bash
# Fifty-fifth session, call 4: the split-K path's epilogue writing BF16 where a
# forward keeps BF16 (a GRPO micro-batch's k and v at 256 rows: q and k before their
# norms then BF16 in both, v's attention operand without a copy). Checks, then
# JET_SPLITK_BF16=0 against the default at 0.6B, three reps, both flows (the
# GRPO-shaped step is the row that moves).
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk s0-bf16 "JET_SPLITK_BF16=0" bf16; mk s1-bf16 "" bf16; mk s0-fp8 "JET_SPLITK_BF16=0" fp8; mk s1-fp8 "" fp8
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 60 ./.carry/cuda_act --test-threads=1 --nocapture > $OUT/cuda_act.log 2>&1
echo "cuda_act rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_act.log | tail -1 | cut -c1-60)"
grep -hE "kept BF16.*256x1024x1024|FAILED|panicked" $OUT/cuda_act.log | cut -c1-120 | head -6
timeout 60 ./.carry/cuda_invariant --test-threads=1 --nocapture > $OUT/cuda_invariant.log 2>&1
echo "cuda_invariant rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_invariant.log | tail -1 | cut -c1-60)"
timeout 200 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/gpu_parity.log | tail -1 | cut -c1-60)"
grep -hE "rollout vs training|FAILED|panicked" $OUT/gpu_parity.log | cut -c1-110 | head -14; pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 150 bash bench/gpu_check.sh compare qwen3-0.6b 3 s0-bf16,s1-bf16,s0-fp8,s1-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "train \||step training|rollout" $OUT/compare.txt | cut -c1-260 | head -12
python3 - <<PY
import json, glob, collections
for b in ['s0_bf16', 's1_bf16', 's0_fp8', 's1_fp8']:
    acc = collections.defaultdict(float); fs = sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))
    for f in fs:
        d = json.load(open(f)); ks = d['step'][0]['train_top_kernels']
        for k in ks: acc[k[0]] += k[1] * 1e3 / len(fs)
    print(b, 'step', [(k, round(v, 2)) for k, v in acc.items() if k.startswith(('qk_norm_rope', 'fa_to_bf16', 'linear_epilogue', 'wg_'))])
PY
