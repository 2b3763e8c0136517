#!/bin/bash
# Fifty-sixth session, call 2: the defaults to land (split-K only under a quarter of
# the SMs, training's fused residual norm, held WGrad outputs sized by memory).
# Checks (gpu_parity, cuda_invariant, cuda_act), then main's behaviour (all three
# switched off in one binary: JET_TRAIN_FUSED_NORM=0 JET_SPLITK_DIV=1 JET_GRAD_HOLD=1)
# against the defaults: GRPO-shaped steps at 0.6B and 8B-4l (batch 64, gen 16),
# two reps; then 0.6B at gen 128 (2,048-row micro-batches), one rep.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
for f in bf16 fp8; do
  mk old-$f "JET_TRAIN_FUSED_NORM=0 JET_SPLITK_DIV=1 JET_GRAD_HOLD=1" $f; mk new-$f "" $f
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 150 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/gpu_parity.log | tail -1 | cut -c1-60)"
for t in cuda_invariant cuda_act; do
  timeout 60 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-60)"
done
grep -hE "FAILED|panicked" $OUT/*.log | head; pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 2 old-bf16,new-bf16,old-fp8,new-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; cp $OUT/compare.txt $OUT/compare-gen16.txt; pack
if [ $SECONDS -lt 330 ]; then
  mv $OUT/cmp $OUT/cmp-gen16
  export JET_BENCH_ARGS="--batch 64 --train-steps 3"
  timeout 100 bash bench/gpu_check.sh compare qwen3-0.6b 1 old-bf16,new-bf16,old-fp8,new-fp8 > $OUT/cmp128.log 2>&1
  echo "compare gen 128 rc $? (${SECONDS}s)"; cp $OUT/compare.txt $OUT/compare-gen128.txt; pack
fi
echo "== gen 16"; grep -E "step training|step whole|peak|train \|" $OUT/compare-gen16.txt | cut -c1-260
echo "== gen 128"; grep -E "step training|step whole|train \|" $OUT/compare-gen128.txt 2>/dev/null | cut -c1-260
