#!/bin/bash
# The next session's first call (prepared in the forty-ninth session; binaries in .carryz/c.tar.xz, rebuild both
# if main or s49-grpo has moved):
#   jetd-main = main 022637a (the q/k pair landed; main 305e28c launches the same kernels with the same arguments);
#   jetd-g8   = branch s49-grpo (built at 67877ff; 1730d91 launches the same): + softmax_chunk_stats_z16 at four blocks an SM with s's and t's block
#               sums under one barrier (timed in the forty-ninth session's call 1 through JET_NVRTC_DEFINES:
#               0.78 -> 0.68 ms a 0.6B step), every held BF16 WGrad output settled in one launch before each
#               backward pass (grad_settle_multi; predicted ~8 ms off the 0.6B GRPO-shaped training phase, H200),
#               and rmsnorm_bwd_rows1g8 / qk_norm_rope_bwd_r8 where a launch has fewer blocks than SMs.
# The GPU tests from jetd-g8's build (they check the new kernels' bits), 0.6B four reps interleaved (8 x 512 and
# the GRPO-shaped step; the profiles split the three changes' kernels), 8B-4l fp8 and bf16 of jetd-g8 three reps
# if time, and the GRPO-shaped step with the daemon's default micro-batches. Land what it confirms.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_parity cuda_act cuda_invariant cuda_flash gpu_parity; do
  timeout 150 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $?: $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-80)"; grep -E "panicked" $OUT/$t.log | head -5 | cut -c1-200
done
pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 230 bash bench/gpu_check.sh compare qwen3-0.6b 4 jetd-main-fp8,jetd-g8-fp8,jetd-main-bf16,jetd-g8-bf16 > $OUT/cmp.log 2>&1
echo "compare rc $?"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-250
[ $SECONDS -lt 380 ] && OUT=/tmp/g/b8 timeout 150 bash bench/gpu_check.sh compare qwen3-8b:4 3 jetd-g8-fp8,jetd-g8-bf16 > $OUT/cmp8.log 2>&1
echo "compare 8b rc $?"; pack
grep -E "train \||step training|rollout" $OUT/b8/compare.txt | cut -c1-250
python3 - <<PY
import json, glob
for b in ['jetd_main_fp8', 'jetd_g8_fp8', 'jetd_main_bf16', 'jetd_g8_bf16']:
    for f in sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))[:1]:
        d = json.load(open(f))
        t = d['train'][0]
        print(b, 'train', [(k[0][:26], round(k[1] * 1e3, 3)) for k in t['top_kernels'] if 'softmax' in k[0] or 'settle' in k[0]])
        for s in d.get('step', []):
            print(b, 'grpo', [(k[0][:26], round(k[1] * 1e3, 2), k[2]) for k in s.get('train_top_kernels', []) if 'settle' in k[0] or 'qk_norm' in k[0] or 'colsum' in k[0] or 'rmsnorm_bwd' in k[0]])
PY
# The GRPO-shaped step with the daemon's default micro-batches (train.micro_batch 64 sequences,
# micro_batch_tokens auto) rather than the bench's --train-seqs 8 (one group of 8 a micro-batch); the train
# rows here are 64 x 64 tokens, not read.
if [ $SECONDS -lt 480 ]; then
  for b in jetd-main jetd-g8; do for f in fp8 bf16; do
    timeout 40 ./.carry/$b bench --device cuda --json --no-cublaslt --preset qwen3-0.6b --flow $f --batch 64 --gen-len 16 \
      --train-steps 1 --train-seqs 64 --train-len 64 --train-tokens auto > $OUT/grpo64-$b-$f.json 2> $OUT/grpo64-$b-$f.err
    echo "grpo64 $b $f rc $?: $(python3 -c "import json; s=json.load(open('$OUT/grpo64-$b-$f.json'))['step'][0]; print('train_s %.2f ms, total %.2f ms' % (s['train_s']*1e3, s['total_s']*1e3))" 2>&1 | tail -1)"
  done; done
  pack
fi
