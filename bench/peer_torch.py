#!/usr/bin/env python3
"""Same-run PyTorch peer for Jet's `jetd bench` (the "PyTorch" column of BENCHMARKS.md).

Measures plain Hugging Face transformers (eager attention, BF16 weights, no
compile, no fused kernels) on the same Qwen3 shapes and the same workload as
`jetd bench`, on the same GPU, so Jet's FP8 numbers sit next to a baseline that
anyone can reproduce with stock libraries:

  rollout  model.generate() with sampling (temperature 1, no top-k/top-p) over
           random prompts [B, prompt_len], exactly gen_len new tokens per row
           (EOS disabled); generated tokens/s, prefill included. Decode-only
           tokens/s subtracts a max_new_tokens=1 run (prefill + first token).
  train    forward with labels (HF causal-LM loss), backward, AdamW step on
           [train_seqs, train_len] random ids; tokens/s and seconds per step.
           Pure-BF16 AdamW (optimizer state in the parameter dtype, no master
           weights), no gradient checkpointing.

Peers (--peer): `eager` is the above; `sdpa` uses PyTorch's scaled_dot_product_attention
(the transformers default) and fused AdamW; `compile` is `sdpa` with the training
step's model under torch.compile (rollout stays uncompiled). `--attn-bench` times
causal SDPA alone (FlashAttention-2 and cuDNN backends) at B x 16 x L, d 128.

`--master f32` keeps the parameters and AdamW's state in f32 and runs the
forward and backward under BF16 autocast (GEMMs in BF16, norms and the loss in
f32): the numerics Jet's `bf16` flow keeps (f32 master weights and optimizer
state), where the default `bf16` master reads and writes half the optimizer
bytes (it is meant for training: with rollout, generation also runs on the f32
weights under autocast). `--profile` runs one more training step under torch.profiler and reports
its GPU kernel time by class (gemm, attention, optimizer, loss, elementwise) and
its top kernels, the classes `jetd bench` reports for Jet's step.

Peak CUDA memory is reported per phase. Models are built from configs with
random weights: nothing is downloaded (throughput does not depend on weights).
"""
import argparse, contextlib, gc, json, platform, sys, time

import torch
import transformers

PRESETS = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
}
COMMON = dict(head_dim=128, vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6,
              max_position_embeddings=4096, use_cache=True,
              bos_token_id=None, eos_token_id=None)
OOM = (getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError,)


def build_model(args):
    kw = dict(COMMON, **PRESETS[args.preset])
    if args.layers:
        kw["num_hidden_layers"] = args.layers
    cfg = transformers.Qwen3Config(**kw)  # rope_theta -> rope_parameters in transformers 5
    auto = transformers.AutoModelForCausalLM
    attn = "eager" if args.peer == "eager" else "sdpa"
    dtype = torch.float32 if args.master == "f32" else torch.bfloat16
    try:  # transformers >= 4.56 / 5.x spell it dtype=
        model = auto.from_config(cfg, attn_implementation=attn, dtype=dtype)
    except TypeError:
        model = auto.from_config(cfg, attn_implementation=attn, torch_dtype=dtype)
    model = model.to(device=args.device, dtype=dtype)
    gc_ = model.generation_config  # never stop early, never pad
    gc_.eos_token_id, gc_.bos_token_id, gc_.pad_token_id = None, None, 0
    return model, cfg


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def reset_peak(dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


def peak_gib(dev):
    if dev.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(dev) / 2**30, 3)


def generate(model, ids, new_tokens):
    return model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
        min_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
        use_cache=True, eos_token_id=None, pad_token_id=0)


def autocast(args, dev):
    """BF16 autocast over f32 master weights (`--master f32`), else nothing."""
    if args.master == "f32":
        return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# Kernel classes of a profiled step, first match wins (attention before gemm:
# CUTLASS's FMHA kernels name cutlass too). Meant for the sdpa and compile peers: in
# the eager peer attention's own softmax lands in "loss".
KERNEL_CLASSES = [
    ("copy", ("memset", "memcpy")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "_attn")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "splitkreduce", "sm90_", "sm80_")),
    ("optimizer", ("adam", "multi_tensor")),
    ("loss", ("cross_entropy", "nll_loss", "log_softmax", "softmax")),
]


def kernel_class(name):
    low = name.lower()
    for cls, keys in KERNEL_CLASSES:
        if any(k in low for k in keys):
            return cls
    return "elementwise"


