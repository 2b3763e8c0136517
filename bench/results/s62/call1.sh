#!/bin/bash
# The sixty-second session's call 1 (the sixty-first's next-call.sh, with
# ROWS_TMA_DOUBLE now for both rows kernels). Build main into .carry (jetd,
# cuda_timing, cuda_act, gpu_parity; stripped, gzipped); run with timeout_s ~480.
# ROWS_TMA_DOUBLE=1: two 2 KiB epilogue stages a warp (a warp's whole 16 x 128
# BF16 tile), so a tile's second half-tile does not wait for the copy engine's
# read of the first. The guess it tests: the copy engine's reads of a tile's first
# halves drain at DRAM's write rate while every SM's warps wait on them (LM head:
# 1,772 us with stores, 1,303 without in s27's terms, i.e. the write not hidden).
# Prediction: FP8 q 29.2 -> ~22-24 us, LM head 1,772 -> ~1,400; BF16 likewise a
# few per cent; the 0.6B fp8 step ~1 ms shorter, bf16 ~1 ms.
# 1. fp8_rows_timing (0.6B shapes) and bf16_rows_step_forms, main and DOUBLE;
# 2. cuda_act on main (the wider-buffer test's first GPU run) and DOUBLE;
#    gpu_parity DOUBLE (rollout == training bits with it);
# 3. the 0.6B and 8B-4l steps: bf16 and fp8, main and DOUBLE, 2 reps;
# 4. fp8_rows_timing at 8B shapes, main and DOUBLE, if time is left;
# 5. on an H200 with time left, the 0.6B rollout (#12's fp8 batch-64 decode share).
R=$OUT; export OUT=/tmp/g1; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g1; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
row() { grep -E '^TIMING fp8 rows [0-9]{4}' $1 | sed -E 's/.*rows ([0-9x]+) (\S+)\s*:.*\| rows\s+([0-9.]+) us.*BF16 out\s+([0-9.]+) us/\1 \2 f32 \3 bf16 \4/'; }
for d in "" ROWS_TMA_DOUBLE=1; do
  JET_NVRTC_DEFINES=$d timeout 60 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/timing-06-${d:-main}.log 2>&1
  echo "timing 0.6B ${d:-main} rc $? (${SECONDS}s)"; row $OUT/timing-06-${d:-main}.log
  JET_NVRTC_DEFINES=$d timeout 60 ./.carry/cuda_timing --ignored --exact bf16_rows_step_forms --nocapture > $OUT/bf16forms-${d:-main}.log 2>&1
  echo "bf16 forms ${d:-main} rc $? (${SECONDS}s)"; grep -E '^TIMING bf16 step' $OUT/bf16forms-${d:-main}.log | sed -E 's/TIMING bf16 step forms //; s/ TF//g' | cut -c1-150
done
pack
for d in "" ROWS_TMA_DOUBLE=1; do  # main: the wider-buffer test's first GPU run
  JET_NVRTC_DEFINES=$d timeout 60 ./.carry/cuda_act --test-threads=1 --nocapture > $OUT/cuda_act-${d:-main}.log 2>&1
  echo "cuda_act ${d:-main} rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/cuda_act-${d:-main}.log | tail -2
done
JET_NVRTC_DEFINES=ROWS_TMA_DOUBLE=1 timeout 100 ./.carry/gpu_parity --test-threads=1 > $OUT/gpu_parity-double.log 2>&1
echo "gpu_parity double rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/gpu_parity-double.log | tail -2; pack
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk tma-bf16 "" bf16; mk dbl-bf16 "JET_NVRTC_DEFINES=ROWS_TMA_DOUBLE=1" bf16
mk tma-fp8 "" fp8; mk dbl-fp8 "JET_NVRTC_DEFINES=ROWS_TMA_DOUBLE=1" fp8
JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3" timeout $((400 - SECONDS)) bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 2 tma-bf16,dbl-bf16,tma-fp8,dbl-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "\\| train \\||step training" $OUT/compare.txt | cut -c1-320
for d in "" ROWS_TMA_DOUBLE=1; do
  [ $SECONDS -lt 420 ] || break
  JET_TIMING_SHAPES=8b JET_NVRTC_DEFINES=$d timeout $((470 - SECONDS)) ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/timing-8b-${d:-main}.log 2>&1
  echo "timing 8b ${d:-main} rc $? (${SECONDS}s)"; row $OUT/timing-8b-${d:-main}.log
done
pack
if grep -q H200 $OUT/gpu.txt && [ $SECONDS -lt 400 ]; then
  for f in fp8 bf16; do
    timeout 35 ./.carry/jetd bench --device cuda --preset qwen3-0.6b --flow $f --train-steps 0 --json > $OUT/rollout-$f.json 2> $OUT/rollout-$f.err
    echo "rollout $f rc $? (${SECONDS}s)"
  done
  pack; python3 bench/results/s60/rollout_share.py $OUT/rollout-fp8.json $OUT/rollout-bf16.json
fi
