#!/bin/bash
# Prepared in the sixty-third session (no device came), not run: the sixty-second
# session's call3.sh with ROWS_SKEW added. Three prepared forms, all off by default,
# all the same bits by construction:
# ROWS_HW_PACK=1 / SWIGLU_HW_BF16=1: the hardware BF16 conversions (s62/call3.sh's
#   header; predictions FP8 q 28.5 -> ~24-25 us, BF16 q 36.8 -> ~33, 0.5-0.9 ms off
#   each 0.6B step; swiglu_bwd_fp8 67.6 -> ~58 us, ~0.25 ms off fp8).
# ROWS_STAGE_RUN=1 (timed alone): running stage / phase counters. Prediction 1-2%.
# ROWS_SKEW=G: the rows kernels' second consumer warpgroup starts G groups behind
#   the first, so one's per-tile epilogue can run under the other's MMAs (both now
#   finish each tile together and the tensor cores wait through the epilogue).
#   Each epilogue can hide at most G groups of the other's MMAs (warpgroup 0's) or
#   S - G (warpgroup 1's), so G ~ S / 2: 2 or 3 for FP8 (S = 5), 1 for BF16 (S =
#   3; G = 3 there is the worst case, timed as the edge of the deadlock argument).
#   Prediction: FP8 q 28.5 -> ~24-26 us alone at G = 2 (20.0 without stores bounds
#   what it can hide), more with the hardware pack; BF16 less.
# Then: if the checks pass, make the winners the default (s63/hw-default.diff for
# the conversions) and run s63/call2.sh straight after (DEFS= the winning set).
# Run with timeout_s ~400; .carry: jetd, cuda_timing, cuda_act, cuda_invariant,
# cuda_parity, gpu_parity (stripped, gzipped).
R=$OUT; export OUT=/tmp/g1; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g1; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
BOTH="ROWS_HW_PACK=1 SWIGLU_HW_BF16=1"
ALL="$BOTH ROWS_SKEW=2"
# The bit checks. cuda_invariant: the fused epilogues against the host's
# bf16::round, rows == split-K at every batch (with the skew: no deadlock at any
# tile count either).
for spec in "both:$BOTH" "skew1:ROWS_SKEW=1" "skew3:ROWS_SKEW=3"; do
  tag=${spec%%:*}; JET_NVRTC_DEFINES="${spec#*:}" timeout 60 ./.carry/cuda_invariant --test-threads=1 > $OUT/cuda_invariant-$tag.log 2>&1
  echo "cuda_invariant $tag rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/cuda_invariant-$tag.log | tail -3
done
JET_NVRTC_DEFINES="$BOTH" timeout 80 ./.carry/cuda_parity swiglu bf16_conversion --test-threads=1 --nocapture > $OUT/cuda_parity-swiglu.log 2>&1
echo "cuda_parity swiglu, bf16_conversion both rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked|cvt.rn' $OUT/cuda_parity-swiglu.log | tail -4
for spec in "main:" "all:$ALL"; do
  tag=${spec%%:*}; JET_NVRTC_DEFINES="${spec#*:}" timeout 60 ./.carry/cuda_act --test-threads=1 --nocapture > $OUT/cuda_act-$tag.log 2>&1
  echo "cuda_act $tag rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/cuda_act-$tag.log | tail -3
done
pack
row() { grep -E '^TIMING fp8 rows 4096' $1 | sed -E 's/.*rows ([0-9x]+) (\S+)\s*:.*\| rows\s+([0-9.]+) us.*BF16 out\s+([0-9.]+) us/\2 f32 \3 bf16 \4/'; }
for spec in "main:" "hw:ROWS_HW_PACK=1" "run:ROWS_STAGE_RUN=1" "skew1:ROWS_SKEW=1" "skew2:ROWS_SKEW=2" "skew3:ROWS_SKEW=3" "hw-skew2:ROWS_HW_PACK=1 ROWS_SKEW=2"; do
  tag=${spec%%:*}; export JET_NVRTC_DEFINES="${spec#*:}"
  timeout 40 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/timing-$tag.log 2>&1
  echo "fp8 timing $tag rc $? (${SECONDS}s)"; row $OUT/timing-$tag.log
  timeout 40 ./.carry/cuda_timing --ignored --exact bf16_rows_step_forms --nocapture > $OUT/bf16forms-$tag.log 2>&1
  echo "bf16 forms $tag rc $? (${SECONDS}s)"; grep -E '^TIMING bf16 step' $OUT/bf16forms-$tag.log | sed -E 's/TIMING bf16 step forms //; s/ TF//g; s/\| cold.*//' | cut -c1-120
done
unset JET_NVRTC_DEFINES; pack
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk main-bf16 "" bf16; mk hw-bf16 "JET_NVRTC_DEFINES=ROWS_HW_PACK=1" bf16; mk skew-bf16 "JET_NVRTC_DEFINES='ROWS_HW_PACK=1 ROWS_SKEW=1'" bf16
mk main-fp8 "" fp8; mk both-fp8 "JET_NVRTC_DEFINES='$BOTH'" fp8; mk all-fp8 "JET_NVRTC_DEFINES='$ALL'" fp8
JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3" timeout $((320 - SECONDS)) bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 2 main-bf16,hw-bf16,skew-bf16,main-fp8,both-fp8,all-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "\\| train \\||step training" $OUT/compare.txt | cut -c1-300
JET_NVRTC_DEFINES="$ALL" timeout $((395 - SECONDS)) ./.carry/gpu_parity --test-threads=1 > $OUT/gpu_parity.log 2>&1
echo "gpu_parity all rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/gpu_parity.log | tail -2; pack
