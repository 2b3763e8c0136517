#!/bin/bash
# Fifty-fifth session, call 1: the q/k forward's word loads (s54's prepared change),
# fa_finish's o16 through stmatrix, and the BF16 flows' attention output kept as its
# BF16 values alone (delta from them). Checks, then one binary with the three
# switches off (= main's kernels) against on, 0.6B, three reps interleaved.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
OFF="JET_QKNR_WORDS=0 JET_ATTN_OUT16=0 JET_NVRTC_DEFINES=FA_O16_STAGE=0"
mk b0-bf16 "$OFF" bf16; mk b1-bf16 "" bf16; mk bx-bf16 "JET_ATTN_OUT16=0" bf16
mk b0-fp8 "$OFF" fp8; mk b1-fp8 "" fp8
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/device.txt
timeout 60 ./.carry/cuda_flash --test-threads=1 --nocapture > $OUT/cuda_flash.log 2>&1
echo "cuda_flash rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_flash.log | tail -1 | cut -c1-60)"
grep -hE "BF16 output alone|BF16 operand == the copy of the output" $OUT/cuda_flash.log | cut -c1-150 | head -8
timeout 40 ./.carry/cuda_parity qk_norm_rope --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity qk rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_parity.log | tail -1 | cut -c1-60)"
timeout 240 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/gpu_parity.log | tail -1 | cut -c1-60)"
grep -hE "^PARITY.*(bf16: gradient|bf16: loss|rollout vs training)|FAILED|panicked" $OUT/gpu_parity.log | cut -c1-110 | head -12; pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b 3 b0-bf16,b1-bf16,bx-bf16,b0-fp8,b1-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-260
python3 - <<PY
import json, glob, collections
for b in ['b0_bf16', 'b1_bf16', 'bx_bf16', 'b0_fp8', 'b1_fp8']:
    for key in ['train', 'step']:
        acc = collections.defaultdict(float); fs = sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))
        for f in fs:
            d = json.load(open(f)); ks = d['train'][0]['top_kernels'] if key == 'train' else d['step'][0]['train_top_kernels']
            for k in ks: acc[k[0]] += k[1] * 1e3 / len(fs)
        print(b, key, [(k, round(v, 3)) for k, v in acc.items() if k.startswith(('qk_norm_rope_1', 'fa_fwd', 'fa_bwd_prep'))])
PY
