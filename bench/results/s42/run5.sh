#!/bin/bash
# Session 42, calls 5 and 6 (call 5 failed: NVRTC 13.0 on the device rejects a device lambda that 13.5 here took; call 6 with a struct instead): the rows kernel running each tile's epilogue under the next
# tile's first group of MMAs (this build) against the previous kernel (jetd-prev,
# cuda_timing-prev): bits (cuda_invariant, gpu_parity), the rows GEMMs alone in
# their step forms and plain, the 0.6B training step in all three flows.
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
for b in cuda_timing-prev cuda_timing; do
  timeout 60 ./.carry/$b fp8_rows_timing --ignored --nocapture > $OUT/rows-$b.log 2>&1
  echo "rows $b rc $?"; grep TIMING $OUT/rows-$b.log | grep " 4096x" | sed 's/split-K.*//; s/TIMING //' | cut -c1-110
done
pack
JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 4" timeout 300 bash bench/gpu_check.sh compare qwen3-0.6b 2 jetd-prev,jetd > $OUT/main.log 2>&1
pack
python3 bench/compare_builds.py $OUT/cmp jetd_prev jetd | grep -E 'train' | cut -c1-200
timeout 120 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $?"; grep -E "test result|panicked" $OUT/gpu_parity.log | cut -c1-200 | tail -4
pack
