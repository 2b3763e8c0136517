#!/bin/bash
# The sixty-first session's call 1 (the sixtieth's next-call.sh plus the TMA-store
# form). Build main into .carry (jetd, cuda_parity, cuda_timing, cuda_act,
# gpu_parity; stripped, gzipped).
# The rows kernels' BF16 outputs (q, k, v, gate, up, logits), four forms:
#   QUAD=0  main: the warp's staged tile left by 16-byte stores;
#   QUAD=1  two shuffles in a quad, 8-byte stores from the registers;
#   QUAD=2  a 4 x 4 transpose in the quad, 16-byte stores;
#   TMA=1   the staged tile left through the copy engine (cp.async.bulk.tensor
#           store), the consumers on to the next tile while the bytes drain.
# 1. fp8_rows_timing for each form (the "rows BF16 out" column).
# 2. cuda_act (BF16 output == the rounded f32 output, bits) with TMA and the fastest.
# 3. gpu_parity with the fastest (rollout == training bits).
# 4. The 0.6B 8 x 512 step: fp8 main and fastest, bf16 main and TMA (2 reps).
# 5. cuda_parity if time is left (main's default: the GEMM tuning test's first
#    GPU run). Run with timeout_s ~370.
R=$OUT; export OUT=/tmp/g1; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g1; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
forms="ROWS_BF16_QUAD=0 ROWS_BF16_QUAD=1 ROWS_BF16_QUAD=2 ROWS_BF16_TMA=1"
for d in $forms; do
  JET_NVRTC_DEFINES=$d timeout 60 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/timing-$d.log 2>&1
  echo "timing $d rc $? (${SECONDS}s)"
done
for d in $forms; do echo "== $d: $(grep -E '^TIMING fp8 rows 4096' $OUT/timing-$d.log | sed -E 's/.*rows 4096x[0-9]+x[0-9]+ (\S+)\s*:.*\| rows\s+([0-9.]+) us.*BF16 out\s+([0-9.]+) us/\1 f32 \2 bf16 \3/' | tr '\n' ';')"; done
pack
best=$(for d in ROWS_BF16_QUAD=1 ROWS_BF16_QUAD=2 ROWS_BF16_TMA=1; do printf '%s %s\n' "$(grep -E '^TIMING fp8 rows 4096x1024x2048' $OUT/timing-$d.log | sed -E 's/.*BF16 out\s+([0-9.]+) us.*/\1/')" $d; done | sort -n | head -1 | cut -d' ' -f2)
best=${best:-ROWS_BF16_TMA=1}; echo "fastest form: $best"
for d in $(printf "ROWS_BF16_TMA=1\n$best\n" | sort -u); do
  JET_NVRTC_DEFINES=$d timeout 60 ./.carry/cuda_act --test-threads=1 --nocapture > $OUT/cuda_act-$d.log 2>&1
  echo "cuda_act $d rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/cuda_act-$d.log | tail -2
done
pack
JET_NVRTC_DEFINES=$best timeout 100 ./.carry/gpu_parity --test-threads=1 > $OUT/gpu_parity-$best.log 2>&1
echo "gpu_parity $best rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/gpu_parity-$best.log | tail -2; pack
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk q0-fp8 "" fp8; mk qb-fp8 "JET_NVRTC_DEFINES=$best" fp8; mk main-bf16 "" bf16; mk tma-bf16 "JET_NVRTC_DEFINES=ROWS_BF16_TMA=1" bf16
JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3" timeout $((300 - SECONDS)) bash bench/gpu_check.sh compare qwen3-0.6b 2 main-bf16,tma-bf16,q0-fp8,qb-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "\\| train \\||step training|rollout" $OUT/compare.txt | cut -c1-260
[ $SECONDS -lt 280 ] && timeout $((350 - SECONDS)) ./.carry/cuda_parity --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/cuda_parity.log | tail -2
grep -E -A2 'gemm_algorithm_chosen_by_timing_is_kept' $OUT/cuda_parity.log | cut -c1-200; pack
