#!/bin/bash
# Fifty-eighth session, call 2 (call 1's machine, warm): the PyTorch training peers
# at 0.6B (torch.compile, then SDPA + fused AdamW); ncu of the FP8 rows kernel
# (without / with ROWS_ORDER=1) and of cuBLASLt's block-scaled FP8 GEMM at 0.6B's
# gate/up shape (4,096 x 1,024 x 3,072); the 0.6B step without / with ROWS_ORDER=1
# (one jetd, a wrapper setting JET_NVRTC_DEFINES), both flows.
R=$OUT; export OUT=/tmp/g2; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g2; }
gunzip -f .carry/*.gz 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
timeout 250 python3 bench/peer_torch.py --peer compile --no-rollout --preset qwen3-0.6b --json > $OUT/peer-compile-qwen3-0.6b.txt 2> $OUT/peer-compile-qwen3-0.6b.err
echo "peer compile rc $? (${SECONDS}s)"; grep -E '^train' $OUT/peer-compile-qwen3-0.6b.txt | cut -c1-160; pack
timeout 100 python3 bench/peer_torch.py --peer sdpa --no-rollout --preset qwen3-0.6b --json > $OUT/peer-sdpa-qwen3-0.6b.txt 2> $OUT/peer-sdpa-qwen3-0.6b.err
echo "peer sdpa rc $? (${SECONDS}s)"; grep -E '^train' $OUT/peer-sdpa-qwen3-0.6b.txt | cut -c1-160; pack
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
nc() {  # tag, kernel regex, defines
  JET_TIMING_ONLY=gate/up JET_NVRTC_DEFINES=$3 timeout 80 $NCU --set full -k regex:"$2" -s 3 -c 1 ./.carry/cuda_timing --ignored --exact fp8_rows_timing --nocapture > $OUT/ncu-$1.txt 2>&1
  echo "ncu $1 rc $? (${SECONDS}s)"
  grep -E '^  [a-zA-Z_0-9]+.*\(|Duration|SM Frequency|Pipe Tensor Cycles|Lsu Wavefronts|L1/TEX Cache Throughput|Achieved Occupancy|Stall (Wait|Long|Barrier|Short|Math|Not Sel|Selected)|Issue Slots Busy' $OUT/ncu-$1.txt | head -20 | cut -c1-120
}
[ $SECONDS -lt 380 ] && nc rows-fp8 wg_fp8_rows_tma ""
[ $SECONDS -lt 400 ] && nc rows-fp8-order wg_fp8_rows_tma ROWS_ORDER=1
[ $SECONDS -lt 420 ] && nc lt-fp8 'nvjet|sm90|cutlass|gemm' ""
pack
