#!/bin/bash
# Session 44, call 2 (run3.sh / run4.sh never ran: no machine, and the device time
# left is ~2 minutes): the landed form's checks only, most important first:
# cuda_invariant (rollout == training bits), gpu_parity, cuda_parity.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 45 ./.carry/cuda_invariant --test-threads=1 --nocapture > $OUT/cuda_invariant.log 2>&1
echo "invariant rc $?"; grep -E "test result|panicked" $OUT/cuda_invariant.log | tail -3 | cut -c1-200
pack
timeout 45 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E "test result|panicked" $OUT/gpu_parity.log | cut -c1-200 | tail -4
pack
timeout 40 ./.carry/cuda_parity --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity rc $?"; grep -E "test result|panicked|FAILED|failed" $OUT/cuda_parity.log | head -8 | cut -c1-200
pack
