#!/bin/bash
# The sixty-second session's call 2 (main at 413325b: the rows kernels' two
# epilogue stages a warp by default). Run with timeout_s ~480; .carry: jetd,
# cuda_timing (stripped, gzipped).
# 1. Where the rows kernels' warps wait at 0.6B's q shape (4,096 x 1,024 x 2,048):
#    ncu --set full on one launch of each (FP8 with BF16 out, as the step runs it;
#    BF16 with f32 out, fp8_rows_timing's form), stall reasons and hottest SASS lines
#    (bench/ncu_stalls.py). For the next session: what holds the FP8 kernel at ~45%
#    of the tensor peak at K = 1,024 while cuBLASLt's backward GEMMs reach 1.1-1.2
#    PFLOP/s in the same step.
# 2. The headline on main: jetd bench at 0.6B and 8B-4l (all flows, rollout too),
#    the torch.compile and SDPA peers (bench/results/s60/headline.py).
R=$OUT; export OUT=/tmp/g2; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g2; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
JET_TIMING_ONLY=q_proj timeout 60 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/warm.log 2>&1
for spec in "wg_fp8_rows_tma 16 fp8-bf16out" "wg_bf16_rows_tma 5 bf16-f32out"; do
  set -- $spec; name=ncu-stalls-$3-q
  JET_TIMING_ONLY=q_proj timeout 120 ncu --clock-control none --set full --import-source no -k "regex:^$1\$" --launch-skip $2 \
    --launch-count 1 -o $OUT/$name -f ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/$name.log 2>&1
  echo "$name rc $? (${SECONDS}s)"
  ncu -i $OUT/$name.ncu-rep --page raw --csv > $OUT/$name-raw.csv 2>>$OUT/$name.log
  ncu -i $OUT/$name.ncu-rep --page source --print-source sass --csv > $OUT/$name-src.csv 2>>$OUT/$name.log
  python3 bench/ncu_stalls.py $OUT/$name-raw.csv $OUT/$name-src.csv --top 25 > $OUT/$name.txt 2>&1
  head -45 $OUT/$name.txt | cut -c1-160
done
pack
timeout 150 ./.carry/jetd bench --device cuda --preset qwen3-0.6b --json > $OUT/bench-qwen3-0.6b.json 2> $OUT/bench-qwen3-0.6b.err
echo "bench 0.6B rc $? (${SECONDS}s)"; pack
timeout 220 python3 bench/peer_torch.py --peer compile --no-rollout --preset qwen3-0.6b --json > $OUT/peer-compile-qwen3-0.6b.txt 2> $OUT/peer-compile-qwen3-0.6b.err
echo "peer compile rc $? (${SECONDS}s)"; pack
[ $SECONDS -lt 380 ] && timeout $((470 - SECONDS)) ./.carry/jetd bench --device cuda --preset qwen3-8b --layers 4 --json > $OUT/bench-qwen3-8b-4l.json 2> $OUT/bench-qwen3-8b-4l.err
echo "bench 8B-4l rc $? (${SECONDS}s)"; pack
[ $SECONDS -lt 420 ] && timeout $((475 - SECONDS)) python3 bench/peer_torch.py --peer sdpa --no-rollout --preset qwen3-0.6b --json > $OUT/peer-sdpa-qwen3-0.6b.txt 2> $OUT/peer-sdpa-qwen3-0.6b.err
echo "peer sdpa rc $? (${SECONDS}s)"; pack
python3 bench/results/s60/headline.py $OUT
