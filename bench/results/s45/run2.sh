#!/bin/bash
# Forty-fifth session, call 2: the FP8 rows kernel with form 2 (tokens as A, each
# consumer making its scale products) as the only form; the checks again on it, then
# where the 8B-4l fp8 step's FP8-only elementwise kernels spend their time (ncu --set
# full, one launch each from the step), then the step itself.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_invariant cuda_act cuda_parity gpu_parity; do
  timeout 100 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $?"; grep -E "test result|panicked" $OUT/$t.log | tail -2 | cut -c1-200
done
pack
A=(bench --device cuda --json --no-kernels --no-cublaslt --flow fp8 --preset qwen3-8b --layers 4 --batch 64 --gen-len 16 --train-steps 1)
timeout 90 ./.carry/jetd "${A[@]}" > $OUT/warm.json 2> $OUT/warm.err; echo "warm rc $?"
for k in token_logprobs_bwd_fp8_z16 swiglu_bwd_fp8_dh16_gu16 quant_dual_multi; do
  n=ncu-$k
  timeout 120 ncu --set full --import-source no -k "regex:^$k\$" --launch-count 1 -o $OUT/$n -f ./.carry/jetd "${A[@]}" > $OUT/$n.log 2>&1
  echo "$n rc $?"
  ncu -i $OUT/$n.ncu-rep --page raw --csv > $OUT/$n-raw.csv 2>>$OUT/$n.log
  ncu -i $OUT/$n.ncu-rep --page source --print-source sass --csv > $OUT/$n-src.csv 2>>$OUT/$n.log
  python3 bench/ncu_stalls.py $OUT/$n-raw.csv $OUT/$n-src.csv --top 25 > $OUT/$n.txt 2>&1
  head -30 $OUT/$n.txt | cut -c1-160
  pack
done
export JET_BENCH_ARGS="--flow fp8 --batch 64 --gen-len 16 --train-steps 3"
timeout 100 bash bench/gpu_check.sh compare qwen3-8b:4 1 jetd > $OUT/fp8-8b4.log 2>&1
mkdir -p $OUT/cmp-fp8; mv $OUT/cmp/* $OUT/cmp-fp8/; pack
python3 bench/compare_builds.py $OUT/cmp-fp8 jetd | grep -E 'train' | cut -c1-200
