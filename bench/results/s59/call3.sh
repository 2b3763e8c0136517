#!/bin/bash
# The fifty-ninth session's call 3: main with the cuBLASLt tuning (f1a7a1b) plus the
# rows kernels' residual tile prefetched into L2 (ROWS_RES_PREFETCH, on by default).
# 1. cuda_invariant (bits of the rows kernels against the decode kernels, with it).
# 2. The 0.6B and 8B-4l steps with and without the prefetch (JET_NVRTC_DEFINES=
#    ROWS_RES_PREFETCH=0), both flows, interleaved.
# 3. The full jetd bench at 0.6B (the headline's command).
R=$OUT; export OUT=/tmp/g3; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g3; }
gunzip -f .carry/*.gz
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 100 ./.carry/cuda_invariant --test-threads=1 > $OUT/cuda_invariant.log 2>&1
echo "cuda_invariant rc $? (${SECONDS}s)"; grep -E 'test result|FAILED|panicked' $OUT/cuda_invariant.log | tail -3
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
mk p0-bf16 "JET_NVRTC_DEFINES=ROWS_RES_PREFETCH=0" bf16; mk p0-fp8 "JET_NVRTC_DEFINES=ROWS_RES_PREFETCH=0" fp8
mk p1-bf16 "" bf16; mk p1-fp8 "" fp8
JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3" timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 2 p0-bf16,p0-fp8,p1-bf16,p1-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "\\| train \\||step training|step whole" $OUT/compare.txt | cut -c1-300
timeout $((580 - SECONDS)) ./.carry/jetd bench --device cuda --preset qwen3-0.6b --json > $OUT/bench-qwen3-0.6b.json 2> $OUT/bench-qwen3-0.6b.err
echo "bench 0.6B rc $? (${SECONDS}s)"; pack
python3 - $OUT/bench-qwen3-0.6b.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for t in d["train"]:
    print("train", t["flow"], round(t["tokens_per_s"]), round(t["step_s"] * 1e3, 2), "ms", "vs_bf16 %.3f" % t["vs_bf16"], "of_floor %.3f" % (t.get("of_floor") or 0))
for r in d["rollout"]:
    print("rollout", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, (list, dict))})
for s in d["step"]:
    print("step", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items() if not isinstance(v, (list, dict))})
print("tuned", len(d.get("gemm_tuned", [])), sum(1 for t in d.get("gemm_tuned", []) if t["chosen"]))
PY
