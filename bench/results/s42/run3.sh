#!/bin/bash
# Session 42, call 3: why call 2's clustered rows kernel ran at half speed: the
# clusters of two the device holds (JET_ROWS_DEBUG prints them; the grid now sizes
# itself by cuOccupancyMaxActiveClusters) and the remote arrivals' scope (.cta, the
# default now, against ROWS_ARRIVE_CLUSTER=1's .release.cluster); rows GEMMs alone.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for v in "c1:1:" "c2:2:" "c2rel:2:ROWS_ARRIVE_CLUSTER=1"; do
  IFS=: read -r tag c d <<<"$v"
  JET_ROWS_DEBUG=1 JET_ROWS_CLUSTER=$c JET_NVRTC_DEFINES="$d" timeout 90 ./.carry/cuda_timing fp8_rows_timing --ignored --nocapture > $OUT/timing-$tag.log 2>&1
  echo "timing $tag rc $?"; grep "rows kernel" $OUT/timing-$tag.log | sort | uniq -c | head -4
  grep "TIMING" $OUT/timing-$tag.log | grep " 4096x" | sed 's/split-K.*//' | cut -c1-120
done
pack
