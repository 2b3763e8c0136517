#!/bin/bash
# Fifty-fourth session, call 2: the branch's full build (q/k pre-norm BF16 only where both GEMMs
# write BF16; the q/k norm backward's three-an-SM kernels past two blocks an SM; the attention's
# dK/dV kernel writes dv's BF16 operand alone where that is all that is read) against main (6b751f2).
# Binaries gzipped in .carry (the 64 MiB limit). Checks, then 0.6B (3 reps) and 8B-4l (2 reps).
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
mk() { printf '#!/bin/bash\nexec "$(dirname "$0")/%s" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk jm-bf16 jetd-main bf16; mk jn-bf16 jetd bf16; mk jm-fp8 jetd-main fp8; mk jn-fp8 jetd fp8
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_parity cuda_flash cuda_stacked_bf16 gpu_parity; do
  timeout 150 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/$t.log | tail -1 | cut -c1-60)"; grep -E "panicked|FAILED|failed" $OUT/$t.log | head -5 | cut -c1-200
done
grep -hE "one launch == one each.*4096|dv's BF16 operand" $OUT/cuda_parity.log $OUT/cuda_flash.log | cut -c1-170
grep -hE "^PARITY.*rollout vs training" $OUT/gpu_parity.log | cut -c1-120; pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b 3 jm-bf16,jn-bf16,jm-fp8,jn-fp8 > $OUT/cmp.log 2>&1
echo "compare 0.6b rc $? (${SECONDS}s)"; cp $OUT/compare.txt $OUT/compare-0.6b.txt; pack
grep -E "train \||step training" $OUT/compare-0.6b.txt | cut -c1-300
timeout $((560 - SECONDS)) bash bench/gpu_check.sh compare qwen3-8b:4 2 jm-bf16,jn-bf16,jm-fp8,jn-fp8 > $OUT/cmp8.log 2>&1
echo "compare 8b-4l rc $? (${SECONDS}s)"; cp $OUT/compare.txt $OUT/compare-8b.txt; pack
grep -E "train \||step training" $OUT/compare-8b.txt | cut -c1-300
python3 - <<PY
import json, glob, collections
for shape in ['qwen3_0.6b', 'qwen3_8b_4l']:
  for b in ['jm_bf16', 'jn_bf16', 'jm_fp8', 'jn_fp8']:
    acc = collections.defaultdict(float); fs = sorted(glob.glob('$OUT/cmp/%s-%s-*.json' % (shape, b)))
    for f in fs:
        for k in json.load(open(f))['train'][0]['top_kernels']: acc[k[0]] += k[1] * 1e3 / len(fs)
    print(shape, b, [(k[:18], round(v, 3)) for k, v in acc.items() if any(s in k for s in ('qk_norm', 'rows_tma', 'fa_bwd_kv', 'bf16_widen'))])
PY
