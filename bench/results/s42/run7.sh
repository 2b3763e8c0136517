#!/bin/bash
# Session 42, call 7: the rows kernel's BF16 outputs staged by stmatrix .trans (four instructions a pass for 32 2-byte shared stores), a swizzled [token][16 rows]
# tile, against the previous kernel (jetd-prev, cuda_timing-prev): bits
# (cuda_invariant, gpu_parity), the rows GEMMs in their step forms, the 0.6B
# training step in all three flows.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 100 ./.carry/cuda_invariant --test-threads=1 --nocapture > $OUT/inv.log 2>&1
echo "invariant rc $?"; grep -E "test result|panicked" $OUT/inv.log | tail -3
pack
for b in cuda_timing-prev cuda_timing; do
  timeout 60 ./.carry/$b bf16_rows_step_forms --ignored --nocapture > $OUT/forms-$b.log 2>&1
  echo "forms $b rc $?"; grep TIMING $OUT/forms-$b.log | sed 's/TIMING bf16 step forms 4096x//' | cut -c1-200
done
pack
JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 4" timeout 300 bash bench/gpu_check.sh compare qwen3-0.6b 2 jetd-prev,jetd > $OUT/main.log 2>&1
pack
python3 bench/compare_builds.py $OUT/cmp jetd_prev jetd | grep -E 'train' | cut -c1-200
timeout 120 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E "test result|panicked" $OUT/gpu_parity.log | cut -c1-200 | tail -4
pack
