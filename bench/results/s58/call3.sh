#!/bin/bash
# Fifty-eighth session, call 3: the rows kernels' epilogue share. cuda_timing
# fp8_rows_timing (0.6B shapes, f32 outputs; FP8 and BF16 rows kernels) as built
# and with ROWS_NO_STORE=1 (the stores skipped: a measurement-only define), twice
# each, interleaved.
R=$OUT; export OUT=/tmp/g3; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g3; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
for d in "" ROWS_NO_STORE=1 "" ROWS_NO_STORE=1; do
  JET_NVRTC_DEFINES=$d timeout 60 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/timing-$d-$SECONDS.log 2>&1
  echo "timing [$d] rc $? (${SECONDS}s)"
done
pack
python3 - <<PY
import glob, re
rows = {}
for f in sorted(glob.glob('$OUT/timing-*.log')):
    tag = 'nostore' if 'NO_STORE' in f else 'main'
    for l in open(f):
        m = re.match(r'TIMING (fp8|bf16) rows (\\d+x\\d+x\\d+) (\\S+)\\s*: cuBLASLt\\s+([\\d.]+) us.*?\\| rows(?:64)?\\s+([\\d.]+) us', l)
        if m: rows.setdefault((m[1], m[2], m[3]), {}).setdefault(tag, []).append(float(m[5])); rows[(m[1], m[2], m[3])]['lt'] = float(m[4])
for k, v in rows.items():
    print(*k, 'cuBLASLt %.1f' % v['lt'], 'rows main', v.get('main'), 'nostore', v.get('nostore'))
PY
