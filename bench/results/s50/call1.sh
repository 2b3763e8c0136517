#!/bin/bash
# Fiftieth session, call 1. Builds (wrappers add --flow F; binaries in .carryz/c.tar.xz):
#   jetd-main = main 022637a (main 305e28c launches the same kernels with the same arguments);
#   jetd-s50  = branch s50: s49-grpo (the forty-ninth session's prepared, never-run changes: softmax_chunk_stats
#               at four blocks an SM with one barrier for s's and t's sums; every held BF16 WGrad output settled in
#               one launch before each backward pass, grad_settle_multi; rmsnorm_bwd_rows1g8 / qk_norm_rope_bwd_r8
#               where a launch has fewer blocks than SMs) + the gradient norm's sum of squares a quad a trip with
#               four quads' loads in flight (sumsq_partial_multi read ~1.2 GB at ~1.7 TB/s, 0.70 ms a 0.6B step).
#               + fa_bwd_prep with four heads' loads in flight (0.55 ms a 0.6B step at ~2.4 TB/s).
#               + q and k before their norms kept as the rows GEMM's BF16 values (qk_norm_rope_128_x16,
#               qk_norm_rope_bwd_x16: 72 MB a 0.6B layer less written and read at 8 x 512; predicted ~0.5 ms a step).
# Test binaries from s50's build (they check the new kernels' bits); cuda_timing (release) times the backward's
# cuBLASLt GEMMs at 0.6B shapes, FP8 against BF16, with q/k/v and gate/up stacked (what one GEMM would take).
# Then 0.6B three reps interleaved (8 x 512 and the GRPO-shaped step), and the GRPO-shaped step with the
# daemon's default micro-batches if time is left.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_parity cuda_act cuda_invariant cuda_flash gpu_parity; do
  timeout 150 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-80)"; grep -E "panicked" $OUT/$t.log | head -5 | cut -c1-200
done
pack
timeout 60 ./.carry/cuda_timing backward_gemm_timing --ignored --nocapture > $OUT/bwd_timing.log 2>&1
echo "bwd timing rc $? (${SECONDS}s)"; grep TIMING $OUT/bwd_timing.log | cut -c17-250
pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 240 bash bench/gpu_check.sh compare qwen3-0.6b 3 jetd-main-fp8,jetd-s50-fp8,jetd-main-bf16,jetd-s50-bf16 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-250
python3 - <<PY
import json, glob
for b in ['jetd_main_fp8', 'jetd_s50_fp8', 'jetd_main_bf16', 'jetd_s50_bf16']:
    for f in sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))[:1]:
        d = json.load(open(f))
        t = d['train'][0]
        print(b, 'train', [(k[0][:24], round(k[1] * 1e3, 3)) for k in t['top_kernels'] if any(s in k[0] for s in ('softmax', 'settle', 'sumsq', 'bwd_prep', 'rmsnorm_bwd', 'qk_norm_rope', 'rows'))])
        for s in d.get('step', []):
            print(b, 'grpo', [(k[0][:24], round(k[1] * 1e3, 2), k[2]) for k in s.get('train_top_kernels', []) if any(x in k[0] for x in ('settle', 'qk_norm', 'colsum', 'rmsnorm_bwd', 'sumsq'))])
PY
# The torch.compile peer on the same machine (#11's bf16 row), if time is left.
if [ $SECONDS -lt 400 ]; then
  timeout 160 python3 bench/peer_torch.py --peer compile --no-rollout --preset qwen3-0.6b --json > $OUT/peer-compile.txt 2> $OUT/peer-compile.err
  echo "peer rc $? (${SECONDS}s)"; grep -E '^(#|train)' $OUT/peer-compile.txt | cut -c1-200; pack
fi
# The GRPO-shaped step with the daemon's default micro-batches (train.micro_batch 64 sequences,
# micro_batch_tokens auto) rather than the bench's --train-seqs 8.
if [ $SECONDS -lt 500 ]; then
  for b in jetd-main jetd-s50; do for f in fp8 bf16; do
    [ $SECONDS -lt 550 ] || break 2
    timeout 40 ./.carry/$b bench --device cuda --json --no-cublaslt --preset qwen3-0.6b --flow $f --batch 64 --gen-len 16 \
      --train-steps 1 --train-seqs 64 --train-len 64 --train-tokens auto > $OUT/grpo64-$b-$f.json 2> $OUT/grpo64-$b-$f.err
    echo "grpo64 $b $f rc $?: $(python3 -c "import json; s=json.load(open('$OUT/grpo64-$b-$f.json'))['step'][0]; print('train_s %.2f ms, total %.2f ms' % (s['train_s']*1e3, s['total_s']*1e3))" 2>&1 | tail -1)"
  done; done
  pack
fi
