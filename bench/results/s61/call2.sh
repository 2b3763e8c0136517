#!/bin/bash
# The sixty-first session's call 2, right after call 1 on the warm machine (run
# with timeout_s ~560): the headline, with the BF16-output form call 1 found
# fastest (FORM=NAME=V, a JET_NVRTC_DEFINES entry; empty: main's).
# jetd bench at 0.6B and 8B-4l (all flows), the torch.compile and SDPA peers.
R=$OUT; export OUT=/tmp/g2; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g2; }
gunzip -f .carry/*.gz 2>/dev/null
[ -n "$FORM" ] && export JET_NVRTC_DEFINES=$FORM
echo "form: ${FORM:-main}" | tee $OUT/form.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 150 ./.carry/jetd bench --device cuda --preset qwen3-0.6b --json > $OUT/bench-qwen3-0.6b.json 2> $OUT/bench-qwen3-0.6b.err
echo "bench 0.6B rc $? (${SECONDS}s)"; pack
timeout 220 python3 bench/peer_torch.py --peer compile --no-rollout --preset qwen3-0.6b --json > $OUT/peer-compile-qwen3-0.6b.txt 2> $OUT/peer-compile-qwen3-0.6b.err
echo "peer compile rc $? (${SECONDS}s)"; pack
[ $SECONDS -lt 420 ] && timeout $((540 - SECONDS)) ./.carry/jetd bench --device cuda --preset qwen3-8b --layers 4 --json > $OUT/bench-qwen3-8b-4l.json 2> $OUT/bench-qwen3-8b-4l.err
echo "bench 8B-4l rc $? (${SECONDS}s)"; pack
[ $SECONDS -lt 480 ] && timeout $((570 - SECONDS)) python3 bench/peer_torch.py --peer sdpa --no-rollout --preset qwen3-0.6b --json > $OUT/peer-sdpa-qwen3-0.6b.txt 2> $OUT/peer-sdpa-qwen3-0.6b.err
echo "peer sdpa rc $? (${SECONDS}s)"; pack
python3 bench/results/s60/headline.py $OUT