def profile_step(dev, step):
    """One step under torch.profiler: GPU kernel seconds by class, the top
    kernels, and the span from the first kernel's start to the last's end."""
    from torch.profiler import ProfilerActivity, profile
    sync(dev)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        sync(dev)
    classes, kernels, t0, t1 = {}, {}, None, None
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = e.time_range.elapsed_us()
        t0 = e.time_range.start if t0 is None else min(t0, e.time_range.start)
        t1 = e.time_range.end if t1 is None else max(t1, e.time_range.end)
        cls = kernel_class(e.name)
        classes[cls] = classes.get(cls, 0.0) + us / 1e6
        n, k = kernels.get(e.name, (0, 0.0))
        kernels[e.name] = (n + 1, k + us / 1e6)
    top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:15]
    return dict(kernel_s=round(sum(classes.values()), 6),
                span_s=round(((t1 or 0) - (t0 or 0)) / 1e6, 6),
                classes={c: round(v, 6) for c, v in sorted(classes.items(), key=lambda kv: -kv[1])},
                top=[dict(name=n[:100], launches=c, s=round(t, 6), cls=kernel_class(n))
                     for n, (c, t) in top])


def timed(dev, fn):
    sync(dev)
    t0 = time.perf_counter()
    out = fn()
    sync(dev)
    return time.perf_counter() - t0, out


def bench_rollout(model, cfg, args, dev, batch):
    model.eval()
    reset_peak(dev)
    try:
        ids = torch.randint(1, cfg.vocab_size, (batch, args.prompt_len), device=dev)
        for _ in range(max(args.warmup, 1)):
            generate(model, ids, min(8, args.gen_len))
        t_first, _ = timed(dev, lambda: generate(model, ids, 1))
        secs, out = timed(dev, lambda: generate(model, ids, args.gen_len))
        assert out.shape == (batch, args.prompt_len + args.gen_len), tuple(out.shape)
        res = dict(batch=batch, prompt_len=args.prompt_len, gen_len=args.gen_len,
                   tokens_per_s=round(batch * args.gen_len / secs, 2), seconds=round(secs, 4),
                   peak_gib=peak_gib(dev))
        if args.gen_len > 1 and secs > t_first:
            res["decode_tokens_per_s"] = round(batch * (args.gen_len - 1) / (secs - t_first), 2)
            res["prefill_s"] = round(t_first, 4)
        return res
    except OOM:
        return dict(batch=batch, prompt_len=args.prompt_len, gen_len=args.gen_len,
                    error="out of memory")
    finally:
        reset_peak(dev)


