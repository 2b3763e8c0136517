#!/bin/bash
# Session 40, call 6: micro-batches by tokens against one micro-batch of all 64
# sequences (the config default: train.micro_batch 64, no token bound). The
# GRPO-shaped step of call 1 (prompt 128, responses of 1-512 tokens, 8 samples a
# prompt, batch 64): up to 64 sequences (jetd-m64), within 16,384 (jetd-t16k) or
# 32,768 tokens (jetd-t32k); 0.6B and 8B-4l; peak memory read from the JSON.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
JET_BENCH_ARGS="--train-steps 1 --batch 64 --group-size 8 --prompt-len 128 --gen-len 512 --eos-random" bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 1 jetd-m64,jetd-t16k,jetd-t32k > $OUT/main.log 2>&1
pack
python3 bench/compare_builds.py $OUT/cmp jetd_m64 jetd_t16k jetd_t32k | grep -E 'step' | cut -c1-200
python3 - <<'P'
import json,glob
for f in sorted(glob.glob('/tmp/g/cmp/*.json')):
    try: d=json.load(open(f))
    except Exception as e: print(f.split('/')[-1], 'ERR', e); continue
    print(f.split('/')[-1], 'peak GiB %.1f' % d.get('peak_mem_gib', 0))
P
for f in /tmp/g/cmp/*.err; do grep -il "error" $f >/dev/null && { echo "$f:"; tail -2 $f; }; done
