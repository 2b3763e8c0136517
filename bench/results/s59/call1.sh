#!/bin/bash
# The fifty-ninth session's call 1: the fifty-eighth session's next-call-ts.sh as prepared. Binaries built from
# branch s58-rows-ts (0608301): jetd, cuda_invariant, cuda_act, cuda_timing, gpu_parity, into
# .carry/ gzipped (call4.sh's set). The FP8 rows kernel's TS epilogue, second form (the tile's
# outputs staged in shared memory, stored by the producer warpgroup's spare warps; on by default,
# JET_ROWS_TS=0 the old epilogue). Bits: cuda_invariant, cuda_act, gpu_parity.
# Speed: cuda_timing fp8_rows_timing without / with it, then the 0.6B step (8 x 512
# training rows, GRPO-shaped step at gen 16) in fp8 without / with it, bf16 beside.
R=$OUT; export OUT=/tmp/g5; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g5; }
gunzip -f .carry/*.gz
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 100 ./.carry/cuda_invariant --test-threads=1 > $OUT/cuda_invariant.log 2>&1
echo "cuda_invariant rc $? (${SECONDS}s)"; grep -E '^test |test result' $OUT/cuda_invariant.log | tail -8
timeout 60 ./.carry/cuda_act --test-threads=1 > $OUT/cuda_act.log 2>&1
echo "cuda_act rc $? (${SECONDS}s)"; grep -E 'test result|FAIL|panicked' $OUT/cuda_act.log | tail -4
pack
for ts in 0 1 0 1; do
  JET_ROWS_TS=$ts timeout 60 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/timing-ts$ts-$SECONDS.log 2>&1
  echo "timing ts=$ts rc $? (${SECONDS}s)"
done
python3 bench/rows_timing_table.py --wins ts0 ts1 fp8:q_proj,fp8:gate/up $OUT/timing-*.log | grep -v '^bf16'
win=${PIPESTATUS[0]}
pack
if [ "$win" != 0 ]; then echo "TS not faster at q and gate/up: stop"; exit 0; fi
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk main-fp8 "JET_ROWS_TS=0" fp8; mk ts-fp8 "" fp8; mk main-bf16 "" bf16
JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3" timeout $((470 - SECONDS)) bash bench/gpu_check.sh compare qwen3-0.6b 2 main-bf16,main-fp8,ts-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "\\| train \\||step training|step whole|rollout \\| fp8" $OUT/compare.txt | cut -c1-330
timeout $((590 - SECONDS)) ./.carry/gpu_parity --test-threads=1 > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/gpu_parity.log | tail -4
pack
