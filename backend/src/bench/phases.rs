//! The RL phases on random weights: rollout tokens/s per flow and batch size,
//! training tokens/s per flow, and one GRPO-shaped step split into rollout /
//! train / other. Wall clock around synchronized phases, as a run sees them.

use std::sync::Arc;
use std::time::Instant;

use jet_kernels::cuda::ops::GpuRope;
use jet_kernels::cuda::{Gpu, Result};
use jet_kernels::Flow;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::eos::{EosAt, EOS};
use super::{mem_used_gib, BenchArgs, Report};
use crate::gpu::decode::GpuKvCache;
use crate::gpu::micro::{grad_hold_for, micro_tokens, PassKind};
use crate::gpu::{
    run_pass_gpu_queued, GpuAdam, GpuDecoder, GpuGrads, GpuModel, GpuWeights, PreparedParts,
};
use crate::model::ModelConfig;
use crate::rl::optim::{OptimConfig, Schedule};
use crate::rollout::engine::{generate_with, GenConfig, Sample};
use crate::rollout::sampler::SamplingParams;
use crate::trainer::pass::{micro_batches, Micro, TrainSeq};
use crate::trainer::pass_loss::PassLoss;
use crate::transformer::rope_table;

#[derive(Serialize)]
pub struct RolloutRow {
    pub flow: String,
    /// Prompts (one sample each).
    pub batch: usize,
    /// Most sequences live at once (0: all); with --eos-random, responses end at
    /// random lengths in 1..=gen_len.
    pub max_batch: usize,
    pub eos_random: bool,
    /// Tokens generated, forward passes (decode steps and prefills: one weight
    /// read each), and the KV-cache rows the generated tokens read (the floor).
    pub tokens: usize,
    pub steps: usize,
    pub kv_rows: usize,
    pub seconds: f64,
    pub tokens_per_s: f64,
    pub vs_bf16: f64,
    pub peak_gib: f64,
    /// The same rollout again with device time per category (see TrainRow).
    pub breakdown: Vec<(String, f64)>,
    pub top_kernels: Vec<(String, f64, usize)>,
    /// That rollout's idle stream time (see TrainRow).
    pub idle_before: Vec<(String, f64, usize)>,
    /// The decode floor: every step reads the weights once in the flow's rollout
    /// precision (2 bytes a parameter in BF16, 1 in FP8, the embedding table only
    /// where it is the LM head) and each sequence's KV cache (BF16 for the
    /// tensor-core attention, f32 for the per-row kernels), at the measured copy
    /// bandwidth; a prefill counted as one weight read (its attention and GEMM
    /// work not at all). None without --no-kernels' copy figure.
    pub floor_s: Option<f64>,
    /// floor_s / seconds.
    pub of_floor: Option<f64>,
    /// The prefill calls' seconds (each between two synchronisations; the
    /// first waits for a decode step still queued, which with --max-batch
    /// refills holds the host back and lengthens `seconds` a little) and the
    /// decode phase's: the rest of the rollout (decode steps, sampling with the
    /// first tokens' draw from the prefills' logits, the host's turns between
    /// steps), with the tokens those steps made.
    pub prefill_s: f64,
    pub decode_s: f64,
    pub decode_tokens_per_s: f64,
    /// Prefill calls, tokens made by decode steps, and the cache rows those read.
    pub prefills: usize,
    pub decode_tokens: usize,
    pub decode_kv_rows: usize,
    /// The floor of the decode steps alone (their weight reads and the cache
    /// rows their tokens read, as floor_s) and its share of decode_s: the
    /// issue's "decode tokens/s against the step floor". None as floor_s.
    pub decode_floor_s: Option<f64>,
    pub decode_of_floor: Option<f64>,
    /// Samples a prompt (`--group-size`) and the KV cache's bound (0: room for
    /// every live sequence at full length).
    pub group_size: usize,
    pub kv_cache_gib: f64,
    #[serde(flatten)]
    pub kv: KvCounts,
    #[serde(flatten)]
    pub graphs: GraphCounts,
}

