#!/bin/bash
# Forty-seventh session, call 3: swiglu_bwd_fp8 makes both outputs in one block (one sigmoid a value; dup parked
# in shared memory as BF16) on top of 5c050b1 (jetd); against jetd-dual (call 2's, = 5c050b1) and jetd-main
# (966adc9; its bf16 flow for the ratio). Kept short (little device time left): cuda_parity (swiglu_bwd_fp8
# against the CPU quantizer and the unfused ops, bit for bit) and cuda_act, no gpu_parity. The test binaries are jetd's build (bash bench/gpu_check.sh --collect); wrappers add `--flow F`.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_parity cuda_act; do
  timeout 120 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $?: $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-80)"; grep -E "panicked|MISMATCH" $OUT/$t.log | head -5 | cut -c1-200
done
pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 200 bash bench/gpu_check.sh compare qwen3-8b:4,qwen3-0.6b 3 jetd-main-bf16,jetd-dual-fp8,jetd-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $?"; pack
python3 - <<PY
import json, glob, statistics as st
names = ['token_logprobs_bwd_fp8_z16', 'swiglu_bwd_fp8_dh16_gu16', 'quant_dual_multi', 'quant_dual_f32', 'swiglu_dual_gu16']
for shape in ['qwen3_8b_4l', 'qwen3_0.6b']:
    for b in ['jetd_main_bf16', 'jetd_dual_fp8', 'jetd_fp8']:
        xs, ks = [], {}
        for f in sorted(glob.glob('$OUT/cmp/%s-%s-*.json' % (shape, b))):
            try: t = json.load(open(f))['train'][0]
            except Exception as e: print(f, e); continue
            xs.append(t['step_s'] * 1e3)
            for k in t['top_kernels']:
                if k[0] in names: ks.setdefault(k[0], []).append(k[1] * 1e3)
        if xs: print(shape, b, 'mean %.2f' % st.mean(xs), ['%.2f' % x for x in xs], {k[:14]: '%.3f' % st.mean(v) for k, v in ks.items()})
PY
