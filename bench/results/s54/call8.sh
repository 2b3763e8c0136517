#!/bin/bash
# Fifty-fourth session, call 8: the final build (qk_warps_part shared by the q/k norm backward and
# qk_terms_part: code motion), cuda_parity and gpu_parity in full.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_parity gpu_parity; do
  timeout 150 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-60)"; grep -E "panicked|FAILED|failed" $OUT/$t.log | head -5 | cut -c1-200
done
grep -hE "one launch == one each.*4096 tokens x 8|one pass == two" $OUT/cuda_parity.log | cut -c1-150 | head -6
grep -hE "^PARITY.*rollout vs training" $OUT/gpu_parity.log | cut -c1-110; pack
