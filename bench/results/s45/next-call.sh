#!/bin/bash
# Prepared for the session after the forty-fifth (not run): branch s45-next (the same
# change as bench/results/s45/s45-next-loads-not-run.diff, `git apply` on main), where the
# bf16 flow's SwiGLU kernels and rmsnorm_operand issue all of a thread's loads before
# the first use (load_raw4 / split loops), found by bench/sass_load_use.py: the
# dual quantizers' fix of this session (ncu: a memory round trip a load) applied to
#   swiglu_operand(_gu16)       0.6B bf16 1.53 ms a step, ~42% of its bytes' bandwidth
#   swiglu_bwd_bf16(_dh16_gu16) 0.6B bf16 1.38 ms, ~78%
#   rmsnorm_operand             only where a thread holds two or more groups (dim > 4096)
# Same values into the same arithmetic, so the same bits; not run on a GPU yet.
# Build both here (the branch, then main as jetd-main), in .carry:
#   git checkout s45-next && cargo build --release -p jet-backend --bin jetd \
#     && cargo test -p jet-kernels --no-run && cargo test -p jet-backend --test gpu_parity --no-run \
#     && bash bench/gpu_check.sh --collect
#   git checkout main && cargo build --release -p jet-backend --bin jetd && cp target/release/jetd .carry/jetd-main
#   for f in fp8 bf16; do for b in jetd jetd-main; do
#     printf '#!/bin/bash\nexec "$(dirname "$0")/'$b'" "$@" --flow '$f'\n' > .carry/$b-$f; chmod +x .carry/$b-$f; done; done
#   tar cf - -C .carry . | xz -T2 -6 > .carryz/c.tar.xz   (carry [".carryz"])
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for t in cuda_act cuda_parity gpu_parity; do
  timeout 100 ./.carry/$t --test-threads=1 --nocapture > $OUT/$t.log 2>&1
  echo "$t rc $?"; grep -E "test result|panicked" $OUT/$t.log | tail -2 | cut -c1-200
done
pack
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 3"
timeout 300 bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 3 jetd-main-bf16,jetd-bf16,jetd-main-fp8,jetd-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $?"; pack
python3 bench/compare_builds.py $OUT/cmp jetd_main_bf16 jetd_bf16 | grep -E 'train' | cut -c1-200
python3 bench/compare_builds.py $OUT/cmp jetd_main_fp8 jetd_fp8 | grep -E 'train' | cut -c1-200
for b in jetd-main jetd; do
  timeout 45 ./.carry/$b bench --device cuda --json --no-cublaslt --preset qwen3-0.6b --flow bf16 --batch 64 --gen-len 16 --train-steps 3 > $OUT/k06-$b.json 2> $OUT/k06-$b.err; echo "k06 $b rc $?"
done
pack
python3 - <<PY
import json
for b in ['jetd-main', 'jetd']:
    d = json.load(open('$OUT/k06-%s.json' % b))
    t = d['train'][0]
    print(b, 'step %.2f ms' % (t['step_s'] * 1e3))
    for k in t['top_kernels']:
        if 'swiglu' in k[0] or 'rmsnorm_operand' in k[0]:
            print('   %-32s %7.3f ms %3d' % (k[0], k[1] * 1e3, k[2]))
PY
