#!/bin/bash
# Session 44, call 2: the fp8 training step (0.6B, and Qwen3-8B shapes with 4
# layers) with the rows kernel's tokens as A (jetd: ROWS_TOK_M=1; jetd-tm2: =2, the
# token scales' products made by the consumers) against the weights as A
# (jetd-tm0), one binary; gpu_parity (the build's default, tokens as A for both
# element types; also the q/k norm launch without its unused rows / hd).
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for s in qwen3-0.6b qwen3-8b:4; do
  t=${s//[-.:]/_}
  export JET_BENCH_ARGS="--flow fp8 --batch 64 --gen-len 16 --train-steps 3"; to=180; [ $t = qwen3_8b_4 ] && to=280
  timeout $to bash bench/gpu_check.sh compare $s 2 jetd-tm0,jetd,jetd-tm2 > $OUT/main-$t.log 2>&1
  mkdir -p $OUT/cmp-$t; mv $OUT/cmp/* $OUT/cmp-$t/
  pack
  python3 bench/compare_builds.py $OUT/cmp-$t jetd_tm0 jetd jetd_tm2 | grep -E 'train' | cut -c1-200
done
timeout 110 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E "test result|panicked" $OUT/gpu_parity.log | cut -c1-200 | tail -4
pack
