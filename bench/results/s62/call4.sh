#!/bin/bash
# Prepared in the sixty-second session, not run. After call3.sh, if its checks
# passed: where the 0.6B step's device time goes with ROWS_HW_PACK=1 and
# SWIGLU_HW_BF16=1, kernel by kernel (ncu, each kernel alone, one training
# update), fp8 then bf16, to set against the sixty-first session's call 3
# (bench/results/s61/call3-h100/ncu-step-*.txt: wg_fp8_rows_tma 8.463 ms,
# swiglu_bwd_fp8_dh16_gu16 1.893, wg_bf16_rows_tma 11.676). Then the stall
# sampling of the FP8 rows kernel at q's shape with the define, as call2.sh took
# it without. Run with timeout_s ~200; .carry: jetd, cuda_timing.
R=$OUT; export OUT=/tmp/g4; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g4; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
export JET_NVRTC_DEFINES="ROWS_HW_PACK=1 SWIGLU_HW_BF16=1"
for f in fp8 bf16; do
  LOG=$OUT timeout 70 bash bench/gpu_check.sh ncustep $f qwen3-0.6b > $OUT/ncustep-$f.log 2>&1
  echo "ncustep $f rc $? (${SECONDS}s)"; head -12 $OUT/ncustep-$f.log; grep "rows kernel, us" $OUT/ncustep-$f.log; pack
done
JET_TIMING_ONLY=q_proj timeout 60 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/warm.log 2>&1
name=ncu-stalls-fp8-bf16out-q-hwpack
JET_TIMING_ONLY=q_proj timeout 90 ncu --clock-control none --set full --import-source no -k "regex:^wg_fp8_rows_tma\$" \
  --launch-skip 16 --launch-count 1 -o $OUT/$name -f ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/$name.log 2>&1
echo "$name rc $? (${SECONDS}s)"
ncu -i $OUT/$name.ncu-rep --page raw --csv > $OUT/$name-raw.csv 2>>$OUT/$name.log
ncu -i $OUT/$name.ncu-rep --page source --print-source sass --csv > $OUT/$name-src.csv 2>>$OUT/$name.log
rm -f $OUT/$name.ncu-rep; gzip -9 $OUT/$name-src.csv
python3 bench/ncu_stalls.py $OUT/$name-raw.csv <(zcat $OUT/$name-src.csv.gz) --top 15 > $OUT/$name.txt 2>&1
head -30 $OUT/$name.txt | cut -c1-150; pack
