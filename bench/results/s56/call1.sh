#!/bin/bash
# Fifty-sixth session, call 1 (branch s55-fused-norm + the split-K rule's divisor +
# gradients holding several WGrad outputs). One jetd, switched by wrappers.
# 1. Checks: cuda_parity's held-gradient test (five addends held 3 / 8 at a time),
#    cuda_stacked, gpu_parity (training's linear_residual_norm; held WGrad outputs).
# 2. cuda_timing split_k_rule_timing: split-K against the rows kernel at every token
#    count where today's rule (tiles < SMs) picks split-K.
# 3. The GRPO-shaped step (0.6B, batch 64, gen 16: 8 micro-batches of 1,152 rows),
#    two reps: base = main (fused norm off), fn = fused norm, d2 = fused norm with
#    JET_SPLITK_DIV=2 (all three JET_GRAD_HOLD=1; dinf, never split-K past 64 rows,
#    only made), ha = d2 with the held WGrad outputs as memory leaves room (8 here).
# 4. ncu --set full of one qk_norm_rope_bwd_x16_o3 launch (0.6B 8 x 512 bf16 step).
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
for f in bf16 fp8; do
  mk base-$f "JET_TRAIN_FUSED_NORM=0 JET_GRAD_HOLD=1" $f; mk fn-$f "JET_GRAD_HOLD=1" $f
  mk d2-$f "JET_SPLITK_DIV=2 JET_GRAD_HOLD=1" $f; mk dinf-$f "JET_SPLITK_DIV=100000 JET_GRAD_HOLD=1" $f
  mk ha-$f "JET_SPLITK_DIV=2" $f
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 60 ./.carry/cuda_parity held_bf16 --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity held rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_parity.log | tail -1 | cut -c1-60)"
timeout 60 ./.carry/cuda_stacked --test-threads=1 --nocapture > $OUT/cuda_stacked.log 2>&1
echo "cuda_stacked rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_stacked.log | tail -1 | cut -c1-60)"
timeout 200 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/gpu_parity.log | tail -1 | cut -c1-60)"
grep -hE "held|FAILED|panicked" $OUT/cuda_parity.log $OUT/gpu_parity.log | cut -c1-140 | head -16; pack
timeout 60 ./.carry/cuda_timing split_k_rule_timing --ignored --test-threads=1 --nocapture > $OUT/sk_rule.log 2>&1
echo "split_k_rule_timing rc $? (${SECONDS}s)"; pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 230 bash bench/gpu_check.sh compare qwen3-0.6b 2 base-bf16,fn-bf16,d2-bf16,ha-bf16,base-fp8,fn-fp8,d2-fp8,ha-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
echo "== split-K rule"; grep TIMING $OUT/sk_rule.log | sed 's/TIMING split-K rule //' | cut -c1-200
echo "== compare"; grep -E "step training|step whole|train \|" $OUT/compare.txt | cut -c1-330
if [ $SECONDS -lt 380 ]; then
./.carry/jetd bench --device cuda --json --no-kernels --no-cublaslt --flow bf16 --batch 1 --gen-len 2 --prompt-len 16 --train-steps 1 > /dev/null 2>&1
timeout 80 ncu --clock-control none --set full --import-source no -k 'regex:^qk_norm_rope_bwd_x16_o3$' --launch-skip 30 --launch-count 1 -o $OUT/ncu-qknb -f \
  ./.carry/jetd bench --device cuda --json --no-kernels --no-cublaslt --flow bf16 --batch 1 --gen-len 2 --prompt-len 16 --train-steps 1 > $OUT/ncu-qknb.log 2>&1
echo "ncu rc $? (${SECONDS}s)"
ncu -i $OUT/ncu-qknb.ncu-rep --page raw --csv > $OUT/ncu-qknb-raw.csv 2>>$OUT/ncu-qknb.log
ncu -i $OUT/ncu-qknb.ncu-rep --page source --print-source sass --csv > $OUT/ncu-qknb-src.csv 2>>$OUT/ncu-qknb.log
ncu -i $OUT/ncu-qknb.ncu-rep --page details > $OUT/ncu-qknb-details.txt 2>>$OUT/ncu-qknb.log
python3 bench/ncu_stalls.py $OUT/ncu-qknb-raw.csv $OUT/ncu-qknb-src.csv > $OUT/ncu-qknb.txt 2>&1; rm -f $OUT/ncu-qknb-src.csv $OUT/ncu-qknb-raw.csv; pack
echo "== ncu"; head -24 $OUT/ncu-qknb.txt
fi
