#!/bin/bash
# Prepared in the sixtieth session, not run (no machine came): the headline on
# main, after next-call.sh (run with timeout_s ~560; cuda_parity and gpu_parity
# again only if next-call.sh did not run them).
# 1. cuda_parity in full (call 1's 40 s limit cut it during the first NVRTC
#    compiles, before the GEMM tuning test ran).
# 2. gpu_parity on main's kernels (call 1 ran it with the direct stores).
# 3. The headline: jetd bench at 0.6B and 8B-4l, the torch.compile and SDPA peers.
R=$OUT; export OUT=/tmp/g2; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g2; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 150 ./.carry/cuda_parity --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/cuda_parity.log | tail -3
grep -E -A3 'gemm_algorithm_chosen_by_timing_is_kept' $OUT/cuda_parity.log | cut -c1-200; pack
timeout 100 ./.carry/gpu_parity --test-threads=1 > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/gpu_parity.log | tail -3; pack
timeout 150 ./.carry/jetd bench --device cuda --preset qwen3-0.6b --json > $OUT/bench-qwen3-0.6b.json 2> $OUT/bench-qwen3-0.6b.err
echo "bench 0.6B rc $? (${SECONDS}s)"; pack
timeout 220 python3 bench/peer_torch.py --peer compile --no-rollout --preset qwen3-0.6b --json > $OUT/peer-compile-qwen3-0.6b.txt 2> $OUT/peer-compile-qwen3-0.6b.err
echo "peer compile rc $? (${SECONDS}s)"; pack
[ $SECONDS -lt 420 ] && timeout $((560 - SECONDS)) ./.carry/jetd bench --device cuda --preset qwen3-8b --layers 4 --json > $OUT/bench-qwen3-8b-4l.json 2> $OUT/bench-qwen3-8b-4l.err
echo "bench 8B-4l rc $? (${SECONDS}s)"; pack
[ $SECONDS -lt 480 ] && timeout $((590 - SECONDS)) python3 bench/peer_torch.py --peer sdpa --no-rollout --preset qwen3-0.6b --json > $OUT/peer-sdpa-qwen3-0.6b.txt 2> $OUT/peer-sdpa-qwen3-0.6b.err
echo "peer sdpa rc $? (${SECONDS}s)"; pack
python3 bench/results/s60/headline.py $OUT