/// The paged KV cache over a rollout.
#[derive(Clone, Copy, Default, Serialize)]
pub struct KvCounts {
    /// Most pages in use, pages in the pool (the scratch page aside), and a
    /// page's bytes over every layer's k and v.
    pub kv_pages_peak: usize,
    pub kv_pages: usize,
    pub kv_page_bytes: usize,
    /// Prompt rows the prefills computed (a repeated prompt's once) and asked for.
    pub prefill_rows: usize,
    pub prefill_rows_asked: usize,
    /// Sequences preempted (prefilled again later) for want of pages.
    pub preempted: usize,
}

#[derive(Serialize)]
pub struct TrainRow {
    pub flow: String,
    pub tokens_per_s: f64,
    /// The mean of the timed updates (`--train-steps`), which `tokens_per_s` is
    /// made from.
    pub step_s: f64,
    /// Each timed update's seconds, in order, and their median: one slow update
    /// (a host hiccup) moves the mean, not the median.
    pub steps_s: Vec<f64>,
    pub step_median_s: f64,
    /// Micro-batches (of `--train-seqs` sequences) an update: each timed update
    /// runs them all, then one AdamW step; `tokens_per_s` counts all their tokens.
    pub micro_batches: usize,
    /// Tokens a micro-batch holds at most (`--train-tokens`, `auto` resolved for
    /// this GPU; 0: no bound).
    pub micro_tokens: usize,
    /// Whether each update prepares the weights (BF16 copies / FP8 blocks)
    /// afresh: false where AdamW rewrites the prepared copies from the new values.
    pub prepares: bool,
    /// Parts of a step, each timed alone after a sync: weight preparation
    /// (BF16 copies / FP8 blocks), one micro-batch's forward with activations
    /// kept, AdamW. The rest of `step_s` is the loss and the backward.
    pub prepare_s: f64,
    pub forward_s: f64,
    pub optimizer_s: f64,
    pub vs_bf16: f64,
    /// The same ratio from the median updates (bf16's median step over this
    /// flow's): one slow update in either flow moves `vs_bf16`, not this.
    pub vs_bf16_median: f64,
    pub peak_gib: f64,
    /// The step's floor: 6 x params x tokens FLOPs at the best GEMM rate
    /// measured for the flow's training precision, plus AdamW's bytes (28 per
    /// parameter: w, g, m, v read; w, m, v written) at the measured copy
    /// bandwidth. None when the GEMMs were not measured (--no-kernels).
    pub floor_s: Option<f64>,
    /// floor_s / step_s.
    pub of_floor: Option<f64>,
    /// One more update with every launch bracketed by events (`cuda::profile`):
    /// device seconds per category ("gemm", "attention", "elementwise", "loss",
    /// "quantize", "optimizer"), then "other" = that update's wall time minus
    /// their sum (copies, host work, synchronisation).
    pub breakdown: Vec<(String, f64)>,
    /// The ten kernels of that update with the most device time: (name, s, calls).
    pub top_kernels: Vec<(String, f64, usize)>,
    /// Where that update's stream sat idle, waiting for the host: the gaps between
    /// one launch's end and the next one's start, per the kernel launched after
    /// them (name, s, gaps), largest first; "(before the first launch)": the gap
    /// between the update's start and its first launch.
    pub idle_before: Vec<(String, f64, usize)>,
}

#[derive(Serialize)]
pub struct StepRow {
    pub flow: String,
    pub batch: usize,
    pub total_s: f64,
    pub rollout_s: f64,
    pub train_s: f64,
    pub other_s: f64,
    pub vs_bf16: f64,
    /// The flow's first step (it captures the decode graphs and prepares the
    /// copies the second reuses).
    pub first_total_s: f64,
    pub first_rollout_s: f64,
    /// The training phase's micro-batches (`--step-micro-seqs` sequences and
    /// `--step-micro-tokens` tokens at most: a run's defaults unless set) and
    /// their token bound (0: none).
    pub micro_batches: usize,
    pub micro_tokens: usize,
    /// A third step's training phase under the profiler: its 30 costliest kernels
    /// (name, seconds, launches), largest first.
    pub train_top_kernels: Vec<(String, f64, usize)>,
    /// The same phase's 15 largest sums of the stream's idle time, by the kernel
    /// launched after it (the host late), as the train rows' `idle_before`.
    pub train_idle_before: Vec<(String, f64, usize)>,
}

