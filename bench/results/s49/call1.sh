#!/bin/bash
# Forty-ninth session, call 1. Builds (wrappers add --flow F; binaries in .carryz/c.tar.xz):
#   jetd-prev = main 06efdc6 (the forty-eighth session's call 2: the attention's output quantized to both
#               groupings in the training forward at every size);
#   jetd      = main d4c4011: that only where quantize_dual's grid fills the GPU (dual_fills_gpu, 9d1341a), and
#               the bench's GRPO-shaped step with a profiled third step (train_top_kernels, 0470259); neither has
#               run on a GPU before this call;
#   jetd-qk   = + q's and k's norm + RoPE backward in one launch (qk_norm_rope_bwd over both sides' chunks,
#               colsum_final2 for both weights; the same bits): k's 128 chunks alone left one block an SM;
#   jetd-ls{2,4,5}-fp8 = jetd-qk with JET_NVRTC_DEFINES variants of softmax_chunk_stats_z16 (1.2 GB of logits at
#               ~1.5 TB/s, 80 registers, 3 blocks an SM): LS_SUM2 (s's and t's block sums under one pair of
#               barriers; the same trees, the same bits), + LS_MINB=4 (56 registers) or 5 (48, 16 bytes spilled).
#               One rep each, read by the profiled train row's kernel time.
# The GPU tests from jetd-qk's build , then 0.6B four reps interleaved (the 8 x 512 step should not move; the
# GRPO-shaped step's training phase should come back by ~2 ms), the fp8 and bf16 flows' kernels of that step's
# training phase side by side; on an H200 also the rollout bench (#12's H200 row) and the torch.compile peer.
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
timeout 300 bash bench/gpu_check.sh compare qwen3-0.6b 4 jetd-prev-fp8,jetd-fp8,jetd-qk-fp8,jetd-bf16,jetd-qk-bf16 > $OUT/cmp.log 2>&1
echo "compare rc $?"; pack
OUT=/tmp/g/ls timeout 80 bash bench/gpu_check.sh compare qwen3-0.6b 1 jetd-qk-fp8,jetd-ls2-fp8,jetd-ls4-fp8,jetd-ls5-fp8 > $OUT/cmp-ls.log 2>&1
echo "compare ls rc $?"; pack
python3 - <<PY
import json, glob
for f in sorted(glob.glob('$OUT/ls/cmp/*.json')):
    try: t = json.load(open(f))['train'][0]
    except Exception as e: print(f, e); continue
    print(f.split('/')[-1], '%.2f' % (t['step_s'] * 1e3), [(k[0][:26], round(k[1] * 1e3, 3)) for k in t['top_kernels'] if 'softmax' in k[0] or 'logprobs' in k[0]])
PY
grep -E "train \||step training" $OUT/compare.txt | cut -c1-250
python3 - <<PY
import json, glob
for b in ['jetd_fp8', 'jetd_qk_fp8', 'jetd_bf16', 'jetd_qk_bf16']:
    for f in sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))[:2]:
        try: t = json.load(open(f))['train'][0]
        except Exception as e: print(f, e); continue
        print(b, 'train', [(k[0][:26], round(k[1] * 1e3, 3)) for k in t['top_kernels'] if 'qk_norm' in k[0] or 'colsum' in k[0]])
for b in ['jetd_fp8', 'jetd_bf16']:
    f = sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))
    if not f: print(b, 'no JSON'); continue
    for s in json.load(open(f[0])).get('step', []):
        print(b, s.get('flow'), s.get('train_s'), [(k[0][:26], round(k[1] * 1e3, 2), k[2]) for k in s.get('train_top_kernels', [])[:16]])
PY
if grep -q H200 $OUT/gpu.txt && [ $SECONDS -lt 480 ]; then
  for f in fp8 bf16; do
    timeout 90 ./.carry/jetd bench --device cuda --json --no-cublaslt --preset qwen3-0.6b --flow $f --train-steps 0 > $OUT/roll-$f.json 2> $OUT/roll-$f.err; echo "roll $f rc $?"
  done
  pack
  python3 - <<PY
import json
for f in ['fp8', 'bf16']:
    try: d = json.load(open('$OUT/roll-%s.json' % f))
    except Exception as e: print(f, e); continue
    for r in d.get('rollout', []):
        print(f, {k: r[k] for k in r if k in ('batch', 'tokens_per_s', 'of_floor', 'decode_of_floor', 'decode_tokens_per_s')})
PY
  [ $SECONDS -lt 420 ] && timeout 170 python3 bench/peer_torch.py --peer compile --no-rollout --preset qwen3-0.6b --json > $OUT/peer-compile.txt 2> $OUT/peer-compile.err
  echo "peer rc $?"; grep -E '^(#|train)' $OUT/peer-compile.txt | cut -c1-200; pack
fi
