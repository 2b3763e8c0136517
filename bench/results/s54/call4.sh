#!/bin/bash
# Fifty-fourth session, call 4: the q/k norms' forward (qk_norm_rope_128{,_x16}) with R rows a
# block (JET_QKNR_ROWS 1, 2, 4; one binary): checks under R 4 and 2, then 0.6B (3 reps) and 8B-4l
# (2 reps), bf16 and fp8.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
mk() { printf '#!/bin/bash\nJET_QKNR_ROWS=%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
for r in 1 2 4; do mk b$r $r bf16; mk f$r $r fp8; done
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for r in 4 2; do
  JET_QKNR_ROWS=$r timeout 100 ./.carry/cuda_parity qk_norm_rope --test-threads=1 --nocapture > $OUT/cuda_parity_r$r.log 2>&1
  echo "cuda_parity qk R=$r rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_parity_r$r.log | tail -1 | cut -c1-60)"
  JET_QKNR_ROWS=$r timeout 100 ./.carry/gpu_parity rollout_equals_training --test-threads=1 --nocapture > $OUT/gpu_parity_r$r.log 2>&1
  echo "gpu_parity rollout R=$r rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/gpu_parity_r$r.log | tail -1 | cut -c1-60)"
  grep -hE "^PARITY.*rollout vs training" $OUT/gpu_parity_r$r.log | cut -c1-100 | sort | uniq -c | head -12
done
grep -hE "panicked|FAILED" $OUT/*.log | head -5; pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b 3 b1,b2,b4,f1,f2,f4 > $OUT/cmp.log 2>&1
echo "compare 0.6b rc $? (${SECONDS}s)"; cp $OUT/compare.txt $OUT/compare-0.6b.txt; pack
grep -E "train \||step training" $OUT/compare-0.6b.txt | cut -c1-330
timeout $((560 - SECONDS)) bash bench/gpu_check.sh compare qwen3-8b:4 2 b1,b4,f1,f4 > $OUT/cmp8.log 2>&1
echo "compare 8b rc $? (${SECONDS}s)"; cp $OUT/compare.txt $OUT/compare-8b.txt; pack
grep -E "train \|" $OUT/compare-8b.txt | cut -c1-300
python3 - <<PY
import json, glob, collections
for shape, bs in [('qwen3_0.6b', ['b1','b2','b4','f1','f2','f4']), ('qwen3_8b_4l', ['b1','b4','f1','f4'])]:
  for b in bs:
    for key in ['train', 'step']:
      acc = collections.defaultdict(float); fs = sorted(glob.glob('$OUT/cmp/%s-%s-*.json' % (shape, b)))
      for f in fs:
        d = json.load(open(f))
        if key == 'step' and not d.get('step'): continue
        ks = d['train'][0]['top_kernels'] if key == 'train' else d['step'][0]['train_top_kernels']
        for k in ks: acc[k[0]] += k[1] * 1e3 / len(fs)
      print(shape, b, key, [(k[:22], round(v, 3)) for k, v in acc.items() if k.startswith('qk_norm_rope_1')])
PY
