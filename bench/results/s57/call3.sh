#!/bin/bash
# Fifty-seventh session, call 3 (call 2 never found a machine; ~320 s of device time
# left): the checks of the changes to land (call 2's step 1), then, as far as DL
# allows, one short bench of the landed build (0.6B, batch 64, gen 16, all flows but
# the cuBLASLt twins).
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
DL=${DL:-200}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for t in scatter_settles_only_the_rows_it_writes masked_gradient_matches_a_plain_one held_bf16_gradients embedding_matches_cpu \
         qk_norm_rope_backward_equals_the_two_passes qk_norm_rope_backward_pair_equals_one_launch_each adamw_with_fp8_blocks adamw_is_bit_exact kernel_sources_compile; do
  timeout 60 ./.carry/cuda_parity $t --test-threads=1 --nocapture > $OUT/cp-$t.log 2>&1
  echo "cuda_parity $t rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cp-$t.log | tail -1 | cut -c1-40)"
done
timeout 150 ./.carry/gpu_parity --test-threads=1 --nocapture > $OUT/gpu_parity.log 2>&1
echo "gpu_parity rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/gpu_parity.log | tail -1 | cut -c1-60)"
grep -hE "scatter|FAILED|panicked" $OUT/cp-*.log $OUT/gpu_parity.log | cut -c1-160 | head -12; pack
if [ $SECONDS -lt $((DL - 30)) ]; then
  timeout $((DL - SECONDS)) ./.carry/jetd bench --device cuda --preset qwen3-0.6b --json --no-cublaslt --batch 64 --gen-len 16 --train-steps 3 \
    > $OUT/bench-short.json 2> $OUT/bench-short.err
  echo "bench short rc $? (${SECONDS}s)"; pack
  python3 - <<PY
import json
d = json.load(open('$OUT/bench-short.json'))
for t in d.get('train', []): print('train', t['flow'], round(t['tokens_per_s']), round(t['step_s']*1e3, 2))
for s in d.get('step', []): print('step', s['flow'], round(s['total_s']*1e3, 1), round(s['rollout_s']*1e3, 1), round(s['train_s']*1e3, 1), s.get('micro_batches'))
PY
fi
