#!/bin/bash
# Fifty-seventh session, call 1 (branch s57): the tied embedding's scatter settles
# the LM head's held WGrad outputs in the rows it writes alone; the bench's
# GRPO-shaped step cuts its micro-batches as a run does by default (64 sequences,
# micro_batch_tokens = "auto"); the q/k norm backward loads its rows' positions
# first. Two builds (jetd-a: before the q/k change; jetd: all), by wrappers:
#   old = jetd-a, JET_SCATTER_SETTLE=0, the step's old micro-batches (8 sequences,
#         no token bound): main's behaviour;
#   sc  = jetd-a, the scatter settling its rows, old micro-batches;
#   qk  = jetd, old micro-batches (sc + the q/k backward's loads);
#   new = jetd, the defaults.
# 1. Checks: cuda_parity (the scatter test, the masked and held gradients),
#    gpu_parity (the held test now also compares the scatter's settle).
# 2. compare, 0.6B, batch 64, gen 16, 2 reps; then 0.6B gen 128 and 8B-4l gen 16, 1 rep.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/%s" "$@" --flow %s\n' "$2" "$4" "$3" > .carry/$1; chmod +x .carry/$1; }
OLDM="--step-micro-seqs 8 --step-micro-tokens 0"
for f in bf16 fp8; do
  mk old-$f "JET_SCATTER_SETTLE=0" "$f $OLDM" jetd-a; mk sc-$f "" "$f $OLDM" jetd-a
  mk qk-$f "" "$f $OLDM" jetd; mk new-$f "" $f jetd
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 90 ./.carry/cuda_parity 'scatter_settles|masked_gradient|held_bf16|embedding|qk_norm_rope|kernel_sources' --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_parity.log | tail -1 | cut -c1-60)"
timeout 220 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/gpu_parity.log | tail -1 | cut -c1-60)"
grep -hE "scatter|held|FAILED|panicked" $OUT/cuda_parity.log $OUT/gpu_parity.log | cut -c1-160 | head -20; pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b 2 old-bf16,sc-bf16,qk-bf16,new-bf16,old-fp8,sc-fp8,qk-fp8,new-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; cp $OUT/compare.txt $OUT/compare-06b-gen16.txt; mv $OUT/cmp $OUT/cmp-06b-gen16; pack
if [ $SECONDS -lt 400 ]; then
  export JET_BENCH_ARGS="--batch 64 --train-steps 2"
  timeout 120 bash bench/gpu_check.sh compare qwen3-0.6b 1 old-bf16,new-bf16,old-fp8,new-fp8 > $OUT/cmp128.log 2>&1
  echo "compare gen 128 rc $? (${SECONDS}s)"; cp $OUT/compare.txt $OUT/compare-06b-gen128.txt; mv $OUT/cmp $OUT/cmp-06b-gen128; pack
fi
if [ $SECONDS -lt 480 ]; then
  export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 2"
  timeout 100 bash bench/gpu_check.sh compare qwen3-8b:4 1 old-bf16,new-bf16,old-fp8,new-fp8 > $OUT/cmp8b.log 2>&1
  echo "compare 8B-4l rc $? (${SECONDS}s)"; cp $OUT/compare.txt $OUT/compare-8b4l-gen16.txt; mv $OUT/cmp $OUT/cmp-8b4l-gen16; pack
fi
for f in $OUT/compare-*.txt; do echo "== $(basename $f)"; grep -E "step training|step whole|train \|" $f | cut -c1-260; done
