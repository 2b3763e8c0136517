#!/bin/bash
# Fifty-fourth session, call 5: the norms' backward for launches of fewer blocks than SMs (a GRPO
# micro-batch's rows) as a row a block (warp) with the dw terms summed by a second launch in the
# old order (rmsnorm_bwd_rows1t + norm_terms_part, qk_norm_rope_bwd_t + qk_terms_part; the same
# bits). Checks, then JET_NORM_TERMS=0 (the old forms) against the default, one binary.
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
timeout 180 bash bench/gpu_check.sh compare qwen3-0.6b 3 jo-bf16,jt-bf16,jo-fp8,jt-fp8 > $OUT/cmp.log 2>&1
echo "compare 0.6b rc $? (${SECONDS}s)"; cp $OUT/compare.txt $OUT/compare-0.6b.txt; pack
grep -E "train \||step training" $OUT/compare-0.6b.txt | cut -c1-300
timeout $((560 - SECONDS)) bash bench/gpu_check.sh compare qwen3-8b:4 2 jo-bf16,jt-bf16,jo-fp8,jt-fp8 > $OUT/cmp8.log 2>&1
echo "compare 8b rc $? (${SECONDS}s)"; cp $OUT/compare.txt $OUT/compare-8b.txt; pack
grep -E "train \||step training" $OUT/compare-8b.txt | cut -c1-300
python3 - <<PY
import json, glob, collections
for shape in ['qwen3_0.6b', 'qwen3_8b_4l']:
  for b in ['jo_bf16', 'jt_bf16', 'jo_fp8', 'jt_fp8']:
    acc = collections.defaultdict(float); fs = sorted(glob.glob('$OUT/cmp/%s-%s-*.json' % (shape, b)))
    for f in fs:
      for k in json.load(open(f))['step'][0]['train_top_kernels']: acc[k[0]] += k[1] * 1e3 / len(fs)
    print(shape, b, round(sum(acc.values()), 2), [(k[:20], round(v, 2)) for k, v in acc.items() if any(s in k for s in ('rmsnorm_bwd', 'qk_norm_rope_bwd', 'terms', 'colsum_final'))])
PY
