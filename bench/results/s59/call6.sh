#!/bin/bash
# The fifty-ninth session's call 6: one 0.6B training update's kernels timed alone by
# Nsight Compute (gpu_check.sh ncustep), fp8 then bf16: every launch's device time in
# order, so the rows kernels' in-step cost can be read per projection and epilogue
# form (bench/results/s59 notes). jetd as call 3's with ROWS_RES_PREFETCH=0 (main's).
R=$OUT; export OUT=/tmp/g6; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g6; }
gunzip -f .carry/*.gz 2>/dev/null
export JET_NVRTC_DEFINES=ROWS_RES_PREFETCH=0
for f in fp8 bf16; do
  timeout 250 bash bench/gpu_check.sh ncustep $f qwen3-0.6b > $OUT/ncustep-$f.log 2>&1
  echo "ncustep $f rc $? (${SECONDS}s)"; pack
  head -12 $OUT/ncu-step-$f-qwen3-0.6b.txt
done
