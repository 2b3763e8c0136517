#!/bin/bash
# Session 40, call 8 (run7.sh with this build): train.micro_batch_tokens = "auto", the per-token estimate per pass kind (qk_pre counted, FP8 at BF16's, f32 activations and probabilities without the tensor-core attention) (the new default: micro-batches
# sized to the GPU's memory by the model's per-token estimate, gpu::micro). The
# whole loop on the GPU with the default (configs/qwen3-0.6b-arith.toml); then the
# GRPO-shaped step of calls 1 and 6 (prompt 128, responses of 1-512 tokens, 8
# samples a prompt, batch 64), where one micro-batch of all 64 sequences ran out
# of memory: --train-tokens auto (jetd-auto) against 16,384 (jetd-t16k).
mkdir -p .carry && tar xJf .carryz/c.tar.xz -C .carry
R=$OUT; export OUT=/tmp/g; mkdir -p $OUT; export JET_KERNEL_CACHE_DIR=/tmp/jetk
pack() { tar czf $R/logs.tgz -C /tmp g; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
timeout 150 .carry/jetd run configs/qwen3-0.6b-arith.toml --device cuda --data-dir /tmp/d-jetd --metrics-out $OUT/run-jetd.jsonl > $OUT/run-jetd.txt 2>&1
echo "run rc $?"
python3 - <<'P'
import json, glob
ms = [json.loads(l) for l in open('/tmp/g/run-jetd.jsonl')] if glob.glob('/tmp/g/run-jetd.jsonl') else []
rl = [m for m in ms if 'mismatch_kl' in json.dumps(m)]
print('metrics lines', len(ms), 'rl lines', len(rl))
for m in rl[:1] + rl[-1:]:
    print({k: m.get(k) for k in ('step', 'heldout_accuracy', 'reward_mean', 'mismatch_kl', 'train_s', 'rollout_s') if k in m})
P
grep -iE "held|error" $OUT/run-jetd.txt | tail -4
pack
JET_BENCH_ARGS="--train-steps 1 --batch 64 --group-size 8 --prompt-len 128 --gen-len 512 --eos-random" bash bench/gpu_check.sh compare qwen3-0.6b,qwen3-8b:4 1 jetd-auto,jetd-t16k > $OUT/main.log 2>&1
pack
python3 bench/compare_builds.py $OUT/cmp jetd_auto jetd_t16k | grep -E 'step' | cut -c1-200
grep -h "micro-batches of" $OUT/cmp/*.err | sort | uniq -c
python3 - <<'P'
import json,glob
for f in sorted(glob.glob('/tmp/g/cmp/*.json')):
    try: d=json.load(open(f))
    except Exception as e: print(f.split('/')[-1], 'ERR', e); continue
    print(f.split("/")[-1], "peak GiB %.1f" % d.get("peak_mem_gib", 0), [(t["flow"], t.get("micro_tokens")) for t in d.get("train", [])][:1])
P
