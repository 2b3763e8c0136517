#!/bin/bash
# Forty-seventh session, call 1 (the forty-sixth session's run3.sh, gpu_parity first): a GPU pass returns once queued (run_pass_gpu_queued; the scores come down after
# the optimizer step is queued) against call 1's s46 build (jetd-prev: the wait at the pass's end) and main.
# Build in .carry (stripped: bench/gpu_check.sh --collect strips): jetd = f6c24fb or later
# (with gpu_parity from the same commit), jetd-prev = 35d84e7 (call 1's build), jetd-main = c3bfe9b (the session's
# start); wrappers jetd[-prev|-main]-{fp8,bf16} adding `--flow F`, as bench/results/s45/next-call.sh writes them.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g3; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g3; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 100 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E "test result|panicked" $OUT/gpu_parity.log | tail -2 | cut -c1-200
pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 200 bash bench/gpu_check.sh compare qwen3-8b:4,qwen3-0.6b 3 jetd-main-bf16,jetd-prev-bf16,jetd-bf16,jetd-main-fp8,jetd-prev-fp8,jetd-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $?"; pack
python3 - <<PY
import json, glob, statistics as st
for shape in ['qwen3_8b_4l', 'qwen3_0.6b']:
    for fl in ['bf16', 'fp8']:
        for b in ['jetd_main', 'jetd_prev', 'jetd']:
            xs, idle = [], []
            for f in sorted(glob.glob('$OUT/cmp/%s-%s_%s-*.json' % (shape, b, fl))):
                try: t = json.load(open(f))['train'][0]
                except Exception as e: print(f, e); continue
                xs.append(t['step_s'] * 1e3); idle.append([(k[0][:20], round(k[1] * 1e3, 3)) for k in t['idle_before'][:2]])
            if xs: print(shape, fl, b, 'mean %.2f' % st.mean(xs), ['%.2f' % x for x in xs], idle[0])
PY
