#!/bin/bash
# The fifty-ninth session's call 2: cuBLASLt algorithms chosen by timing (gemm_tune.rs,
# JET_GEMM_TUNE=0 the heuristic's first pick as before). Binaries from main plus the
# tuning change: jetd, cuda_timing, cuda_parity, gpu_parity in .carry/ gzipped.
# 1. backward_gemm_timing without and with tuning (the backward's cuBLASLt GEMMs at
#    0.6B shapes; TUNED lines: each problem's first pick against the chosen one).
# 2. The 0.6B and 8B-4l steps, bf16 and fp8, without and with tuning, interleaved.
# 3. cuda_parity and gpu_parity with tuning on.
R=$OUT; export OUT=/tmp/g5; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g5; }
gunzip -f .carry/*.gz
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for t in 0 1; do
  JET_GEMM_TUNE=$t timeout 90 ./.carry/cuda_timing --ignored --exact backward_gemm_timing --nocapture > $OUT/bwd-tune$t.log 2>&1
  echo "backward_gemm_timing tune=$t rc $? (${SECONDS}s)"
done
grep -h "rows, a 0.6B layer" $OUT/bwd-tune*.log | cut -c1-220
grep -h "lm_head" $OUT/bwd-tune*.log | cut -c30-200
grep -h TUNED $OUT/bwd-tune1.log | awk '{print $(NF)}' | sort -n | tail -8 | tr '\n' ' '; echo
pack
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk t0-bf16 "JET_GEMM_TUNE=0" bf16; mk t0-fp8 "JET_GEMM_TUNE=0" fp8; mk t1-bf16 "" bf16; mk t1-fp8 "" fp8
JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3" timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 2 t0-bf16,t0-fp8,t1-bf16,t1-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "\\| train \\||step training|step whole" $OUT/compare.txt | cut -c1-300
timeout 120 ./.carry/cuda_parity --test-threads=1 > $OUT/cuda_parity.log 2>&1
echo "cuda_parity rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/cuda_parity.log | tail -4
timeout $((590 - SECONDS)) ./.carry/gpu_parity --test-threads=1 > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/gpu_parity.log | tail -4
pack
