#!/bin/bash
# Session 40, call 5: the decode attention prefetching the key tiles past the next
# one to L2 (FA_DEC_PF, a compile-time define; no shared memory, the same bits):
# cuda_flash with 2 tiles; the rollout with 0 (jetd), 1 and 2 tiles (jetd-pf1,
# jetd-pf2): prompt 512 with 8 samples a prompt (batch 64), then prompt 128 with
# one (batch 64 and 256), 128 new tokens.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
JET_NVRTC_DEFINES="FA_DEC_PF=2" timeout 200 ./.carry/cuda_flash --test-threads=1 --nocapture > $OUT/cuda_flash-pf2.log 2>&1; echo "cuda_flash pf2 rc $?"
grep -E '^test result' $OUT/cuda_flash-pf2.log; grep -E 'decode' $OUT/cuda_flash-pf2.log | grep -v ' 0 differing' | head
mkdir -p $OUT/a $OUT/b
OUT=$OUT/a JET_BENCH_ARGS="--train-steps 0 --batch 64 --group-size 8 --prompt-len 512 --gen-len 128" bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 2 jetd,jetd-pf1,jetd-pf2 > $OUT/a/main.log 2>&1
pack; echo "== prompt 512, 8 samples a prompt, batch 64"; grep -E 'rollout' $OUT/a/compare.txt | cut -c1-260
OUT=$OUT/b JET_BENCH_ARGS="--train-steps 0 --batch 64,256 --prompt-len 128 --gen-len 128" bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 1 jetd,jetd-pf1,jetd-pf2 > $OUT/b/main.log 2>&1
pack; echo "== prompt 128, batch 64 and 256"; grep -E 'rollout' $OUT/b/compare.txt | cut -c1-260
