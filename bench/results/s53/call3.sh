#!/bin/bash
# Fifty-third session, call 3: the BF16 stacked WGrad and DGrad (q/k/v, gate/up) checks, then
# 0.6B sep-bf16 (none stacked) / w-bf16 (WGrad stacked) / main-bf16 (both) / wd-fp8, 3 reps;
# 8B-4l 2 reps; then the torch.compile peer at 0.6B.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_stacked_bf16 cuda_flash cuda_act cuda_invariant cuda_stacked cuda_parity gpu_parity; do
  timeout 150 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-60)"; grep -E "panicked|FAILED|failed" $OUT/$t.log | head -5 | cut -c1-200
done
grep -hE "PARITY|bit-identical" $OUT/cuda_stacked_bf16.log | cut -c1-160
grep -hE "stacked dy" $OUT/cuda_flash.log | cut -c1-160
grep -hE "rewritten by AdamW" $OUT/gpu_parity.log | cut -c1-160
pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 150 bash bench/gpu_check.sh compare qwen3-0.6b 3 jetd-sep-bf16,jetd-w-bf16,jetd-main-bf16,jetd-wd-fp8 > $OUT/cmp.log 2>&1
echo "compare 0.6b rc $? (${SECONDS}s)"; pack
timeout 120 bash bench/gpu_check.sh compare qwen3-8b:4 2 jetd-sep-bf16,jetd-main-bf16,jetd-wd-fp8 > $OUT/cmp8.log 2>&1
echo "compare 8b rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-330
python3 - <<PY
import json, glob
for shape in ['qwen3_0.6b']:
  for b in ['jetd_sep_bf16', 'jetd_w_bf16', 'jetd_main_bf16', 'jetd_wd_fp8']:
    for f in sorted(glob.glob('$OUT/cmp/%s-%s-*.json' % (shape, b)))[:1]:
        d = json.load(open(f)); t = d['train'][0]
        g = [(round(k[1]*1e3, 2), k[2]) for s in d.get('step', []) for k in s.get('train_top_kernels', []) if 'cublas' in k[0]]
        print(b, 'train', [(k[0][:22], round(k[1] * 1e3, 3), k[2]) for k in t['top_kernels'] if any(s in k[0] for s in ('cublas', 'swiglu_bwd', 'qk_norm_rope_bwd', 'fa_bwd_kv', 'rmsnorm_bwd'))], 'grpo cublas', g)
PY
if [ $SECONDS -lt 380 ]; then
  timeout 190 python3 bench/peer_torch.py --peer compile --no-rollout --preset qwen3-0.6b --json > $OUT/peer-compile.txt 2> $OUT/peer-compile.err
  echo "peer rc $? (${SECONDS}s)"; grep -E '^train' $OUT/peer-compile.txt | cut -c1-120; pack
fi
