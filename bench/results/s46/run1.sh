#!/bin/bash
# Forty-sixth session, call 1: branch s46 (main + s45-next's loads-first bf16 SwiGLU kernels and rmsnorm_operand,
# the GRPO loss on the device: no host round trip a micro-batch, gpu_parity's two new tests) against main, both flows;
# jetd-tune-*: the same jetd with JET_LT_TUNE=8 (cuBLASLt's first 8 heuristic candidates timed a shape, the fastest kept).
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in gpu_parity cuda_parity cuda_act; do
  timeout 100 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $?"; grep -E "test result|panicked" $OUT/$t.log | tail -2 | cut -c1-200
done
pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 280 bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 2 jetd-main-bf16,jetd-bf16,jetd-tune-bf16,jetd-main-fp8,jetd-fp8,jetd-tune-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $?"; pack
for p in "jetd_main_bf16 jetd_bf16" "jetd_main_fp8 jetd_fp8" "jetd_bf16 jetd_tune_bf16" "jetd_fp8 jetd_tune_fp8"; do
  python3 bench/compare_builds.py $OUT/cmp $p | grep -E 'train' | cut -c1-200
done
grep -h 'cuBLASLt' $OUT/cmp/*tune*-1.err | sort | uniq | head -40 | cut -c1-220
python3 - <<PY
import json, glob
for f in sorted(glob.glob('$OUT/cmp/*-1.json')):
    try: t = json.load(open(f))['train'][0]
    except Exception as e: print(f, e); continue
    ks = {k[0]: k[1] for k in t['top_kernels']}
    sel = {k: round(v * 1e3, 3) for k, v in ks.items() if 'swiglu' in k or 'rmsnorm_operand' in k or 'cublas' in k}
    idle = [(k[0], round(k[1] * 1e3, 3)) for k in t['idle_before'][:2]]
    print(f.split('/')[-1], 'step %.2f' % (t['step_s'] * 1e3), sel, idle)
PY
# The decode share at 128 + 128 (issue #12's measure; the H200's fp8 batch 64 is the open one).
for f in fp8 bf16; do
  timeout 60 ./.carry/jetd bench --device cuda --json --no-cublaslt --preset qwen3-0.6b --flow $f --train-steps 0 > $OUT/roll-$f.json 2> $OUT/roll-$f.err; echo "roll $f rc $?"
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
