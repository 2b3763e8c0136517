#!/bin/bash
# Session 40, call 2: where a rollout step goes at a long shared prompt. 0.6B fp8,
# batch 64, 128 generated tokens: prompt 512 with 8 samples a prompt (pages shared)
# and with 1 (no sharing), prompt 128 with 8; graphs on, then the 512 / 8 case
# launched eagerly (--no-cuda-graphs) for its per-kernel breakdown.
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
B="./.carry/jetd bench --device cuda --json --no-kernels --no-cublaslt --train-steps 0 --batch 64 --gen-len 128"
for p in qwen3-0.6b qwen3-8b; do
  L=""; [ $p = qwen3-8b ] && L="--layers 4"
  for f in fp8 bf16; do
    $B --preset $p $L --flow $f --prompt-len 512 --group-size 8 > $OUT/$p-$f-p512-g8.json 2>$OUT/$p-$f-p512-g8.err
    $B --preset $p $L --flow $f --prompt-len 512 --group-size 1 > $OUT/$p-$f-p512-g1.json 2>$OUT/$p-$f-p512-g1.err
    $B --preset $p $L --flow $f --prompt-len 128 --group-size 8 > $OUT/$p-$f-p128-g8.json 2>$OUT/$p-$f-p128-g8.err
  done
  $B --preset $p $L --flow fp8 --prompt-len 512 --group-size 8 --no-cuda-graphs > $OUT/$p-fp8-p512-g8-eager.json 2>$OUT/$p-fp8-p512-g8-eager.err
done
pack
python3 - <<'P'
import json,glob
for f in sorted(glob.glob('/tmp/g/*.json')):
    try: d=json.load(open(f))
    except Exception as e: print(f,'ERR',e); continue
    for r in d['rollout']:
        print(f.split('/')[-1][:-5], r['flow'], 'steps',r['steps'],'s %.4f decode_s %.4f prefill_s %.4f'%(r['seconds'],r['decode_s'],r['prefill_s']), 'ms/step %.3f'%(r['decode_s']/max(1,r['steps']-1)*1e3))
        if 'eager' in f:
            for k in r['top_kernels'][:14]: print('   ', k[0], '%.2f ms'%(k[1]*1e3), k[2])
P