def bench_train(model, cfg, args, dev):
    model.train()
    reset_peak(dev)
    res = dict(seqs=args.train_seqs, len=args.train_len, steps=args.train_steps)
    opt = None
    try:
        fused = args.peer != "eager" and dev.type == "cuda"
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=fused or None)
        ids = torch.randint(1, cfg.vocab_size, (args.train_seqs, args.train_len), device=dev)
        fwd = torch.compile(model) if args.peer == "compile" else model

        def step():
            with autocast(args, dev):
                loss = fwd(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        for _ in range(args.warmup):
            step()
        secs, loss = timed(dev, lambda: [step() for _ in range(args.train_steps)][-1])
        toks = args.train_seqs * args.train_len * args.train_steps
        res.update(tokens_per_s=round(toks / secs, 2), step_s=round(secs / args.train_steps, 4),
                   loss=round(float(loss), 4), peak_gib=peak_gib(dev))
        if args.profile and dev.type == "cuda":
            res["profile"] = profile_step(dev, step)
    except OOM:
        res["error"] = "out of memory"
    finally:
        model.zero_grad(set_to_none=True)
        del opt
        reset_peak(dev)
    return res


def attn_bench(args):
    """Causal SDPA, B x 16 heads x L, d 128, BF16: forward and forward+backward
    TFLOP/s (4 B H L^2 d / 2 forward, 3.5x that forward+backward), median of 20."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    dev = torch.device(args.device)
    rows = []
    for (b, l) in [(8, 512), (4, 2048)]:
        q, k, v = (torch.randn(b, 16, l, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        g = torch.randn_like(q)
        flops = 2.0 * b * 16 * l * l * 128
        for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]:
            try:
                with sdpa_kernel(be):
                    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    both = lambda: torch.autograd.grad(fwd(), (q, k, v), g)
                    ts = []
                    for fn in (fwd, both):
                        for _ in range(3):
                            fn()
                        t = []
                        for _ in range(20):
                            a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                            a.record(); fn(); e.record(); e.synchronize()
                            t.append(a.elapsed_time(e) / 1e3)
                        ts.append(sorted(t)[len(t) // 2])
                rows.append(dict(shape=f"{b}x16x{l}", backend=name, fwd_s=ts[0], fwd_bwd_s=ts[1],
                                 fwd_tflops=round(flops / ts[0] / 1e12, 1),
                                 fwd_bwd_tflops=round(3.5 * flops / ts[1] / 1e12, 1)))
            except RuntimeError as e:
                rows.append(dict(shape=f"{b}x16x{l}", backend=name, error=str(e)[:80]))
    print(f"# causal SDPA, d 128, BF16, torch {torch.__version__}, {torch.cuda.get_device_name(dev)}")
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:<12} {r['backend']:<6} {r['error']}")
        else:
            print(f"{r['shape']:<12} {r['backend']:<6} fwd {r['fwd_tflops']:>6} TFLOP/s  "
                  f"fwd+bwd {r['fwd_bwd_tflops']:>6} TFLOP/s")
    if args.json:
        print(json.dumps({"peer": "sdpa-attention", "rows": rows}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="qwen3-0.6b")
    p.add_argument("--layers", type=int, default=0, help="override layer count")
    p.add_argument("--batch", default="64,256", help="comma list of rollout batch sizes")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=128)
    p.add_argument("--train-seqs", type=int, default=8)
    p.add_argument("--train-len", type=int, default=512)
    p.add_argument("--train-steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peer", choices=["eager", "sdpa", "compile"], default="eager")
    p.add_argument("--no-rollout", action="store_true", help="time training only")
    p.add_argument("--master", choices=["bf16", "f32"], default="bf16",
                   help="parameters and AdamW state in BF16 (default) or f32 under BF16 autocast")
    p.add_argument("--profile", action="store_true",
                   help="profile one more training step: GPU kernel time by class")
    p.add_argument("--attn-bench", action="store_true",
                   help="time causal SDPA alone (FA2 and cuDNN backends) and exit")
    args = p.parse_args()
    if args.attn_bench:
        return attn_bench(args)
    batches = [int(b) for b in args.batch.split(",") if b.strip()]
    transformers.logging.set_verbosity_error()
    dev = torch.device(args.device)
    if dev.type == "cuda":
        dev = torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
    torch.manual_seed(args.seed)

    model, cfg = build_model(args)
    with autocast(args, dev):
        rollout = [] if args.no_rollout else [bench_rollout(model, cfg, args, dev, b) for b in batches]
    train = bench_train(model, cfg, args, dev)

    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.processor() or "cpu")
    master = "bf16" if args.master == "bf16" else "amp-f32master"
    result = {"peer": f"pytorch-{args.peer}-{master}", "master": args.master, "torch": torch.__version__,
              "transformers": transformers.__version__, "device": name, "preset": args.preset,
              "layers": cfg.num_hidden_layers, "rollout": rollout, "train": train}

    f = lambda v: "-" if v is None else (f"{v:,.1f}" if isinstance(v, float) else str(v))
    print(f"# PyTorch peer: {args.preset} ({cfg.num_hidden_layers} layers), {args.peer} {master}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}, {name}")
    print(f"{'phase':<8} {'batch':>6} {'shape':>10} {'tok/s':>12} {'decode tok/s':>13} "
          f"{'seconds':>9} {'peak GiB':>9}")
    for r in rollout:
        shape = f"{r['prompt_len']}+{r['gen_len']}"
        if "error" in r:
            print(f"{'rollout':<8} {r['batch']:>6} {shape:>10} {r['error']:>12}")
            continue
        print(f"{'rollout':<8} {r['batch']:>6} {shape:>10} {f(r['tokens_per_s']):>12} "
              f"{f(r.get('decode_tokens_per_s')):>13} {r['seconds']:>9.3f} {f(r['peak_gib']):>9}")
    shape = f"x{train['len']}"
    if "error" in train:
        print(f"{'train':<8} {train['seqs']:>6} {shape:>10} {train['error']:>12}")
    else:
        print(f"{'train':<8} {train['seqs']:>6} {shape:>10} {f(train['tokens_per_s']):>12} "
              f"{'-':>13} {train['step_s']:>9.3f} {f(train['peak_gib']):>9}  (s/step)")
        prof = train.get("profile")
        if prof:
            print(f"# profiled step: kernels {prof['kernel_s'] * 1e3:.2f} ms in a "
                  f"{prof['span_s'] * 1e3:.2f} ms span")
            for c, v in prof["classes"].items():
                print(f"class    {c:<12} {v * 1e3:>9.3f} ms")
            for k in prof["top"]:
                print(f"kernel   {k['s'] * 1e3:>9.3f} ms {k['launches']:>5}x {k['cls']:<11} {k['name'][:70]}")
    if args.json:
        print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
