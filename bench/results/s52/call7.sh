#!/bin/bash
# Fifty-second session, call 7 (the last device time): branch s52-dgrad's checks, then 0.6B sep / wd / bf16, one rep.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_stacked gpu_parity cuda_parity; do
  timeout 70 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-80)"; grep -E "panicked|FAILED|failed" $OUT/$t.log | head -5 | cut -c1-200
done
grep -E "PARITY" $OUT/cuda_stacked.log | cut -c1-150
pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout $((225 - SECONDS)) bash bench/gpu_check.sh compare qwen3-0.6b 1 jetd-sep-fp8,jetd-wd-fp8,jetd-main-bf16 > $OUT/cmp.log 2>&1
echo "compare 0.6b rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-300
