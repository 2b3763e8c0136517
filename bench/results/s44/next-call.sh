#!/bin/bash
# Prepared for the session after the forty-fourth (not run): the FP8 rows kernel's
# tokens-as-A forms, one binary, switched with JET_NVRTC_DEFINES=ROWS_FP8_TOK_A=
# (0 = main's weights as A, the default; 1 = tokens as A; 2 = tokens as A with the
# consumers making the scale products). Build here, then in .carry: jetd, the test
# binaries (bash bench/gpu_check.sh --collect), cuda_timing, and two wrappers:
#   printf '#!/bin/bash\nJET_NVRTC_DEFINES=ROWS_FP8_TOK_A=1 exec "$(dirname "$0")/jetd" "$@"\n' > .carry/jetd-tma1
#   (and jetd-tma2 with =2; chmod +x). Carry .carryz/c.tar.xz (tar cf - -C .carry . | xz).
# First the checks forms 1 and 2 have not had (the BF16-output epilogue, the whole
# step against the CPU), then the step, then the kernels alone.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for v in 1 2; do
  export JET_NVRTC_DEFINES="ROWS_FP8_TOK_A=$v"
  timeout 60 ./.carry/cuda_act --test-threads=1 --nocapture > $OUT/act-$v.log 2>&1
  echo "cuda_act tma$v rc $?"; grep -E "test result|panicked" $OUT/act-$v.log | tail -2 | cut -c1-200
  timeout 60 ./.carry/cuda_invariant --test-threads=1 --nocapture > $OUT/inv-$v.log 2>&1
  echo "cuda_invariant tma$v rc $?"; grep -E "test result|panicked" $OUT/inv-$v.log | tail -2 | cut -c1-200
  timeout 90 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gp-$v.log 2>&1
  echo "gpu_parity tma$v rc $?"; grep -E "test result|panicked" $OUT/gp-$v.log | tail -2 | cut -c1-200
  pack
done
unset JET_NVRTC_DEFINES
timeout 90 ./.carry/cuda_parity --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity (default) rc $?"; grep -E "test result|panicked" $OUT/cuda_parity.log | tail -2 | cut -c1-200
pack
export JET_BENCH_ARGS="--flow fp8 --batch 64 --gen-len 16 --train-steps 3"
for s in qwen3-0.6b qwen3-8b:4; do
  t=${s//[-.:]/_}
  timeout 260 bash bench/gpu_check.sh compare $s 2 jetd,jetd-tma1,jetd-tma2 > $OUT/main-$t.log 2>&1
  mkdir -p $OUT/cmp-$t; mv $OUT/cmp/* $OUT/cmp-$t/; pack
  python3 bench/compare_builds.py $OUT/cmp-$t jetd jetd_tma1 jetd_tma2 | grep -E 'train' | cut -c1-200
done
