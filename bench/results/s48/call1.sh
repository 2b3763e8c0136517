#!/bin/bash
# Forty-eighth session, call 1: the forty-seventh session's next-call.sh, with one more change on the branch
# (s48-split = s47-swiglu + quant_dual_multi's one-form kernels, _bf16 and _f32: no spills). Branch s47-swiglu
# on main f10e395 (its code is 5c050b1's):
#   54a5fb6 swiglu_bwd_fp8 with one block a tile (fp8 flow only), and
#   token_logprobs_bwd with four quads a thread (the bf16 and f32 flows' log-prob backward only),
# so each flow's change is read off its own rows. .carry (prepared on this machine, .carryz/c.tar.xz; rebuild
# if either branch moved): jetd = the branch's tip, jetd-main = main 5c050b1 (call 2's jetd-dual binary);
# wrappers jetd[-main]-{fp8,bf16} add `--flow F`; cuda_parity, cuda_act, gpu_parity from the branch's build
# (bash bench/gpu_check.sh --collect). Land each change only if its checks pass and its flow's step is faster.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_parity cuda_act gpu_parity; do
  timeout 120 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $?: $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-80)"; grep -E "panicked|MISMATCH" $OUT/$t.log | head -5 | cut -c1-200
  pack
done
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 300 bash bench/gpu_check.sh compare qwen3-8b:4,qwen3-0.6b 4 jetd-main-bf16,jetd-bf16,jetd-main-fp8,jetd-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $?"; pack
python3 - <<PY
import json, glob, statistics as st
names = ['token_logprobs_bwd_z16', 'token_logprobs_bwd_fp8_z16', 'swiglu_bwd_fp8_dh16_gu16', 'quant_dual_multi', 'quant_dual_multi_bf16', 'quant_dual_multi_f32']
for shape in ['qwen3_8b_4l', 'qwen3_0.6b']:
    for b in ['jetd_main_bf16', 'jetd_bf16', 'jetd_main_fp8', 'jetd_fp8']:
        xs, ks = [], {}
        for f in sorted(glob.glob('$OUT/cmp/%s-%s-*.json' % (shape, b))):
            try: t = json.load(open(f))['train'][0]
            except Exception as e: print(f, e); continue
            xs.append(t['step_s'] * 1e3)
            for k in t['top_kernels']:
                if k[0] in names: ks.setdefault(k[0], []).append(k[1] * 1e3)
        if xs: print(shape, b, 'mean %.2f' % st.mean(xs), ['%.2f' % x for x in xs], {k[-12:]: '%.3f' % st.mean(v) for k, v in ks.items()})
PY
# Then the rollout bench of the branch's jetd at 0.6B (fp8, bf16): on an H200 this re-measures #12's H200 row.
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
