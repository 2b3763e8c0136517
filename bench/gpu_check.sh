#!/usr/bin/env bash
# One device call: GPU tests and benchmarks from binaries built elsewhere.
#
# Build on any machine (no GPU needed), copying the binaries into .carry/:
#   cargo test -p jet-kernels --no-run && cargo test -p jet-backend --test gpu_parity --no-run
#   cargo build --release -p jet-backend --bin jetd
#   bash bench/gpu_check.sh --collect
# Then on the GPU machine, in the repo root (with .carry carried):
#   bash bench/gpu_check.sh [tests] [bench PRESET [LAYERS]] [peer PRESET [LAYERS]] [attnpeer]
#                           [sft CONFIG] [onpolicy CONFIG STEPS FLOW...]
#                           [compare PRESET[:LAYERS],... REPS BUILD,...]
#                           [ncustep FLOW PRESET [LAYERS]] [ncudecode FLOW PRESET BATCH]
#                           [ncustalls FLOW PRESET BATCH KERNEL,...]
# ncustep: one training step's kernels timed alone by Nsight Compute (device time
# without the bench's event brackets), summed per kernel by bench/ncu_step.py.
# ncudecode: a short rollout's kernels (prompt 128, 16 new tokens), the decode
# graph's nodes included, summed per kernel by bench/ncu_kernels.py (prefill too:
# the decode step's kernels are the ones launched once a layer a step).
# ncustalls: one decode-step launch of each named kernel (a graph node, past the first
# steps) profiled with `--set full`: its stall reasons and hottest SASS lines
# (bench/ncu_stalls.py); the reports stay in $OUT for the Nsight Compute GUI.
# compare: each build (a binary in .carry: jetd, jetd-prev, ...) benched REPS times,
# the builds interleaved, on each shape, with JET_BENCH_ARGS (e.g. "--train-steps 0
# --batch 64,256"); reports in $OUT/cmp, then bench/compare_builds.py's table.
# Logs go to $OUT (or ./gpu-logs); the summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--collect" ]]; then
  mkdir -p .carry
  latest() { ls -t target/debug/deps/$1-* | grep -v '\.d$' | head -1; }
  for t in cuda_act cuda_flash cuda_invariant cuda_parity gpu_parity; do cp "$(latest $t)" .carry/$t; done
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
      for t in cuda_act cuda_flash cuda_invariant cuda_parity gpu_parity; do
        ./.carry/$t --test-threads=1 --nocapture >"$LOG/$t.log" 2>&1
        rc=$?
        SUMMARY+=("test $t: rc $rc, $(grep -E '^test result' "$LOG/$t.log" | tail -1)")
      done
      grep -hE '^(PARITY|MISMATCH|INVARIANT)' "$LOG"/cuda_act.log "$LOG"/cuda_flash.log "$LOG"/cuda_invariant.log "$LOG"/gpu_parity.log | cut -c1-150
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
    sft)
      # The SFT warm-up of CONFIG alone (no RL steps), saved under ./runs for the
      # stage-two configs that start from it (qwen3-0.6b-longhorizon-rl.toml).
      cfg=$2; shift 2
      name="sft-$(basename "$cfg" .toml)"
      ./.carry/jetd run "$cfg" --steps 0 --data-dir runs --metrics-out "$LOG/$name.jsonl" >"$LOG/$name.log" 2>&1
      SUMMARY+=("$name: rc $?, $(grep -E '^sft' "$LOG/$name.log" | tail -1)")
      ;;
    onpolicy)
      # A real run per flow; prints each RL step's mismatch (0 = bitwise on-policy).
      cfg=$2; steps=$3; shift 3
      while [[ $# -gt 0 && "$1" =~ ^(fp8|bf16|bf16-fp8rollout|f32)$ ]]; do
        flow=$1; shift
        name="onpolicy-$(basename "$cfg" .toml)-$flow"
        ./.carry/jetd run "$cfg" --flow "$flow" --steps "$steps" --data-dir "/tmp/jet-runs-$flow" \
          --metrics-out "$LOG/$name.jsonl" >"$LOG/$name.log" 2>&1
        SUMMARY+=("$name: rc $?")
        python3 - "$LOG/$name.jsonl" "$flow" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rl = [r for r in rows if r.get("phase") == "rl"]
kl = [r.get("mismatch_kl") for r in rl]
dmax = [r.get("mismatch_abs_prob_diff_max") for r in rl]
zero = sum(1 for k, d in zip(kl, dmax) if k == 0 and d == 0)
print(f"ONPOLICY | {sys.argv[2]:<16} | RL steps {len(rl)} | mismatch exactly 0 at {zero} | max mismatch_kl {max(kl or [0]):.3e} | heldout {[r.get('heldout_accuracy') for r in rl if r.get('heldout_accuracy') is not None]}")
PY
      done
      ;;
    ncustep)
      flow=$2; preset=$3; shift 3
      layers=()
      if [[ "${1:-}" =~ ^[0-9]+$ ]]; then layers=(--layers "$1"); shift; fi
      name="ncu-step-$flow-$preset${layers[1]:+-${layers[1]}l}"
      # Warm the kernel cache outside ncu, then trace through the first update.
      ./.carry/jetd bench --device cuda --json --no-kernels --no-cublaslt --flow "$flow" --preset "$preset" \
        "${layers[@]}" --batch 1 --gen-len 2 --prompt-len 16 --train-steps 1 >/dev/null 2>&1
      ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
        --launch-count 6000 --log-file "$LOG/$name.csv" \
        ./.carry/jetd bench --device cuda --json --no-kernels --no-cublaslt --flow "$flow" --preset "$preset" \
        "${layers[@]}" --batch 1 --gen-len 2 --prompt-len 16 --train-steps 1 >/dev/null 2>"$LOG/$name.err"
      SUMMARY+=("$name: rc $?")
      python3 bench/ncu_step.py "$LOG/$name.csv" | tee "$LOG/$name.txt"
      ;;
    ncudecode)
      flow=$2; preset=$3; batch=$4; shift 4
      name="ncu-decode-$flow-$preset-b$batch"
      args=(bench --device cuda --json --no-kernels --no-cublaslt --flow "$flow" --preset "$preset"
        --batch "$batch" --prompt-len 128 --gen-len 16 --train-steps 0)
      ./.carry/jetd "${args[@]}" >/dev/null 2>&1  # warm the kernel cache outside ncu
      ncu --graph-profiling node --clock-control none --cache-control none --metrics gpu__time_duration.sum \
        --csv --print-units base --launch-count 9000 --log-file "$LOG/$name.csv" \
        ./.carry/jetd "${args[@]}" >/dev/null 2>"$LOG/$name.err"
      SUMMARY+=("$name: rc $?")
      python3 bench/ncu_kernels.py "$LOG/$name.csv" | tee "$LOG/$name.txt"
      ;;
    ncustalls)
      flow=$2; preset=$3; batch=$4; IFS=, read -ra kernels <<<"$5"; shift 5
      args=(bench --device cuda --json --no-kernels --no-cublaslt --flow "$flow" --preset "$preset"
        --batch "$batch" --prompt-len 128 --gen-len 16 --train-steps 0)
      ./.carry/jetd "${args[@]}" >/dev/null 2>&1  # warm the kernel cache outside ncu
      for k in "${kernels[@]}"; do
        name="ncu-stalls-$k-$flow-$preset-b$batch"
        ncu --graph-profiling node --set full --import-source no -k "regex:^$k\$" --launch-skip 300 \
          --launch-count 1 -o "$LOG/$name" -f ./.carry/jetd "${args[@]}" >"$LOG/$name.log" 2>&1
        SUMMARY+=("$name: rc $?")
        ncu -i "$LOG/$name.ncu-rep" --page raw --csv >"$LOG/$name-raw.csv" 2>>"$LOG/$name.log"
        ncu -i "$LOG/$name.ncu-rep" --page source --print-source sass --csv >"$LOG/$name-src.csv" 2>>"$LOG/$name.log"
        echo "== $k ($flow, $preset, batch $batch)" | tee "$LOG/$name.txt"
        python3 bench/ncu_stalls.py "$LOG/$name-raw.csv" "$LOG/$name-src.csv" | tee -a "$LOG/$name.txt"
      done
      ;;
    compare)
      IFS=, read -ra shapes <<<"$2"; reps=$3; IFS=, read -ra builds <<<"$4"; shift 4
      mkdir -p "$LOG/cmp"
      for rep in $(seq 1 "$reps"); do
        for shape in "${shapes[@]}"; do
          preset=${shape%%:*}; layers=(); tag=$preset
          if [[ $shape == *:* ]]; then layers=(--layers "${shape#*:}"); tag="$preset-${shape#*:}l"; fi
          tag=${tag//-/_}
          for b in "${builds[@]}"; do
            ./.carry/$b bench --device cuda --json --no-kernels --no-cublaslt --preset "$preset" \
              "${layers[@]}" ${JET_BENCH_ARGS:-} >"$LOG/cmp/$tag-${b//-/_}-$rep.json" 2>"$LOG/cmp/$tag-${b//-/_}-$rep.err"
            SUMMARY+=("compare $tag ${b} rep $rep: rc $?")
          done
        done
      done
      python3 bench/compare_builds.py "$LOG/cmp" "${builds[@]//-/_}" | tee "$LOG/compare.txt"
      ;;
    *) echo "unknown step $1"; exit 2 ;;
  esac
done
printf '%s\n' "${SUMMARY[@]}"