/// A flow as benchmarked: `bf16` and `fp8` run batch-invariant (as runs do by
/// default) and again as `bf16-cublaslt` / `fp8-cublaslt`, their forward GEMMs
/// through cuBLASLt (`run.batch_invariant = false`), so the cost of bitwise
/// rollout/training agreement is in every report. A row's `vs_bf16` is against
/// the bf16 row of the same mode.
#[derive(Clone, Copy)]
pub struct Variant {
    pub flow: Flow,
    pub invariant: bool,
}

impl Variant {
    pub const CUBLASLT_SUFFIX: &'static str = "-cublaslt";

    /// The flows' variants: each flow, and `bf16` and `fp8` also with cuBLASLt's
    /// forward.
    pub fn of(flows: &[Flow]) -> Vec<Variant> {
        let mut v = Vec::new();
        for &flow in flows {
            v.push(Variant {
                flow,
                invariant: true,
            });
            if matches!(flow, Flow::Bf16 | Flow::Fp8) {
                v.push(Variant {
                    flow,
                    invariant: false,
                });
            }
        }
        v
    }

    pub fn name(&self) -> String {
        match self.invariant {
            true => self.flow.name().to_string(),
            false => format!("{}{}", self.flow.name(), Self::CUBLASLT_SUFFIX),
        }
    }

    /// The flow named by a report row (`fp8-cublaslt` is the `fp8` flow).
    pub fn flow_of(name: &str) -> Option<Flow> {
        name.trim_end_matches(Self::CUBLASLT_SUFFIX).parse().ok()
    }

    fn model<'w>(
        &self,
        g: &Arc<Gpu>,
        cfg: &'w ModelConfig,
        w: &'w GpuWeights,
        rope: &Arc<GpuRope>,
    ) -> Result<GpuModel<'w>> {
        let mut m = GpuModel::with_rope(g, cfg, w, self.flow, rope.clone())?;
        m.set_batch_invariant(self.invariant);
        Ok(m)
    }
}

fn opt_cfg() -> OptimConfig {
    OptimConfig {
        lr: 1e-6,
        warmup_steps: 0,
        schedule: Schedule::Constant,
        min_lr_ratio: 1.0,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        grad_clip: 1.0,
    }
}

fn prompts(cfg: &ModelConfig, n: usize, len: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            (0..len)
                .map(|_| r.random_range(0..cfg.vocab_size as u32))
                .collect()
        })
        .collect()
}

/// What a timed rollout did: forward passes, tokens generated, and the KV-cache
/// rows those tokens read; of them the prefills (and their seconds), the tokens
/// decode steps made and the rows those read (see `eos::EosAt`).
#[derive(Clone, Copy, Default)]
pub struct RolloutCounts {
    pub steps: usize,
    pub tokens: usize,
    pub kv_rows: usize,
    pub prefills: usize,
    pub prefill_s: f64,
    pub decode_tokens: usize,
    pub decode_kv_rows: usize,
    pub kv: KvCounts,
    pub graphs: GraphCounts,
}

/// A rollout's decode graphs and steps ahead.
#[derive(Clone, Copy, Default, Serialize)]
pub struct GraphCounts {
    /// Decode graphs the rollout captured, and those it adopted from the
    /// rollout before it (the same model: `gpu::kept`; adopted graphs of buckets
    /// this rollout never reached are counted too).
    pub graphs_captured: usize,
    pub graphs_reused: usize,
    /// Decode steps launched ahead of the host and kept.
    pub steps_kept_ahead: usize,
}

