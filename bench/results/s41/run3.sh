#!/bin/bash
# Session 41, call 3: the rollout rows at fixed lengths (128 + 128 tokens,
# batch 64 and 256; one bucket, captured behind the prefill before this
# change too) and the GRPO-shaped step with 1-512-token responses once more,
# the fortieth session's build (jetd-prev) against this one (jetd).
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
JET_BENCH_ARGS="--train-steps 0 --batch 64,256" timeout 280 bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 1 jetd-prev,jetd > $OUT/main-a.log 2>&1
mv $OUT/cmp $OUT/cmp-fixed; pack
JET_BENCH_ARGS="--train-steps 1 --batch 64 --group-size 8 --prompt-len 128 --gen-len 512 --eos-random" timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b 1 jetd-prev,jetd > $OUT/main-b.log 2>&1
mv $OUT/cmp $OUT/cmp-eos; pack
python3 bench/compare_builds.py $OUT/cmp-fixed jetd_prev jetd | grep -E 'rollout' | cut -c1-200
python3 bench/compare_builds.py $OUT/cmp-eos jetd_prev jetd | grep -E 'step|rollout' | cut -c1-200
for f in $OUT/cmp-fixed/*.json; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['rollout']: print(sys.argv[1].split('/')[-1][:24], r['flow'], r['batch'], 'share', r.get('of_floor'), 'decode share', r.get('decode_of_floor'), 'cap', r.get('graphs_captured'), 'reuse', r.get('graphs_reused'))
PY
done
grep -h "rc [^0]" $OUT/main-*.log | head
