#!/bin/bash
# NOT run: no machine came after call 1 (nine asks); next-call.sh is its successor. The builds are branch s49-grpo's (6acbc7f = af6d7bc's tree)
# and main d4c4011 as jetd-main; rebuild them if main has moved (main now has the q/k pair, 8e06fcd).
# Forty-ninth session, call 4: the last start's worth of device time (~200 s): call 3 cut to the bitwise checks
# of jetd-g8's build (cuda_parity, gpu_parity, cuda_invariant), then one rep each of main and g8 (fp8) if time.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_parity gpu_parity cuda_invariant; do
  timeout 90 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $?: $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-80)"; grep -E "panicked" $OUT/$t.log | head -5 | cut -c1-200
  pack
done
if [ $SECONDS -lt 150 ]; then
  export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
  timeout $((185 - SECONDS)) bash bench/gpu_check.sh compare qwen3-0.6b 1 jetd-main-fp8,jetd-g8-fp8 > $OUT/cmp.log 2>&1
  echo "compare rc $?"; pack
  grep -E "train \||step training" $OUT/compare.txt | cut -c1-250
fi