/// Generate up to `gen_len` tokens for each prompt (`--group-size` samples of
/// each), timed: `--max-batch` bounds
/// the live sequences, `--eos-random` ends each at a random length.
fn rollout(
    model: &GpuModel,
    prompts: &[Vec<u32>],
    gen_len: usize,
    a: &BenchArgs,
    rng: &mut dyn RngCore,
) -> Result<(Vec<Sample>, f64, RolloutCounts)> {
    let gen = GenConfig {
        max_new_tokens: gen_len,
        sampling: SamplingParams {
            top_k: a.top_k,
            top_p: a.top_p,
            ..SamplingParams::default()
        },
        stop_token_ids: vec![EOS],
        stop_strings: vec![],
        max_batch: a.max_batch,
    };
    let bytes = crate::config::gib_bytes(a.kv_cache_gib);
    let mut dec = GpuDecoder::new(model)
        .with_graphs(!a.no_cuda_graphs)
        .with_kv_cache_bytes(bytes);
    let sync = || model.gpu.sync();
    let mut eos = EosAt::new(&mut dec, gen_len, a.eos_random.then_some(gen_len as u64))
        .timing_prefills(&sync);
    let t = Instant::now();
    let s = generate_with(
        &mut eos,
        model.cfg.max_position_embeddings,
        prompts,
        a.group_size,
        &gen,
        &|_| String::new(),
        rng,
    )?;
    model.gpu.sync()?;
    let seconds = t.elapsed().as_secs_f64();
    let mut counts = RolloutCounts {
        steps: eos.steps,
        tokens: eos.tokens,
        kv_rows: eos.kv_rows,
        prefills: eos.prefills,
        prefill_s: eos.prefill_s,
        decode_tokens: eos.decode_tokens,
        decode_kv_rows: eos.decode_kv_rows,
        kv: KvCounts {
            preempted: eos.preempted,
            kv_page_bytes: GpuKvCache::page_bytes(model),
            ..Default::default()
        },
        graphs: GraphCounts::default(),
    };
    let gc = &mut counts.graphs;
    (gc.graphs_captured, gc.graphs_reused) = dec.graphs_captured();
    gc.steps_kept_ahead = dec.steps_kept_ahead();
    if let Some(u) = dec.kv_use() {
        let kv = &mut counts.kv;
        (kv.kv_pages_peak, kv.kv_pages) = (u.pages_peak, u.pages);
        (kv.prefill_rows, kv.prefill_rows_asked) = (u.prefill_rows, u.prefill_rows_asked);
    }
    Ok((s, seconds, counts))
}

/// One update over `seqs` (forward, a loss of -mean logp, backward, AdamW), timed;
/// returns the prepared parts when AdamW rewrote them for the new weights (BF16
/// copies, FP8 blocks: every flow), for the next update to reuse as the trainer does.
#[allow(clippy::too_many_arguments)]
fn train(
    g: &std::sync::Arc<Gpu>,
    cfg: &ModelConfig,
    w: &mut GpuWeights,
    grads: &mut GpuGrads,
    adam: &mut GpuAdam,
    var: Variant,
    seqs: &[TrainSeq],
    micro: Micro,
    rope: &Arc<GpuRope>,
    prepared: Option<PreparedParts>,
) -> Result<(f64, Option<PreparedParts>)> {
    let t = Instant::now();
    grads.clear();
    // As the trainer: WGrad outputs held as the largest micro-batch leaves room.
    let kind = PassKind::of_seqs(cfg, var.flow, 1.0, var.invariant, seqs);
    grads.hold_cap = Some(grad_hold_for(g, cfg, kind, false, (seqs, micro))?);
    let n: usize = seqs.iter().map(|s| s.response_len()).sum();
    let inv = 1.0 / n.max(1) as f64;
    // On the device: the pass queues its micro-batches without waiting for the host.
    let loss = PassLoss::Const {
        dlogp: -inv,
        dentropy: 0.0,
    };
    let (pending, mut parts) = {
        // As the trainer: the rollout's (or the last update's) prepared weights
        // serve this update.
        let mut model = match prepared {
            Some(p) => GpuModel::reuse(g, cfg, w, p),
            None => var.model(g, cfg, w, rope)?,
        };
        model.set_batch_invariant(var.invariant);
        let pending = run_pass_gpu_queued(&model, seqs, 1.0, micro, Some((loss, &mut *grads)))?;
        // Parts the optimizer cannot rewrite are freed before it runs.
        let mut p = model.into_parts();
        (pending, p.rewritable(&w.ix).then_some(p))
    };
    let (_, rewrote) = adam.step_prepared(g, w, grads, &opt_cfg(), 1e-6, parts.as_mut())?;
    // As the trainer: the scores come down once the optimizer step is queued.
    pending.wait()?;
    g.sync()?;
    Ok((t.elapsed().as_secs_f64(), parts.filter(|_| rewrote)))
}

