#!/bin/bash
# Prepared in the sixty-first session, not run (no device time left). Build main
# into .carry (jetd, cuda_timing; stripped, gzipped); run with timeout_s ~420.
# The rows kernels' BF16 outputs by the copy engine (main) against the warps'
# stores (ROWS_BF16_WARP_STORES=1) at Qwen3-8B's shapes, where call 4 read the
# step within its spread (fp8 63.42 -> 64.04 ms by the means, bf16 unclear):
# 1. fp8_rows_timing at the 8B shapes (JET_TIMING_SHAPES=8b), both forms;
# 2. the 8B-4l and 0.6B steps, both forms and flows, 3 reps;
# 3. on an H200: the 0.6B rollout (#12's fp8 batch-64 decode share there).
R=$OUT; export OUT=/tmp/g5; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g5; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for d in "" ROWS_BF16_WARP_STORES=1; do
  JET_TIMING_SHAPES=8b JET_NVRTC_DEFINES=$d timeout 90 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/timing-8b-${d:-main}.log 2>&1
  echo "timing 8b ${d:-main} rc $? (${SECONDS}s)"
  grep -E '^TIMING fp8 rows' $OUT/timing-8b-${d:-main}.log | sed -E 's/.*rows ([0-9x]+) (\S+)\s*:.*\| rows\s+([0-9.]+) us.*BF16 out\s+([0-9.]+) us/\1 \2 f32 \3 bf16 \4/'
done
pack
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk tma-bf16 "" bf16; mk ws-bf16 "JET_NVRTC_DEFINES=ROWS_BF16_WARP_STORES=1" bf16
mk tma-fp8 "" fp8; mk ws-fp8 "JET_NVRTC_DEFINES=ROWS_BF16_WARP_STORES=1" fp8
JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3" timeout $((330 - SECONDS)) bash bench/gpu_check.sh compare qwen3-8b:4,qwen3-0.6b 3 ws-bf16,tma-bf16,ws-fp8,tma-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "\\| train \\||step training" $OUT/compare.txt | cut -c1-300
if grep -q H200 $OUT/gpu.txt; then
  for f in fp8 bf16; do
    timeout 45 ./.carry/jetd bench --device cuda --preset qwen3-0.6b --flow $f --train-steps 0 --json > $OUT/rollout-$f.json 2> $OUT/rollout-$f.err
    echo "rollout $f rc $? (${SECONDS}s)"
  done
  pack; python3 bench/results/s60/rollout_share.py $OUT/rollout-fp8.json $OUT/rollout-bf16.json
fi
