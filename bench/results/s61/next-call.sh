#!/bin/bash
# Prepared in the sixty-first session, not run (no device time left). Build main
# into .carry (jetd, cuda_timing, cuda_act, gpu_parity; stripped, gzipped); run
# with timeout_s ~480.
# 1. The rows kernels' BF16 outputs by the copy engine (main) against the warps'
#    stores (ROWS_BF16_WARP_STORES=1) at Qwen3-8B's shapes, where call 4 read the
#    step within its spread (fp8 63.42 -> 64.04 ms by the means, bf16 unclear).
# 2. ROWS_TMA_DOUBLE=1 (FP8 only): two epilogue stages a warp, five operand
#    stages. Tests the guess that a tile's second half-tile waits on the copy
#    engine's read of the first, queued behind the next tile's operand loads (q
#    29.2 us against 20.0 without stores). If so: q ~22-24 us, ~1 ms off the 0.6B
#    fp8 step; if not, about main's.
# Steps: fp8_rows_timing at 0.6B (main, DOUBLE) and 8B shapes (main, WARP_STORES,
# DOUBLE); cuda_act on main (its wider-buffer test not yet run on a GPU) and with
# DOUBLE; gpu_parity with DOUBLE; the 0.6B and 8B-4l steps (2 reps);
# on an H200 with time left, the 0.6B rollout (#12's fp8 batch-64 decode share).
R=$OUT; export OUT=/tmp/g5; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g5; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
row() { grep -E '^TIMING fp8 rows [0-9]{4}' $1 | sed -E 's/.*rows ([0-9x]+) (\S+)\s*:.*\| rows\s+([0-9.]+) us.*BF16 out\s+([0-9.]+) us/\1 \2 f32 \3 bf16 \4/'; }
for d in "" ROWS_TMA_DOUBLE=1; do
  JET_NVRTC_DEFINES=$d timeout 60 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/timing-06-${d:-main}.log 2>&1
  echo "timing 0.6B ${d:-main} rc $? (${SECONDS}s)"; row $OUT/timing-06-${d:-main}.log
done
for d in "" ROWS_BF16_WARP_STORES=1 ROWS_TMA_DOUBLE=1; do
  JET_TIMING_SHAPES=8b JET_NVRTC_DEFINES=$d timeout 90 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/timing-8b-${d:-main}.log 2>&1
  echo "timing 8b ${d:-main} rc $? (${SECONDS}s)"; row $OUT/timing-8b-${d:-main}.log
done
pack
for d in "" ROWS_TMA_DOUBLE=1; do  # main: the wider-buffer test's first GPU run
  JET_NVRTC_DEFINES=$d timeout 60 ./.carry/cuda_act --test-threads=1 --nocapture > $OUT/cuda_act-${d:-main}.log 2>&1
  echo "cuda_act ${d:-main} rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/cuda_act-${d:-main}.log | tail -2
done
JET_NVRTC_DEFINES=ROWS_TMA_DOUBLE=1 timeout 100 ./.carry/gpu_parity --test-threads=1 > $OUT/gpu_parity-double.log 2>&1
echo "gpu_parity double rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/gpu_parity-double.log | tail -2; pack
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk tma-bf16 "" bf16; mk ws-bf16 "JET_NVRTC_DEFINES=ROWS_BF16_WARP_STORES=1" bf16
mk tma-fp8 "" fp8; mk ws-fp8 "JET_NVRTC_DEFINES=ROWS_BF16_WARP_STORES=1" fp8; mk dbl-fp8 "JET_NVRTC_DEFINES=ROWS_TMA_DOUBLE=1" fp8
JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3" timeout $((440 - SECONDS)) bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 2 ws-bf16,tma-bf16,ws-fp8,tma-fp8,dbl-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "\\| train \\||step training" $OUT/compare.txt | cut -c1-320
if grep -q H200 $OUT/gpu.txt && [ $SECONDS -lt 400 ]; then
  for f in fp8 bf16; do
    timeout 35 ./.carry/jetd bench --device cuda --preset qwen3-0.6b --flow $f --train-steps 0 --json > $OUT/rollout-$f.json 2> $OUT/rollout-$f.err
    echo "rollout $f rc $? (${SECONDS}s)"
  done
  pack; python3 bench/results/s60/rollout_share.py $OUT/rollout-fp8.json $OUT/rollout-bf16.json
fi