/// Seconds of the weight preparation, the training forward of `seqs` (one
/// micro-batch) and one AdamW step, each alone.
#[allow(clippy::too_many_arguments)]
fn parts(
    g: &std::sync::Arc<Gpu>,
    cfg: &ModelConfig,
    w: &mut GpuWeights,
    grads: &GpuGrads,
    adam: &mut GpuAdam,
    var: Variant,
    seqs: &[TrainSeq],
    rope: &Arc<GpuRope>,
) -> Result<(f64, f64, f64)> {
    g.sync()?;
    let t = Instant::now();
    let model = var.model(g, cfg, w, rope)?;
    g.sync()?;
    let prepare = t.elapsed().as_secs_f64();
    let refs: Vec<&[u32]> = seqs.iter().map(|s| s.tokens.as_slice()).collect();
    let t = Instant::now();
    let out = crate::gpu::forward::forward(
        &model,
        &refs,
        jet_kernels::GemmRole::TrainForward,
        true,
        true,
    )?;
    g.sync()?;
    let fwd = t.elapsed().as_secs_f64();
    drop(out);
    let mut p = model.into_parts();
    let t = Instant::now();
    adam.step_prepared(g, w, grads, &opt_cfg(), 1e-6, Some(&mut p))?;
    g.sync()?;
    Ok((prepare, fwd, t.elapsed().as_secs_f64()))
}

/// A profile in seconds per category, with "other": `wall` minus their sum.
fn with_other(p: jet_kernels::cuda::profile::Profile, wall: f64) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = p.into_iter().map(|(c, ms)| (c, ms / 1e3)).collect();
    let covered: f64 = out.iter().map(|x| x.1).sum();
    out.push(("other".into(), (wall - covered).max(0.0)));
    out
}

/// The phase's 30 costliest kernels (name, seconds, launches): enough to account
/// for a training step's parts in the JSON (the text table prints 6).
fn top(g: &Gpu) -> Vec<(String, f64, usize)> {
    let mut k = g.profile_kernels();
    k.truncate(30);
    k.into_iter().map(|(n, ms, c)| (n, ms / 1e3, c)).collect()
}

/// The phase's 15 largest idle sums by the kernel after them (name, seconds, gaps).
fn idle(g: &Gpu) -> Vec<(String, f64, usize)> {
    let mut k = g.profile_idle();
    k.truncate(15);
    k.into_iter().map(|(n, ms, c)| (n, ms / 1e3, c)).collect()
}

