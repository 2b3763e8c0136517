#!/bin/bash
# The sixty-first session's call 4: the 8B-4l step with the rows kernels' BF16
# outputs stored by the warps (main before 337b31f) and through the copy engine
# (ROWS_BF16_TMA=1 of 8d26d01's build, the same SASS as 337b31f's default), both
# flows, 2 reps. Run with timeout_s ~170 on 8d26d01's .carry.
R=$OUT; export OUT=/tmp/g4; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk st-bf16 "" bf16; mk tma-bf16 "JET_NVRTC_DEFINES=ROWS_BF16_TMA=1" bf16; mk st-fp8 "" fp8; mk tma-fp8 "JET_NVRTC_DEFINES=ROWS_BF16_TMA=1" fp8
JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3" timeout 150 bash bench/gpu_check.sh compare qwen3-8b:4 2 st-bf16,tma-bf16,st-fp8,tma-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"
[ -s $OUT/compare.txt ] || python3 bench/compare_builds.py $OUT/cmp st_bf16 tma_bf16 st_fp8 tma_fp8 > $OUT/compare.txt 2>&1
tar czf $R/logs.tgz -C /tmp g4
grep -E "\\| train \\|" $OUT/compare.txt | cut -c1-300
