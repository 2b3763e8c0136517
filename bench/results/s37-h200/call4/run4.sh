#!/bin/bash
# Session 37, call 4: a GPU RL run through `jetd run` with the KV cache bounded (0.6B
# shape, random weights, long scratchpad responses): the step metrics' KV fields and
# the progress line's preemptions, against the same run unbounded.
export R=$OUT; export OUT=/tmp/logs; mkdir -p $OUT
export JET_KERNEL_CACHE_DIR=/tmp/jetk
cat > configs/kv-demo.toml <<'T'
[run]
steps = 2
flow = "fp8"
seed = 1
device = "cuda"
eval_every = 100
eval_size = 8
[model]
tokenizer = "tiny-arith.tokenizer.json"
[model.random]
arch = "qwen3"
hidden_size = 1024
intermediate_size = 3072
num_hidden_layers = 28
num_attention_heads = 16
num_key_value_heads = 8
head_dim = 128
max_position_embeddings = 512
tie_word_embeddings = true
[task]
kind = "scratchpad"
digits = 36
min_digits = 30
ops = ["+"]
heldout = 16
seed = 7
[reward]
correct = 1.0
format = 0.1
[rollout]
prompts_per_step = 16
group_size = 8
max_new_tokens = 384
temperature = 1.0
kv_cache_gib = KV
[train]
lr = 2e-5
warmup_steps = 1
micro_batch = 32
T
for kv in 0 0.5; do
  sed "s/KV/$kv/" configs/kv-demo.toml > configs/kv-demo-$kv.toml
  timeout 200 .carry/jetd run configs/kv-demo-$kv.toml --data-dir /tmp/d$kv --metrics-out $OUT/kv-$kv.jsonl > $OUT/run-kv-$kv.txt 2>&1
  echo "rc $?" >> $OUT/run-kv-$kv.txt
done
tar czf $R/logs.tgz -C /tmp logs
for kv in 0 0.5; do echo "== kv_cache_gib $kv"; tail -4 $OUT/run-kv-$kv.txt; python3 -c "
import json,sys
for l in open('$OUT/kv-$kv.jsonl'):
    m=json.loads(l)
    if m.get('phase')=='rl': print({k:m.get(k) for k in ['step','response_len_mean','rollout_s','rollout_tokens_per_s','kv_peak_gib','kv_pool_gib','rollout_preemptions','mismatch_kl']})
"; done
.carry/cuda_parity --test-threads=1 --nocapture rmsnorm_operand > $OUT/cuda_parity_rmsnorm_operand.log 2>&1; echo "cuda_parity rmsnorm_operand rc $?"
grep -E "warp a row|test result" $OUT/cuda_parity_rmsnorm_operand.log | cut -c1-120
tar czf $R/logs.tgz -C /tmp logs
