#!/bin/bash
# Prepared in the sixty-second session, not run (its device time ran out). Two
# defines, both the same bits by construction, off by default:
# ROWS_HW_PACK=1: the rows kernels' BF16 outputs packed by the hardware conversion
#   (cvt.rn.bf16x2.f32, one instruction a pair; pack2_bf16 only for a warp tile
#   holding a NaN), epi_value's software rounding skipped (the pack rounds), and
#   the f32 outputs' round-1 tiles (o, down before their residual) rounded the same
#   way. Call 2's stall sampling put 38% of the FP8 rows kernel's warp samples in
#   the per-tile epilogue, mostly the software conversion (~15 instructions a pair).
#   Prediction: FP8 q 28.5 -> ~24-25 us, BF16 q 36.8 -> ~33; ~0.5-0.9 ms off each
#   flow's 0.6B step.
# SWIGLU_HW_BF16=1: swiglu_bwd_fp8's dgate rounding and dup pairs by the
#   instruction (416 of its ~2,750 instructions a thread fewer). Prediction: 67.6
#   -> ~58 us a launch, ~0.25 ms off the 0.6B fp8 step (FP8 only).
# ROWS_STAGE_RUN=1 (timed alone only): the rows kernels' consumers keep their stage
#   index and phase as running counters (no it % 5 each group). Prediction: 1-2%.
# If they win, make them the default (drop the defines). Run with timeout_s ~330;
# .carry: jetd, cuda_timing, cuda_act, cuda_invariant, cuda_parity, gpu_parity
# (stripped, gzipped).
R=$OUT; export OUT=/tmp/g3; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g3; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
BOTH="ROWS_HW_PACK=1 SWIGLU_HW_BF16=1"
# The bit checks. cuda_invariant: the fused epilogues (bias, BF16 rounding, the
# residual) against the host's bf16::round, rows == split-K at every batch.
# cuda_parity swiglu: the fused FP8 SwiGLU backward == quantize_dual of the
# software-rounded f32; cuda_act: BF16 outputs == rounded f32 (NaN / inf rows too).
JET_NVRTC_DEFINES="$BOTH" timeout 60 ./.carry/cuda_invariant --test-threads=1 > $OUT/cuda_invariant.log 2>&1
echo "cuda_invariant both rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/cuda_invariant.log | tail -3
# bf16_conversion: the instructions against f32_to_bf16 at all 2^32 f32 inputs.
JET_NVRTC_DEFINES="$BOTH" timeout 80 ./.carry/cuda_parity swiglu bf16_conversion --test-threads=1 --nocapture > $OUT/cuda_parity-swiglu.log 2>&1
echo "cuda_parity swiglu, bf16_conversion both rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked|cvt.rn' $OUT/cuda_parity-swiglu.log | tail -4
for d in "" "$BOTH"; do  # main: the NaN / inf rows test's first GPU run
  tag=${d:+both}; JET_NVRTC_DEFINES="$d" timeout 60 ./.carry/cuda_act --test-threads=1 --nocapture > $OUT/cuda_act-${tag:-main}.log 2>&1
  echo "cuda_act ${tag:-main} rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/cuda_act-${tag:-main}.log | tail -3
done
pack
row() { grep -E '^TIMING fp8 rows 4096' $1 | sed -E 's/.*rows ([0-9x]+) (\S+)\s*:.*\| rows\s+([0-9.]+) us.*BF16 out\s+([0-9.]+) us/\2 f32 \3 bf16 \4/'; }
for d in "" ROWS_HW_PACK=1 ROWS_STAGE_RUN=1; do
  JET_NVRTC_DEFINES=$d timeout 40 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/timing-${d:-main}.log 2>&1
  echo "fp8 timing ${d:-main} rc $? (${SECONDS}s)"; row $OUT/timing-${d:-main}.log
  JET_NVRTC_DEFINES=$d timeout 40 ./.carry/cuda_timing --ignored --exact bf16_rows_step_forms --nocapture > $OUT/bf16forms-${d:-main}.log 2>&1
  echo "bf16 forms ${d:-main} rc $? (${SECONDS}s)"; grep -E '^TIMING bf16 step' $OUT/bf16forms-${d:-main}.log | sed -E 's/TIMING bf16 step forms //; s/ TF//g; s/\| cold.*//' | cut -c1-120
done
pack
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk main-bf16 "" bf16; mk pack-bf16 "JET_NVRTC_DEFINES=ROWS_HW_PACK=1" bf16
mk main-fp8 "" fp8; mk pack-fp8 "JET_NVRTC_DEFINES=ROWS_HW_PACK=1" fp8; mk both-fp8 "JET_NVRTC_DEFINES='$BOTH'" fp8
JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3" timeout $((230 - SECONDS)) bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 2 main-bf16,pack-bf16,main-fp8,pack-fp8,both-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "\\| train \\||step training" $OUT/compare.txt | cut -c1-300
JET_NVRTC_DEFINES="$BOTH" timeout $((325 - SECONDS)) ./.carry/gpu_parity --test-threads=1 > $OUT/gpu_parity.log 2>&1
echo "gpu_parity both rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/gpu_parity.log | tail -2; pack
