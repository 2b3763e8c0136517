#!/bin/bash
# For the next session (prepared, not run): why the tied embedding's row settle
# ran the GRPO-shaped fp8 training phase 4-12 ms slower with eight micro-batches'
# outputs held (call 1). One jetd (main after the fifty-seventh session), the step
# in the old cut (8 sequences a micro-batch), three ways, each flow, two reps:
#   off = JET_SCATTER_SETTLE=0 (settle whole), one = the default (rows only where
#   one addend is held: settles whole here), all = JET_SCATTER_SETTLE=all (rows at
#   any hold: call 1's slow path).
# Then each run's train_top_kernels and train_idle_before (the stream's idle before
# each kernel: a late host shows there; call 1's spans included it).
# Binaries: .carry/jetd (release jetd of main), gzipped.
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
gunzip -f .carry/*.gz
mk() { printf '#!/bin/bash\n%s exec "$(dirname "$0")/jetd" "$@" --flow %s\n' "$2" "$3" > .carry/$1; chmod +x .carry/$1; }
OLDM="--step-micro-seqs 8 --step-micro-tokens 0"
for f in bf16 fp8; do
  mk off-$f "JET_SCATTER_SETTLE=0" "$f $OLDM"; mk one-$f "" "$f $OLDM"; mk all-$f "JET_SCATTER_SETTLE=all" "$f $OLDM"
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
export JET_BENCH_ARGS="--batch 64 --gen-len 16 --train-steps 1"
timeout 200 bash bench/gpu_check.sh compare qwen3-0.6b 2 off-bf16,one-bf16,all-bf16,off-fp8,one-fp8,all-fp8 > $OUT/cmp.log 2>&1
echo "compare rc $? (${SECONDS}s)"; pack
grep -E "step training|step whole" $OUT/compare.txt | cut -c1-300
python3 - <<PY
import json, glob
for f in sorted(glob.glob('$OUT/cmp/*-1.json')):
    d = json.load(open(f)); s = d['step'][0]
    idle = sum(t for _, t, _ in s.get('train_idle_before', []))
    print(f.split('/')[-1], 'train %.1f ms' % (s['train_s'] * 1e3), 'idle %.2f ms' % (idle * 1e3),
          [(k, round(t * 1e3, 2), n) for k, t, n in s.get('train_idle_before', [])[:4]])
PY
