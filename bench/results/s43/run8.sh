#!/bin/bash
# Session 43, call 8: Qwen3-8B shapes, 4 layers: the training step in bf16 then fp8
# (8 x 512, an update a micro-batch) with this session's norms.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for f in bf16 fp8; do
  timeout 90 ./.carry/jetd bench --device cuda --preset qwen3-8b --layers 4 --json --no-kernels --no-cublaslt \
    --flow $f --batch 64 --gen-len 16 --train-steps 3 > $OUT/bench-8b4l-$f.json 2> $OUT/bench-8b4l-$f.err
  echo "$f rc $?"
  pack
  python3 -c "
import json; d=json.load(open('$OUT/bench-8b4l-$f.json'))
for t in d['train']: print('train', t['flow'], round(t['tokens_per_s']), 'median %.2f ms' % (t['step_median_s']*1e3))
" 2>/dev/null
done
