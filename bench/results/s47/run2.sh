#!/bin/bash
# Forty-seventh session, call 2: jetd-dual = dual_tile's scales made once a row and once a column, and the
# log-prob backward's row statistics through shared memory (worktree wt-dual: main 966adc9 + quantize.cu);
# jetd = that plus fa_fwd writing the o projection's FP8 1x128 operand (main's working tree); jetd-main =
# 966adc9 (call 1's jetd). Wrappers jetd[-main|-dual]-{fp8,bf16} add `--flow F`; the test binaries are
# jetd's build (bash bench/gpu_check.sh --collect). Five reps each, interleaved (the record), then the
# rollout bench of jetd at 0.6B (fp8, bf16).
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_parity cuda_act cuda_invariant cuda_flash; do
  timeout 120 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $?: $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-80)"; grep -E "panicked|MISMATCH" $OUT/$t.log | head -5 | cut -c1-200
done
pack
timeout 100 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?: $(grep -E '^test result' $OUT/gpu_parity.log | tail -1 | cut -c1-80)"; grep -E "panicked" $OUT/gpu_parity.log | head -3 | cut -c1-200
pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 330 bash bench/gpu_check.sh compare qwen3-8b:4,qwen3-0.6b 5 jetd-main-bf16,jetd-main-fp8,jetd-dual-fp8,jetd-fp8,jetd-bf16 > $OUT/cmp.log 2>&1
echo "compare rc $?"; pack
python3 - <<PY
import json, glob, statistics as st
names = ['fa_fwd_128', 'quant_row1x128_f32', 'token_logprobs_bwd_fp8_z16', 'swiglu_bwd_fp8_dh16_gu16', 'quant_dual_multi', 'quant_dual_f32', 'swiglu_dual_gu16']
for shape in ['qwen3_8b_4l', 'qwen3_0.6b']:
    for b in ['jetd_main_bf16', 'jetd_bf16', 'jetd_main_fp8', 'jetd_dual_fp8', 'jetd_fp8']:
        xs, ks = [], {}
        for f in sorted(glob.glob('$OUT/cmp/%s-%s-*.json' % (shape, b))):
            try: t = json.load(open(f))['train'][0]
            except Exception as e: print(f, e); continue
            xs.append(t['step_s'] * 1e3)
            for k in t['top_kernels']:
                if k[0] in names: ks.setdefault(k[0], []).append(k[1] * 1e3)
        if xs: print(shape, b, 'mean %.2f' % st.mean(xs), ['%.2f' % x for x in xs], {k[:14]: '%.3f' % st.mean(v) for k, v in ks.items()})
PY
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
