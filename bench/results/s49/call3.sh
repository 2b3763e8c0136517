#!/bin/bash
# NOT run: no machine came after call 1 (nine asks); next-call.sh is its successor. The builds are branch s49-grpo's (6acbc7f = af6d7bc's tree)
# and main d4c4011 as jetd-main; rebuild them if main has moved (main now has the q/k pair, 8e06fcd).
# Forty-ninth session, call 3: call2.sh cut to what ~270 s hold (failed starts took the rest). The builds are
# call 2's (.carryz/c.tar.xz): jetd-main = main d4c4011; jetd-g8 = + q/k pair, softmax_chunk_stats_z16 at four
# blocks an SM, grad_settle_multi, rmsnorm_bwd_rows1g8 and qk_norm_rope_bwd_r8. The bitwise checks that cover
# the new kernels (cuda_parity, gpu_parity, cuda_invariant), then 0.6B main against g8, two reps interleaved.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_parity gpu_parity cuda_invariant; do
  timeout 100 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $?: $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-80)"; grep -E "panicked" $OUT/$t.log | head -5 | cut -c1-200
done
pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout $((250 - SECONDS)) bash bench/gpu_check.sh compare qwen3-0.6b 2 jetd-main-fp8,jetd-g8-fp8,jetd-main-bf16,jetd-g8-bf16 > $OUT/cmp.log 2>&1
echo "compare rc $?"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-250
python3 - <<PY
import json, glob
for b in ['jetd_main_fp8', 'jetd_g8_fp8', 'jetd_main_bf16', 'jetd_g8_bf16']:
    for f in sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))[:1]:
        d = json.load(open(f))
        t = d['train'][0]
        print(b, 'train', [(k[0][:26], round(k[1] * 1e3, 3)) for k in t['top_kernels'] if 'softmax' in k[0] or 'settle' in k[0] or 'rmsnorm_bwd' in k[0]])
        for s in d.get('step', []):
            print(b, 'grpo', [(k[0][:26], round(k[1] * 1e3, 2), k[2]) for k in s.get('train_top_kernels', []) if 'settle' in k[0] or 'qk_norm' in k[0] or 'colsum' in k[0] or 'rmsnorm_bwd' in k[0]])
PY
