#!/bin/bash
# The sixty-third session's call 2, run right after call 1 (s62/call3.sh) on the
# same machine if its checks passed and the defines won: the headline with
# ROWS_HW_PACK=1 SWIGLU_HW_BF16=1 (the build that making them the default gives:
# the same sources, the same SASS): jetd bench at 0.6B (rollout too: on an H200
# this re-measures #12's batch-64 decode share) and 8B-4l, the torch.compile peer,
# then ncu's per-kernel step (fp8) if time is left. Run with timeout_s ~560;
# .carry: jetd, cuda_timing (stripped, gzipped).
R=$OUT; export OUT=/tmp/g2; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g2; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
export JET_NVRTC_DEFINES="${DEFS-ROWS_HW_PACK=1 SWIGLU_HW_BF16=1}"
timeout 150 ./.carry/jetd bench --device cuda --preset qwen3-0.6b --json > $OUT/bench-qwen3-0.6b.json 2> $OUT/bench-qwen3-0.6b.err
echo "bench 0.6B rc $? (${SECONDS}s)"; pack
timeout 220 python3 bench/peer_torch.py --peer compile --no-rollout --preset qwen3-0.6b --json > $OUT/peer-compile-qwen3-0.6b.txt 2> $OUT/peer-compile-qwen3-0.6b.err
echo "peer compile rc $? (${SECONDS}s)"; pack
[ $SECONDS -lt 380 ] && timeout $((470 - SECONDS)) ./.carry/jetd bench --device cuda --preset qwen3-8b --layers 4 --json > $OUT/bench-qwen3-8b-4l.json 2> $OUT/bench-qwen3-8b-4l.err
echo "bench 8B-4l rc $? (${SECONDS}s)"; pack
python3 bench/results/s60/headline.py $OUT
python3 bench/results/s60/rollout_share.py $OUT/bench-*.json
[ $SECONDS -lt 470 ] && LOG=$OUT timeout $((550 - SECONDS)) bash bench/gpu_check.sh ncustep fp8 qwen3-0.6b > $OUT/ncustep-fp8.log 2>&1
echo "ncustep fp8 rc $? (${SECONDS}s)"; head -14 $OUT/ncustep-fp8.log; grep "rows kernel, us" $OUT/ncustep-fp8.log; pack
