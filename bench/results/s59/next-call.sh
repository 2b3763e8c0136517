#!/bin/bash
# Prepared in the fifty-ninth session, not run (its device time ran out: three
# starts failed). Build main (jetd, cuda_parity, cuda_timing, gpu_parity into .carry/
# gzipped). Checks the GEMM tuning's size classes (gemm.rs `bucket`, not yet run on
# a GPU) and measures ROWS_BF16_DIRECT (a define: the FP8 rows kernel's BF16
# outputs stored from registers as 4-byte pairs instead of staged through shared
# memory; in a step the staged BF16 stores ran slower than f32 ones) with
# fp8_rows_timing's BF16-out column. Run with timeout_s ~190.
# 1. cuda_parity (its new tuning test first run on a GPU).
# 2. fp8_rows_timing, staged / direct BF16 stores.
# 3. gpu_parity with the direct stores (rollout == training bits in fp8).
# 4. The 0.6B step with responses of random length (token counts change every step):
#    bf16, fp8 untuned, fp8 staged, fp8 direct (as much as the call's time allows).
R=$OUT; export OUT=/tmp/g7; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g7; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 40 ./.carry/cuda_parity --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/cuda_parity.log | tail -3
grep -E 'chosen algorithm|^TUNED' $OUT/cuda_parity.log | cut -c1-220
for d in 0 1; do
  JET_NVRTC_DEFINES=ROWS_BF16_DIRECT=$d timeout 60 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/timing-direct$d-$SECONDS.log 2>&1
  echo "timing direct=$d rc $? (${SECONDS}s)"
done
for f in $OUT/timing-direct*.log; do echo "== $(basename $f)"; grep -E "^TIMING fp8 rows 4096" $f | sed -E 's/.*rows 4096x[0-9]+x[0-9]+ (\S+)\s*:.*\| rows\s+([0-9.]+) us.*BF16 out\s+([0-9.]+) us/\1 f32 \2 bf16 \3/' | tr '\n' ';'; echo; done
pack
JET_NVRTC_DEFINES=ROWS_BF16_DIRECT=1 timeout 100 ./.carry/gpu_parity --test-threads=1 > $OUT/gpu_parity.log 2>&1
echo "gpu_parity (direct) rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/gpu_parity.log | tail -3
pack
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk staged-fp8 "" fp8; mk direct-fp8 "JET_NVRTC_DEFINES=ROWS_BF16_DIRECT=1" fp8; mk t0-fp8 "JET_GEMM_TUNE=0" fp8; mk main-bf16 "" bf16
JET_BENCH_ARGS="--batch 64 --gen-len 128 --eos-random --train-steps 3" timeout $((175 - SECONDS)) bash bench/gpu_check.sh compare qwen3-0.6b 1 main-bf16,t0-fp8,staged-fp8,direct-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "\\| train \\||step training|step whole" $OUT/compare.txt | cut -c1-300
pack
