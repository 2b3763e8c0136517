#!/bin/bash
# Session 43, call 7: the review's refactor of the norm backward's launches (one
# argument list for rmsnorm_bwd_dx, _dx128 and _rows, behaviour unchanged):
# cuda_parity and gpu_parity.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_parity gpu_parity; do
  timeout 120 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $?"; grep -E "test result|panicked" $OUT/$t.log | head -3
  pack
done
