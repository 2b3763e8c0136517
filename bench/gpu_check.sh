#!/usr/bin/env bash
# One device call: GPU tests and benchmarks from binaries built elsewhere.
#
# Build on any machine (no GPU needed), copying the binaries into .carry/:
#   cargo test -p jet-kernels --no-run && cargo test -p jet-backend --test gpu_parity --no-run
#   cargo build --release -p jet-backend --bin jetd
#   bash bench/gpu_check.sh --collect
# Then on the GPU machine, in the repo root (with .carry carried):
#   bash bench/gpu_check.sh [tests] [bench PRESET [LAYERS]] [peer PRESET [LAYERS]] [attnpeer]
# Logs go to $OUT (or ./gpu-logs); the summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--collect" ]]; then
  mkdir -p .carry
  latest() { ls -t target/debug/deps/$1-* | grep -v '\.d$' | head -1; }
  for t in cuda_flash cuda_parity gpu_parity; do cp "$(latest $t)" .carry/$t; done
  cp target/release/jetd .carry/jetd
  strip .carry/* 2>/dev/null
  ls -la .carry
  exit 0
fi

LOG=${OUT:-./gpu-logs}
mkdir -p "$LOG"
export JET_KERNEL_CACHE_DIR=${JET_KERNEL_CACHE_DIR:-/tmp/jetk}
export PYTHONUNBUFFERED=1
SUMMARY=()
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$LOG/device.txt"

while [[ $# -gt 0 ]]; do
  case "$1" in
    tests)
      shift
      for t in cuda_flash cuda_parity gpu_parity; do
        ./.carry/$t --test-threads=1 --nocapture >"$LOG/$t.log" 2>&1
        rc=$?
        SUMMARY+=("test $t: rc $rc, $(grep -E '^test result' "$LOG/$t.log" | tail -1)")
      done
      grep -hE '^(PARITY|MISMATCH)' "$LOG"/cuda_flash.log "$LOG"/gpu_parity.log | cut -c1-150
      ;;
    bench)
      preset=$2; shift 2
      layers=()
      if [[ "${1:-}" =~ ^[0-9]+$ ]]; then layers=(--layers "$1"); shift; fi
      name="bench-$preset${layers[1]:+-${layers[1]}l}"
      ./.carry/jetd bench --device cuda --preset "$preset" "${layers[@]}" ${JET_BENCH_ARGS:-} \
        >"$LOG/$name.txt" 2>"$LOG/$name.err"
      SUMMARY+=("$name: rc $?")
      cat "$LOG/$name.txt"
      ;;
    peer)
      preset=$2; shift 2
      layers=()
      if [[ "${1:-}" =~ ^[0-9]+$ ]]; then layers=(--layers "$1"); shift; fi
      # sdpa: HF generate (rollout) and training; compile: training only.
      for p in sdpa compile; do
        name="peer-$p-$preset${layers[1]:+-${layers[1]}l}"
        roll=(); [[ $p == compile ]] && roll=(--no-rollout)
        python3 bench/peer_torch.py --peer $p "${roll[@]}" --preset "$preset" "${layers[@]}" --json \
          >"$LOG/$name.txt" 2>"$LOG/$name.err"
        SUMMARY+=("$name: rc $?")
        grep -E '^(#|train|rollout)' "$LOG/$name.txt"
      done
      ;;
    attnpeer)
      shift
      python3 bench/peer_torch.py --attn-bench --json >"$LOG/peer-attn.txt" 2>"$LOG/peer-attn.err"
      SUMMARY+=("peer-attn: rc $?")
      grep -v '^{' "$LOG/peer-attn.txt"
      ;;
    *) echo "unknown step $1"; exit 2 ;;
  esac
done
printf '%s\n' "${SUMMARY[@]}"
