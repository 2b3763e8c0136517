#!/bin/bash
# Fifty-fifth session, call 6 (prepared, NOT RUN: no machine could be started with
# the device time left). On main: git apply bench/results/s55/train-fused-norm-not-run.diff,
# build jetd and gpu_parity into .carry/ (gzip -9), then run this. The o and down projections'
# split-K epilogue + residual + next norm in one launch in training passes too
# (a GRPO micro-batch's 256 rows). gpu_parity, then JET_TRAIN_FUSED_NORM=0 against
# the default at 0.6B, two reps, both flows.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk f0-bf16 "JET_TRAIN_FUSED_NORM=0" bf16; mk f1-bf16 "" bf16; mk f0-fp8 "JET_TRAIN_FUSED_NORM=0" fp8; mk f1-fp8 "" fp8
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 110 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/gpu_parity.log | tail -1 | cut -c1-60)"
grep -hE "(bf16|fp8): (gradients|loss|response)|FAILED|panicked" $OUT/gpu_parity.log | cut -c1-110 | head -10; pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 100 bash bench/gpu_check.sh compare qwen3-0.6b 2 f0-bf16,f1-bf16,f0-fp8,f1-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-230