pub fn run(
    g: &std::sync::Arc<Gpu>,
    cfg: &ModelConfig,
    a: &BenchArgs,
    flows: &[Variant],
    r: &mut Report,
    say: &dyn Fn(&str),
) -> anyhow::Result<()> {
    let mut w = GpuWeights::random(g, cfg, 7)?;
    let mut grads = GpuGrads::zeros_like(g, &w)?;
    let mut adam = GpuAdam {
        m: GpuWeights::zeros_like(g, &w)?,
        v: GpuWeights::zeros_like(g, &w)?,
        t: 0,
    };
    let mut peak = mem_used_gib();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let rope = Arc::new(GpuRope::new(g, &rope_table(cfg))?);

    // Rollout throughput.
    let mut base_roll = std::collections::HashMap::new();
    for &var in flows {
        let flow = var.flow;
        let model = var.model(g, cfg, &w, &rope)?;
        for &b in &a.batch {
            say(&format!("  rollout {} batch {b}", var.name()));
            let ps = prompts(cfg, b / a.group_size, a.prompt_len, b as u64);
            // Warm-up at this batch size: cuBLASLt picks its algorithms for these
            // shapes and the allocator grows to them (behind a 2-prompt warm-up the
            // first flow measured, bf16 at batch 64, once read 6,795 tokens/s
            // against 10,537 in another call). With random lengths it runs them
            // all, so that the timed rollout replays the decode graphs of every
            // bucket it shrinks through, kept from this one, as a run's
            // rollouts after its first do (`gpu::kept`).
            let warm = if a.eos_random {
                a.gen_len
            } else {
                a.gen_len.min(8)
            };
            rollout(&model, &ps, warm, a, &mut rng)?;
            let (_, s, counts) = rollout(&model, &ps, a.gen_len, a, &mut rng)?;
            let used = mem_used_gib();
            peak = peak.max(used);
            let tps = counts.tokens as f64 / s;
            let decode_s = s - counts.prefill_s;
            if flow == Flow::Bf16 {
                base_roll.insert((var.invariant, b), tps);
            }
            g.profile_start()?;
            let (_, wall, _) = rollout(&model, &ps, a.gen_len, a, &mut rng)?;
            let breakdown = with_other(g.profile_stop()?, wall);
            let (top_kernels, idle_before) = (top(g), idle(g));
            r.rollout.push(RolloutRow {
                flow: var.name(),
                batch: b,
                max_batch: a.max_batch,
                eos_random: a.eos_random,
                tokens: counts.tokens,
                steps: counts.steps,
                kv_rows: counts.kv_rows,
                seconds: s,
                tokens_per_s: tps,
                prefill_s: counts.prefill_s,
                decode_s,
                decode_tokens_per_s: counts.decode_tokens as f64 / decode_s,
                vs_bf16: base_roll
                    .get(&(var.invariant, b))
                    .map_or(f64::NAN, |x| tps / x),
                peak_gib: used,
                breakdown,
                top_kernels,
                idle_before,
                floor_s: None,
                of_floor: None,
                prefills: counts.prefills,
                decode_tokens: counts.decode_tokens,
                decode_kv_rows: counts.decode_kv_rows,
                decode_floor_s: None,
                decode_of_floor: None,
                group_size: a.group_size,
                kv_cache_gib: a.kv_cache_gib,
                kv: counts.kv,
                graphs: counts.graphs,
            });
        }
    }

    if a.train_steps == 0 {
        r.peak_mem_gib = peak;
        return Ok(());
    }

    // Training throughput.
    // `auto`: the batch-invariant flows' bound (the -cublaslt twins keep more).
    let kind = PassKind::of(cfg, Flow::Bf16, 1.0, true, a.train_len);
    let tokens = micro_tokens(a.train_tokens, g, cfg, kind, false)?;
    let micro = Micro {
        seqs: a.train_seqs,
        tokens,
    };
    let seqs: Vec<TrainSeq> = prompts(cfg, a.train_seqs * a.train_micro, a.train_len, 99)
        .into_iter()
        .map(|tokens| TrainSeq {
            tokens,
            prompt_len: 1,
        })
        .collect();
    // parts() times one micro-batch's forward: the trainer's first.
    let first = micro_batches(&seqs, micro).first().cloned().unwrap_or(0..0);
    let mut base_train = std::collections::HashMap::new();
    for &var in flows {
        let flow = var.flow;
        say(&format!("  train {}", var.name()));
        // The first update is a warm-up (cuBLASLt picks its algorithms).
        // Each update reuses the parts the last one's AdamW rewrote, if it did.
        let update = |w: &mut GpuWeights,
                      grads: &mut GpuGrads,
                      adam: &mut GpuAdam,
                      kept: &mut Option<PreparedParts>| {
            let (s, p) = train(
                g,
                cfg,
                w,
                grads,
                adam,
                var,
                &seqs,
                micro,
                &rope,
                kept.take(),
            )?;
            *kept = p;
            anyhow::Ok(s)
        };
        let mut kept = None;
        let mut steps_s = Vec::with_capacity(a.train_steps);
        for i in 0..=a.train_steps {
            let s = update(&mut w, &mut grads, &mut adam, &mut kept)?;
            if i > 0 {
                steps_s.push(s);
            }
        }
        let used = mem_used_gib();
        peak = peak.max(used);
        let prepares = kept.is_none();
        let (prepare_s, forward_s, optimizer_s) = parts(
            g,
            cfg,
            &mut w,
            &grads,
            &mut adam,
            var,
            &seqs[first.clone()],
            &rope,
        )?;
        // parts() changed the weights: the profiled update prepares afresh unless
        // its parts are made first, as the timed ones had them.
        kept = kept
            .map(|_| var.model(g, cfg, &w, &rope).map(|m| m.into_parts()))
            .transpose()?;
        g.profile_start()?;
        let wall = update(&mut w, &mut grads, &mut adam, &mut kept)?;
        let breakdown = with_other(g.profile_stop()?, wall);
        let (top_kernels, idle_before) = (top(g), idle(g));
        let step_s = steps_s.iter().sum::<f64>() / a.train_steps as f64;
        let step_median_s = median(&steps_s);
        let tps = (seqs.len() * a.train_len) as f64 / step_s;
        if flow == Flow::Bf16 {
            base_train.insert(var.invariant, (tps, step_median_s));
        }
        let (base, base_median) = base_train
            .get(&var.invariant)
            .copied()
            .unwrap_or((f64::NAN, f64::NAN));
        r.train.push(TrainRow {
            flow: var.name(),
            tokens_per_s: tps,
            step_s,
            steps_s,
            step_median_s,
            micro_batches: a.train_micro,
            micro_tokens: micro.tokens,
            prepares,
            prepare_s,
            forward_s,
            optimizer_s,
            vs_bf16: tps / base,
            vs_bf16_median: base_median / step_median_s,
            peak_gib: used,
            floor_s: None,
            of_floor: None,
            breakdown,
            top_kernels,
            idle_before,
        });
    }

    // GRPO-shaped steps: quantize, roll out the first batch size, train on
    // the samples in micro-batches as a run cuts them by default
    // (`train.micro_batch` sequences, `micro_batch_tokens = "auto"`; the
    // --step-micro-* options), optimizer step. Two a
    // flow, as a run's first and second: the second reuses the copies AdamW
    // rewrote and the decode graphs the first captured (`gpu::kept`), as a
    // run's later steps do; the row is the second, with the first's times. A
    // third step's training phase runs under the profiler (the timed steps do
    // not): its costliest kernels, as the train rows report theirs.
    let b = a.batch[0];
    let mut base_step = std::collections::HashMap::new();
    for &var in flows {
        let flow = var.flow;
        say(&format!("  step {}", var.name()));
        let ps = prompts(cfg, b / a.group_size, a.prompt_len, 5);
        let mut parts: Option<PreparedParts> = None;
        let mut times = Vec::with_capacity(2);
        let (mut train_top_kernels, mut train_idle_before) = (Vec::new(), Vec::new());
        let mut cut = (0, 0);
        for i in 0..3 {
            let profiled = i == 2;
            let t0 = Instant::now();
            let model = match parts.take() {
                Some(p) => {
                    let mut m = GpuModel::reuse(g, cfg, &w, p);
                    m.set_batch_invariant(var.invariant);
                    m
                }
                None => var.model(g, cfg, &w, &rope)?,
            };
            let (samples, roll_s, _) = rollout(&model, &ps, a.gen_len, a, &mut rng)?;
            let prepared = model.into_parts();
            let seqs = TrainSeq::of_samples(&ps, &samples);
            // As the trainer cuts a step's micro-batches (`Trainer::micro`).
            let kind = PassKind::of_seqs(cfg, flow, 1.0, var.invariant, &seqs);
            let step_micro = Micro {
                seqs: a.step_micro_seqs,
                tokens: micro_tokens(a.step_micro_tokens, g, cfg, kind, false)?,
            };
            cut = (micro_batches(&seqs, step_micro).len(), step_micro.tokens);
            if profiled {
                g.profile_start()?;
            }
            let (train_s, rewritten) = train(
                g,
                cfg,
                &mut w,
                &mut grads,
                &mut adam,
                var,
                &seqs,
                step_micro,
                &rope,
                Some(prepared),
            )?;
            parts = rewritten;
            if profiled {
                g.profile_stop()?;
                (train_top_kernels, train_idle_before) = (top(g), idle(g));
            } else {
                times.push((t0.elapsed().as_secs_f64(), roll_s, train_s));
            }
        }
        let ((first, first_roll, _), (total, roll_s, train_s)) = (times[0], times[1]);
        peak = peak.max(mem_used_gib());
        if flow == Flow::Bf16 {
            base_step.insert(var.invariant, total);
        }
        let base = base_step.get(&var.invariant).copied().unwrap_or(f64::NAN);
        r.step.push(StepRow {
            flow: var.name(),
            batch: b,
            total_s: total,
            rollout_s: roll_s,
            train_s,
            other_s: total - roll_s - train_s,
            vs_bf16: base / total,
            first_total_s: first,
            first_rollout_s: first_roll,
            micro_batches: cut.0,
            micro_tokens: cut.1,
            train_top_kernels,
            train_idle_before,
        });
    }
    r.peak_mem_gib = peak;
    Ok(())
}

/// The median of `xs` (the mean of the middle two for an even count; NaN for none).
fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_none() {
        assert_eq!(median(&[0.059, 0.054, 0.054]), 0.054);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
