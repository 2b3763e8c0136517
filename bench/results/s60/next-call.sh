#!/bin/bash
# Prepared in the sixtieth session, not run (no machine came after call 1; then
# the device was paused). Build main into .carry (jetd, cuda_parity, cuda_timing,
# cuda_act, gpu_parity; stripped, gzipped); run with timeout_s ~400.
# Measures the FP8 rows kernel's BF16 outputs stored whole-sector from the
# registers (ROWS_BF16_QUAD, a define, off by default: 1 = a quad's two shuffles,
# 8-byte stores; 2 = a 4 x 4 transpose in the quad, 16-byte stores; 0 = main's
# staged stores). Call 1 found 4-byte stores (half sectors) 25% slower than the
# staged ones. If 1 or 2 wins in the step, make it the default (and the staged
# form stays for flash.cu's o).
# 1. fp8_rows_timing for 0, 1, 2 (the "rows BF16 out" column).
# 2. cuda_act (BF16 output == the rounded f32 output, bits) with 1 and 2.
# 3. gpu_parity with the faster of 1 and 2 (rollout == training bits).
# 4. cuda_parity (main's default: the GEMM tuning test's first GPU run).
# 5. The 0.6B 8 x 512 step: fp8 with 0 and the faster, bf16 (2 reps).
R=$OUT; export OUT=/tmp/g3; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g3; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for d in 0 1 2; do
  JET_NVRTC_DEFINES=ROWS_BF16_QUAD=$d timeout 60 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/timing-quad$d.log 2>&1
  echo "timing quad=$d rc $? (${SECONDS}s)"
done
for d in 0 1 2; do echo "== quad $d: $(grep -E '^TIMING fp8 rows 4096' $OUT/timing-quad$d.log | sed -E 's/.*rows 4096x[0-9]+x[0-9]+ (\S+)\s*:.*\| rows\s+([0-9.]+) us.*BF16 out\s+([0-9.]+) us/\1 f32 \2 bf16 \3/' | tr '\n' ';')"; done
pack
best=$(for d in 1 2; do printf '%s %s\n' "$(grep -E '^TIMING fp8 rows 4096x1024x2048' $OUT/timing-quad$d.log | sed -E 's/.*BF16 out\s+([0-9.]+) us.*/\1/')" $d; done | sort -n | head -1 | cut -d' ' -f2)
best=${best:-1}; echo "faster form: $best"
for d in 1 2; do
  JET_NVRTC_DEFINES=ROWS_BF16_QUAD=$d timeout 60 ./.carry/cuda_act --test-threads=1 --nocapture > $OUT/cuda_act-quad$d.log 2>&1
  echo "cuda_act quad=$d rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/cuda_act-quad$d.log | tail -2
done
pack
JET_NVRTC_DEFINES=ROWS_BF16_QUAD=$best timeout 100 ./.carry/gpu_parity --test-threads=1 > $OUT/gpu_parity-quad$best.log 2>&1
echo "gpu_parity quad=$best rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/gpu_parity-quad$best.log | tail -2; pack
timeout 120 ./.carry/cuda_parity --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/cuda_parity.log | tail -2
grep -E -A2 'gemm_algorithm_chosen_by_timing_is_kept' $OUT/cuda_parity.log | cut -c1-200; pack
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk q0-fp8 "" fp8; mk qb-fp8 "JET_NVRTC_DEFINES=ROWS_BF16_QUAD=$best" fp8; mk main-bf16 "" bf16
JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3" timeout $((380 - SECONDS)) bash bench/gpu_check.sh compare qwen3-0.6b 2 main-bf16,q0-fp8,qb-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "\\| train \\||step training|rollout" $OUT/compare.txt | cut -c1-260
