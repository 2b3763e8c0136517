#!/bin/bash
# Fifty-fourth session, call 7: call 5's build again (norm_terms_part + colsum_final; call 6's fused
# colsum_terms dropped), its rmsnorm forms check, then JET_NORM_TERMS=0 against the default at 0.6B,
# five reps interleaved: is call 5's bf16 GRPO gain (148.1 -> 144.5 ms) real?
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk jo-bf16 "JET_NORM_TERMS=0" bf16; mk jt-bf16 "" bf16; mk jo-fp8 "JET_NORM_TERMS=0" fp8; mk jt-fp8 "" fp8
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 90 ./.carry/cuda_parity rmsnorm_bwd_rows_forms --test-threads=1 --nocapture > $OUT/cuda_parity.log 2>&1
echo "cuda_parity rc $? (${SECONDS}s): $(grep -E '^test result' $OUT/cuda_parity.log | tail -1 | cut -c1-60)"; pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 300 bash bench/gpu_check.sh compare qwen3-0.6b 5 jo-bf16,jt-bf16,jo-fp8,jt-fp8 > $OUT/cmp.log 2>&1
echo "compare 0.6b rc $? (${SECONDS}s)"; pack
grep -E "train \||step training" $OUT/compare.txt | cut -c1-320
python3 - <<PY
import json, glob, collections
for b in ['jo_bf16', 'jt_bf16', 'jo_fp8', 'jt_fp8']:
    acc = collections.defaultdict(float); fs = sorted(glob.glob('$OUT/cmp/qwen3_0.6b-%s-*.json' % b))
    for f in fs:
        for k in json.load(open(f))['step'][0]['train_top_kernels']: acc[k[0]] += k[1] * 1e3 / len(fs)
    print(b, round(sum(acc.values()), 2), [(k[:20], round(v, 2)) for k, v in acc.items() if any(s in k for s in ('rmsnorm_bwd', 'qk_norm_rope_bwd', 'terms', 'colsum'))])
PY
