#!/bin/bash
# Fifty-fourth session, call 6: call 5 with the norm path's terms summed in colsum_terms (one launch: the
# NORM_ROWS blocks' sums and colsum_final fused, the same bits) in place of norm_terms_part + colsum_final.
# Checks, then JET_NORM_TERMS=0 (the old forms) against the default, one binary, 0.6B, 4 reps.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk jo-bf16 "JET_NORM_TERMS=0" bf16; mk jt-bf16 "" bf16; mk jo-fp8 "JET_NORM_TERMS=0" fp8; mk jt-fp8 "" fp8
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_parity gpu_parity; do
  timeout 150 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-60)"; grep -E "panicked|FAILED|failed" $OUT/$t.log | head -5 | cut -c1-200
done
grep -hE "rmsnorm bwd rows, |one pass == two|one launch == one each.*4096 tokens x 8" $OUT/cuda_parity.log | cut -c1-150
grep -hE "^PARITY.*rollout vs training" $OUT/gpu_parity.log | cut -c1-110; pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 240 bash bench/gpu_check.sh compare qwen3-0.6b 4 jo-bf16,jt-bf16,jo-fp8,jt-fp8 > $OUT/cmp.log 2>&1
echo "compare 0.6b rc $? (${SECONDS}s)"; cp $OUT/compare.txt $OUT/compare-0.6b.txt; pack
grep -E "train \||step training" $OUT/compare-0.6b.txt | cut -c1-300
python3 - <<PY
import json, glob, collections
for shape in ['qwen3_0.6b']:
  for b in ['jo_bf16', 'jt_bf16', 'jo_fp8', 'jt_fp8']:
    acc = collections.defaultdict(float); fs = sorted(glob.glob('$OUT/cmp/%s-%s-*.json' % (shape, b)))
    for f in fs:
      for k in json.load(open(f))['step'][0]['train_top_kernels']: acc[k[0]] += k[1] * 1e3 / len(fs)
    print(shape, b, round(sum(acc.values()), 2), [(k[:20], round(v, 2)) for k, v in acc.items() if any(s in k for s in ('rmsnorm_bwd', 'qk_norm_rope_bwd', 'terms', 'colsum'))])
PY
