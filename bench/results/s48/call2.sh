#!/bin/bash
# Forty-eighth session, call 2. Builds (wrappers add --flow F):
#   jetd-main = main 1c111f4's code (call 1's jetd);
#   jetd-attn = + the attention's output quantized to both FP8 groupings in one pass in the training forward
#               (branch s48-attn-dual: XOperand::make_dual, quant_dual_f32 in place of quant_row1x128_f32 there
#               and of the attn entry of the backward's quant_dual_multi_f32);
#   jetd      = + the quantizers' quotient as x * RN(1/s) (branch s48-mul: fp8::quotient, common.cuh qdiv; one
#               multiplication a value in place of Markstein's four; a spec change, the CPU's too).
# Checks from jetd's build (gpu_parity-attn from jetd-attn's), four reps interleaved, and on an H200 the
# rollout bench. (The torch.compile peer was dropped from this call: failed starts left too little device time.)
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in gpu_parity-attn cuda_parity cuda_act cuda_invariant cuda_flash gpu_parity; do
  timeout 120 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $?: $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-80)"; grep -E "panicked" $OUT/$t.log | head -5 | cut -c1-200
  pack
done
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 280 bash bench/gpu_check.sh compare qwen3-8b:4,qwen3-0.6b 4 jetd-main-fp8,jetd-attn-fp8,jetd-fp8,jetd-bf16 > $OUT/cmp.log 2>&1
echo "compare rc $?"; pack
python3 - <<PY
import json, glob, statistics as st
names = ['quant_row1x128_f32', 'quant_dual_f32', 'quant_dual_multi_f32', 'quant_dual_multi_bf16', 'swiglu_bwd_fp8_dh16_gu16', 'token_logprobs_bwd_fp8_z16', 'swiglu_dual_gu16', 'adamw_block128_multi']
for shape in ['qwen3_8b_4l', 'qwen3_0.6b']:
    for b in ['jetd_bf16', 'jetd_main_fp8', 'jetd_attn_fp8', 'jetd_fp8']:
        xs, ks, pk, tps = [], {}, [], []
        for f in sorted(glob.glob('$OUT/cmp/%s-%s-*.json' % (shape, b))):
            try: t = json.load(open(f))['train'][0]
            except Exception as e: print(f, e); continue
            xs.append(t['step_s'] * 1e3); pk.append(t['peak_gib']); tps.append(t['tokens_per_s'])
            for k in t['top_kernels']:
                if k[0] in names: ks.setdefault(k[0], []).append(k[1] * 1e3)
        if xs: print(shape, b, 'mean %.2f' % st.mean(xs), ['%.2f' % x for x in xs], 'tok/s %.0f' % st.mean(tps), 'peak %.2f' % max(pk), {k[-12:]: '%.3f' % st.mean(v) for k, v in ks.items()})
PY
# On an H200 only: the rollout bench (#12's H200 row, not re-measured since the thirty-eighth session).
if grep -q H200 $OUT/gpu.txt; then
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
fi
