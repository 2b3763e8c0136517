#!/bin/bash
# The fifty-ninth session's call 5: the cuBLASLt tuning's A/B at 8B-4l and 0.6B on an
# H100 (call 4's 8B-4l fp8/bf16 read 1.300x against the fifty-eighth session's 1.319x).
# jetd as call 3's, with ROWS_RES_PREFETCH=0 (main's rows kernel); JET_GEMM_TUNE=0 the
# heuristic's first pick. A fresh kernel store, so the tuned runs time their picks.
R=$OUT; export OUT=/tmp/g5; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk5
pack() { tar czf $R/logs.tgz -C /tmp g5; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk t0-bf16 "JET_GEMM_TUNE=0 JET_NVRTC_DEFINES=ROWS_RES_PREFETCH=0" bf16; mk t0-fp8 "JET_GEMM_TUNE=0 JET_NVRTC_DEFINES=ROWS_RES_PREFETCH=0" fp8
mk t1-bf16 "JET_NVRTC_DEFINES=ROWS_RES_PREFETCH=0" bf16; mk t1-fp8 "JET_NVRTC_DEFINES=ROWS_RES_PREFETCH=0" fp8
JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 5" timeout 400 bash bench/gpu_check.sh compare qwen3-8b:4,qwen3-0.6b 3 t0-bf16,t0-fp8,t1-bf16,t1-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "\\| train \\||step training" $OUT/compare.txt | cut -c1-300
