//! `jetd bench`: the CUDA path measured on random weights of a model shape.
//!
//! Reports GEMM TFLOP/s (BF16 vs FP8 at M = 8192 on the model's projections),
//! the quantizers in GB/s against a device copy, rollout tokens/s per flow at
//! each batch size, training tokens/s per flow, the split of one GRPO-shaped
//! step into rollout / train / other, and peak device memory. Timings are
//! device events (kernels) or wall clock around a synchronized phase (phases).

mod attention;
mod eos;
mod kernels;
mod phases;

use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use jet_kernels::cuda::Gpu;
use jet_kernels::Flow;
use serde::Serialize;

use crate::config::MicroTokens;
use crate::model::{Arch, ModelConfig};

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// cuda (the benchmark measures the GPU path).
    #[arg(long, default_value = "cuda")]
    pub device: String,
    /// Model shape: qwen3-0.6b, qwen3-1.7b or qwen3-8b.
    #[arg(long, default_value = "qwen3-0.6b")]
    pub preset: String,
    /// Number of layers (default: the preset's).
    #[arg(long)]
    pub layers: Option<usize>,
    /// all, or one flow: bf16, bf16-fp8rollout, fp8.
    #[arg(long, default_value = "all")]
    pub flow: String,
    /// Rollout batch sizes, comma-separated.
    #[arg(long, default_value = "64,256", value_delimiter = ',')]
    pub batch: Vec<usize>,
    /// Prompt tokens per rollout sequence.
    #[arg(long, default_value_t = 128)]
    pub prompt_len: usize,
    /// Generated tokens per rollout sequence (the most, with --eos-random).
    #[arg(long, default_value_t = 128)]
    pub gen_len: usize,
    /// End each rollout sequence at a random length in 1..=gen-len, as RL
    /// responses do (random weights never choose EOS themselves).
    #[arg(long)]
    pub eos_random: bool,
    /// Most rollout sequences live at once (continuous batching, as
    /// `rollout.max_batch`); 0: all of --batch.
    #[arg(long, default_value_t = 0)]
    pub max_batch: usize,
    /// Samples per rollout prompt, as a GRPO group: --batch / G distinct
    /// prompts, each drawn G times (the trainer's rollouts); a repeated prompt is
    /// prefilled once and its full KV pages shared.
    #[arg(long, default_value_t = 1)]
    pub group_size: usize,
    /// GiB the rollout's KV cache may take (as `rollout.kv_cache_gib`); 0: room
    /// for every live sequence at full length. Under it sequences wait for room
    /// or are preempted and prefilled again.
    #[arg(long, default_value_t = 0.0)]
    pub kv_cache_gib: f64,
    /// Rollout draws keep the k most likely tokens (as `rollout.top_k`; 0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Rollout draws keep the smallest set of tokens whose probability reaches
    /// top-p (as `rollout.top_p`; 1: all).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Sequences per training micro-batch.
    #[arg(long, default_value_t = 8)]
    pub train_seqs: usize,
    /// Micro-batches of --train-seqs sequences per training update: their
    /// gradients accumulated, then one AdamW step, as an RL update over a step's
    /// samples (one: AdamW's and the weights' per-update costs on every
    /// micro-batch).
    #[arg(long = "train-micro-batches", default_value_t = 1)]
    pub train_micro: usize,
    /// Tokens per training micro-batch at most (as `train.micro_batch_tokens`;
    /// 0: --train-seqs sequences alone bound it; `auto`: sized to the GPU's memory
    /// by the batch-invariant flows' per-token estimate, the same for every flow).
    #[arg(long, default_value = "0", value_parser = <MicroTokens as std::str::FromStr>::from_str)]
    pub train_tokens: MicroTokens,
    /// Tokens per training sequence.
    #[arg(long, default_value_t = 512)]
    pub train_len: usize,
    /// Sequences per training micro-batch in the GRPO-shaped step (as
    /// `train.micro_batch`; the default is a run's).
    #[arg(long, default_value_t = crate::config::DEFAULT_MICRO_BATCH)]
    pub step_micro_seqs: usize,
    /// Tokens per training micro-batch at most in the GRPO-shaped step (as
    /// `train.micro_batch_tokens`; `auto`, a run's default, sizes it to the GPU).
    #[arg(long, default_value = "auto", value_parser = <MicroTokens as std::str::FromStr>::from_str)]
    pub step_micro_tokens: MicroTokens,
    /// Timed training steps per flow (after one warm-up step); 0 measures the
    /// rollout alone (no training and no GRPO-shaped step).
    #[arg(long, default_value_t = 3)]
    pub train_steps: usize,
    /// Measure only the batch-invariant rows (no `-cublaslt` twins).
    #[arg(long)]
    pub no_cublaslt: bool,
    /// Run every rollout decode step's kernels one by one instead of replaying
    /// a CUDA graph (as `run.cuda_graphs = false`).
    #[arg(long)]
    pub no_cuda_graphs: bool,
    /// Skip the kernel section (GEMMs, quantizers).
    #[arg(long)]
    pub no_kernels: bool,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    pub json: bool,
}

/// A Qwen3 shape by name.
pub fn preset(name: &str) -> anyhow::Result<ModelConfig> {
    let (h, i, l, nh, tied) = match name {
        "qwen3-0.6b" => (1024, 3072, 28, 16, true),
        "qwen3-1.7b" => (2048, 6144, 28, 16, true),
        "qwen3-8b" => (4096, 12288, 36, 32, false),
        _ => bail!("--preset {name}: unknown (qwen3-0.6b, qwen3-1.7b, qwen3-8b)"),
    };
    Ok(ModelConfig {
        arch: Arch::Qwen3,
        vocab_size: 151936,
        hidden_size: h,
        intermediate_size: i,
        num_hidden_layers: l,
        num_attention_heads: nh,
        num_key_value_heads: 8,
        head_dim: 128,
        rms_norm_eps: 1e-6,
        rope_theta: 1e6,
        rope_scaling: None,
        max_position_embeddings: 40960,
        tie_word_embeddings: tied,
        attention_bias: false,
        qk_norm: true,
        bos_token_id: None,
        eos_token_ids: vec![],
    })
}

#[derive(Serialize, Default)]
pub struct Report {
    pub device: String,
    pub preset: String,
    pub layers: usize,
    pub params: usize,
    /// Parameters of the embedding table when it is not the LM head.
    pub untied_embedding: usize,
    pub gemm: Vec<kernels::GemmRow>,
    pub quant: Vec<kernels::QuantRow>,
    pub ops: Vec<attention::OpRow>,
    pub rollout: Vec<phases::RolloutRow>,
    pub train: Vec<phases::TrainRow>,
    pub step: Vec<phases::StepRow>,
    /// Most device memory in use (cuMemGetInfo), sampled after each phase.
    pub peak_mem_gib: f64,
    /// Whether rollout decode steps replayed CUDA graphs (`--no-cuda-graphs`).
    pub cuda_graphs: bool,
    /// The rollout draws' truncation (`--top-k`, `--top-p`; 0 and 1: off).
    pub top_k: usize,
    pub top_p: f64,
    /// The cuBLASLt problems whose algorithm was chosen by timing in this run
    /// (`JET_GEMM_TUNE`; none where every choice came from the kernel store).
    pub gemm_tuned: Vec<TunedRow>,
}

/// One cuBLASLt problem's algorithm choice (`jet_kernels::cuda::gemm::Tuned`).
#[derive(Serialize)]
pub struct TunedRow {
    pub problem: String,
    pub candidates: usize,
    /// The heuristic's first pick's time and the chosen one's, microseconds.
    pub first_us: f32,
    pub chosen: usize,
    pub chosen_us: f32,
}

fn flows(arg: &str) -> anyhow::Result<Vec<Flow>> {
    if arg == "all" {
        return Ok(vec![Flow::Bf16, Flow::Bf16Fp8Rollout, Flow::Fp8]);
    }
    Ok(vec![arg
        .parse::<Flow>()
        .map_err(|e| anyhow::anyhow!("--flow {arg}: {e}"))?])
}

/// Device memory in use now, GiB.
pub(crate) fn mem_used_gib() -> f64 {
    cudarc::driver::result::mem_get_info()
        .map(|(free, total)| (total - free) as f64 / (1u64 << 30) as f64)
        .unwrap_or(0.0)
}

pub fn bench(a: BenchArgs) -> anyhow::Result<()> {
    if a.device != "cuda" {
        bail!(
            "--device {}: jetd bench measures the CUDA path; use --device cuda",
            a.device
        );
    }
    let mut cfg = preset(&a.preset)?;
    if let Some(l) = a.layers {
        if l == 0 {
            bail!("--layers 0: a model needs at least one layer");
        }
        cfg.num_hidden_layers = l;
    }
    if a.batch.is_empty() || a.batch.contains(&0) || a.gen_len == 0 || a.prompt_len == 0 {
        bail!("--batch, --prompt-len and --gen-len must be positive");
    }
    if a.group_size == 0 || a.batch.iter().any(|b| b % a.group_size != 0) {
        bail!(
            "--group-size {}: must be positive and divide every --batch ({:?})",
            a.group_size,
            a.batch
        );
    }
    if !(a.kv_cache_gib.is_finite() && a.kv_cache_gib >= 0.0) {
        bail!(
            "--kv-cache-gib {}: must be a finite number >= 0",
            a.kv_cache_gib
        );
    }
    if !(a.top_p > 0.0 && a.top_p <= 1.0) {
        bail!("--top-p {}: must be in (0, 1]", a.top_p);
    }
    if a.train_seqs == 0 || a.train_len < 2 || a.train_micro == 0 || a.step_micro_seqs == 0 {
        bail!("--train-seqs, --train-micro-batches and --step-micro-seqs must be positive and --train-len at least 2");
    }
    let flows = flows(&a.flow)?;
    let gpu: Arc<Gpu> = crate::gpu::open_gpu().context("jetd bench --device cuda")?;
    gpu.warm_up()?;
    let mut r = Report {
        device: gpu.name().to_string(),
        preset: a.preset.clone(),
        layers: cfg.num_hidden_layers,
        params: cfg.param_count(),
        untied_embedding: if cfg.tie_word_embeddings {
            0
        } else {
            cfg.vocab_size * cfg.hidden_size
        },
        cuda_graphs: !a.no_cuda_graphs,
        top_k: a.top_k,
        top_p: a.top_p,
        ..Default::default()
    };
    let say = |s: &str| {
        if !a.json {
            eprintln!("{s}");
        }
    };
    if !a.no_kernels {
        say("bench: GEMMs and quantizers ...");
        r.gemm = kernels::gemms(&gpu, &cfg)?;
        r.quant = kernels::quantizers(&gpu, &cfg)?;
        r.ops = attention::attention(
            &gpu,
            &cfg,
            a.train_seqs,
            a.train_len,
            a.batch[0],
            a.prompt_len + a.gen_len,
        )?;
    }
    say("bench: rollout, training, steps ...");
    let mut variants = phases::Variant::of(&flows);
    variants.retain(|v| v.invariant || !a.no_cublaslt);
    phases::run(&gpu, &cfg, &a, &variants, &mut r, &say)?;
    r.gemm_tuned = jet_kernels::cuda::gemm::tuned(&gpu)
        .into_iter()
        .map(|t| TunedRow {
            problem: t.what,
            candidates: t.candidates,
            first_us: t.first_us,
            chosen: t.chosen,
            chosen_us: t.chosen_us,
        })
        .collect();
    set_floors(&mut r, (a.train_seqs * a.train_len * a.train_micro) as f64);
    set_decode_floors(&mut r, &cfg);
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print!("{}", render(&r, &a));
    }
    Ok(())
}

/// Fill each training row's floor from the measured GEMM rates and copy bandwidth.
/// The measured device-to-device copy bandwidth, GB/s (None with --no-kernels).
fn copy_gbs(r: &Report) -> Option<f64> {
    r.quant
        .iter()
        .find(|q| q.name.starts_with("copy"))
        .map(|q| q.gb_per_s)
}

fn set_floors(r: &mut Report, tokens: f64) {
    let best = |fp8: bool| {
        r.gemm
            .iter()
            .map(|g| if fp8 { g.fp8_tflops } else { g.bf16_tflops })
            .fold(0.0f64, f64::max)
    };
    let (Some(copy), false) = (copy_gbs(r), r.gemm.is_empty()) else {
        return;
    };
    let params = r.params as f64;
    // An untied embedding table is a lookup, not a GEMM: no FLOPs, but AdamW bytes.
    let gemm_params = params - r.untied_embedding as f64;
    for t in &mut r.train {
        let tflops = best(phases::Variant::flow_of(&t.flow) == Some(Flow::Fp8));
        let floor = 6.0 * gemm_params * tokens / (tflops * 1e12) + 28.0 * params / (copy * 1e9);
        t.floor_s = Some(floor);
        t.of_floor = Some(floor / t.step_s);
    }
}

/// Fill each rollout row's decode floor (see `RolloutRow::floor_s`).
fn set_decode_floors(r: &mut Report, cfg: &ModelConfig) {
    let Some(copy) = copy_gbs(r).map(|g| g * 1e9) else {
        return;
    };
    let read = (r.params - r.untied_embedding) as f64;
    let kvd = (cfg.num_key_value_heads * cfg.head_dim) as f64;
    let layers = cfg.num_hidden_layers as f64;
    // The cache dtype follows GpuModel::flash_attention.
    let flash = jet_kernels::cuda::flash::flash_supported(jet_kernels::ops::attention::AttnShape {
        n_heads: cfg.num_attention_heads,
        n_kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
    });
    for x in &mut r.rollout {
        let Some(flow) = phases::Variant::flow_of(&x.flow) else {
            continue;
        };
        let wbytes = match flow.precision(jet_kernels::GemmRole::RolloutForward) {
            jet_kernels::GemmPrecision::Fp8 => 1.0,
            jet_kernels::GemmPrecision::Bf16 => 2.0,
            jet_kernels::GemmPrecision::F32 => 4.0,
        };
        let kvbytes = if flash && flow != Flow::F32 { 2.0 } else { 4.0 };
        // Each forward pass reads the weights once; each generated token its
        // sequence's cache rows (counted by the bench's decoder wrapper).
        let bytes = |passes: usize, rows: usize| {
            passes as f64 * read * wbytes + rows as f64 * layers * 2.0 * kvd * kvbytes
        };
        let floor = bytes(x.steps, x.kv_rows) / copy;
        x.floor_s = Some(floor);
        x.of_floor = Some(floor / x.seconds);
        let decode = bytes(x.steps - x.prefills, x.decode_kv_rows) / copy;
        x.decode_floor_s = Some(decode);
        x.decode_of_floor = Some(decode / x.decode_s);
    }
}

fn render(r: &Report, a: &BenchArgs) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "jetd bench: {} on {}, {} layers, {:.2}B params; prompt {} + gen {} tokens; train {}x{} tokens, {} micro-batch(es) an update",
        r.preset, r.device, r.layers, r.params as f64 / 1e9, a.prompt_len, a.gen_len, a.train_seqs, a.train_len, a.train_micro
    );
    if a.top_k > 0 || a.top_p < 1.0 {
        let _ = writeln!(
            s,
            "rollout draws: top-k {} top-p {} (0 and 1: off), on the device",
            a.top_k, a.top_p
        );
    }
    if a.group_size > 1 || a.kv_cache_gib > 0.0 {
        let _ = writeln!(
            s,
            "rollout: {} samples a prompt; KV cache {}",
            a.group_size,
            match a.kv_cache_gib > 0.0 {
                true => format!(
                    "bounded to {} GiB (paged, preempting where full)",
                    a.kv_cache_gib
                ),
                false => "with room for every live sequence at full length".to_string(),
            }
        );
    }
    if a.eos_random || a.max_batch > 0 {
        let _ = writeln!(
            s,
            "rollout: {}{}",
            if a.eos_random {
                "responses end at random lengths in 1..=gen; "
            } else {
                ""
            },
            match a.max_batch {
                0 => "all sequences live at once".to_string(),
                b => format!("at most {b} live (continuous batching)"),
            }
        );
    }
    if !r.gemm.is_empty() {
        let _ = writeln!(
            s,
            "\nGEMM (M = 8192)      K      N   BF16 TFLOP/s  FP8 TFLOP/s  FP8/BF16"
        );
        for g in &r.gemm {
            let _ = writeln!(
                s,
                "{:<16} {:>6} {:>6} {:>14.0} {:>12.0} {:>8.2}x",
                g.name, g.k, g.n, g.bf16_tflops, g.fp8_tflops, g.speedup
            );
        }
        let _ = writeln!(
            s,
            "\nquantizer                  shape          GB/s   % of copy"
        );
        for q in &r.quant {
            let _ = writeln!(
                s,
                "{:<26} {:<14} {:>6.0} {:>9.0}%",
                q.name,
                q.shape,
                q.gb_per_s,
                q.of_copy * 100.0
            );
        }
    }
    if !r.ops.is_empty() {
        let _ = writeln!(
            s,
            "\nattention (one layer)          shape                       us   TFLOP/s    GB/s"
        );
        let opt = |x: Option<f64>| x.map(|v| format!("{v:.0}")).unwrap_or_default();
        for o in &r.ops {
            let _ = writeln!(
                s,
                "{:<30} {:<24} {:>8.0} {:>9} {:>7}",
                o.name,
                o.shape,
                o.us,
                opt(o.tflops),
                opt(o.gb_per_s)
            );
        }
    }
    let _ = writeln!(
        s,
        "\nrollout            batch   tokens/s   vs bf16   peak GiB  floor s  of floor  prefill s  decode tok/s  of its floor"
    );
    // One decimal: the targets sit at 40% and the readings within a few points of it.
    let pct = |f: Option<f64>| f.map(|f| format!("{:.1}%", f * 100.0)).unwrap_or_default();
    // Against bf16: "-" where no bf16 row ran (`--flow` of one other flow).
    let ratio = |v: f64| match v.is_finite() {
        true => format!("{v:.2}x"),
        false => "-".to_string(),
    };
    for x in &r.rollout {
        let _ = writeln!(
            s,
            "{:<18} {:>5} {:>10.0} {:>9} {:>10.1} {:>8} {:>8} {:>10.3} {:>13.0} {:>13}",
            x.flow,
            x.batch,
            x.tokens_per_s,
            ratio(x.vs_bf16),
            x.peak_gib,
            x.floor_s.map(|f| format!("{f:.3}")).unwrap_or_default(),
            pct(x.of_floor),
            x.prefill_s,
            x.decode_tokens_per_s,
            pct(x.decode_of_floor),
        );
    }
    let _ = writeln!(
        s,
        "\nKV cache           batch   pages peak / pool   GiB peak   prompt rows computed / asked   preempted"
    );
    for x in &r.rollout {
        let _ = writeln!(
            s,
            "{:<18} {:>5} {:>10} / {:<8} {:>8.2} {:>16} / {:<12} {:>9}",
            x.flow,
            x.batch,
            x.kv.kv_pages_peak,
            x.kv.kv_pages,
            x.kv.kv_pages_peak as f64 * x.kv.kv_page_bytes as f64 / (1u64 << 30) as f64,
            x.kv.prefill_rows,
            x.kv.prefill_rows_asked,
            x.kv.preempted,
        );
    }
    for x in &r.rollout {
        let parts: Vec<String> = x
            .breakdown
            .iter()
            .map(|(c, t)| format!("{c} {:.1}", t * 1e3))
            .collect();
        let _ = writeln!(
            s,
            "  {:<16} {:>4} ms: {}",
            x.flow,
            x.batch,
            parts.join(", ")
        );
    }
    let _ = writeln!(s, "\ntrain              tokens/s   vs bf16  (median)   step s  median s  prepare  forward  loss+bwd  AdamW   peak GiB  floor s  of floor");
    for x in &r.train {
        let _ = writeln!(
            s,
            "{:<18} {:>8.0} {:>9} {:>9} {:>8.3} {:>9.3} {:>8.3} {:>8.3} {:>9.3} {:>6.3} {:>10.1} {:>8} {:>8}",
            x.flow,
            x.tokens_per_s,
            ratio(x.vs_bf16),
            ratio(x.vs_bf16_median),
            x.step_s,
            x.step_median_s,
            x.prepare_s,
            x.forward_s,
            x.step_s
                - if x.prepares { x.prepare_s } else { 0.0 }
                - x.forward_s * x.micro_batches as f64
                - x.optimizer_s,
            x.optimizer_s,
            x.peak_gib,
            x.floor_s.map(|f| format!("{f:.3}")).unwrap_or_default(),
            pct(x.of_floor)
        );
    }
    for x in &r.train {
        let parts: Vec<String> = x
            .breakdown
            .iter()
            .map(|(c, t)| format!("{c} {:.1}", t * 1e3))
            .collect();
        let _ = writeln!(s, "  {:<16} ms: {}", x.flow, parts.join(", "));
        let _ = writeln!(s, "  {:<16} top: {}", "", kernel_list(&x.top_kernels, 6, 1));
        let idle = kernel_list(&x.idle_before, 4, 2);
        let _ = writeln!(s, "  {:<16} idle before: {idle}", "");
    }
    let _ = writeln!(
        s,
        "\nGRPO-shaped step   total s  rollout s  train s  other s  micro-batches  vs bf16  (first step: total s, rollout s)"
    );
    for x in &r.step {
        let _ = writeln!(
            s,
            "{:<18} {:>7.3} {:>10.3} {:>8.3} {:>8.3} {:>14} {:>8}  ({:.3}, {:.3})",
            x.flow,
            x.total_s,
            x.rollout_s,
            x.train_s,
            x.other_s,
            x.micro_batches,
            ratio(x.vs_bf16),
            x.first_total_s,
            x.first_rollout_s
        );
        if !x.train_top_kernels.is_empty() {
            let top = kernel_list(&x.train_top_kernels, 6, 1);
            let _ = writeln!(s, "  {:<16} train top: {top}", "");
        }
        if !x.train_idle_before.is_empty() {
            let idle = kernel_list(&x.train_idle_before, 4, 2);
            let _ = writeln!(s, "  {:<16} train idle before: {idle}", "");
        }
    }
    let _ = writeln!(s, "\npeak device memory in use: {:.1} GiB", r.peak_mem_gib);
    if !r.gemm_tuned.is_empty() {
        // One GEMM call of each problem, as the heuristic's first pick would have
        // run it and as the chosen algorithm runs it.
        let changed = r.gemm_tuned.iter().filter(|t| t.chosen != 0).count();
        let first: f32 = r.gemm_tuned.iter().map(|t| t.first_us).sum();
        let chosen: f32 = r.gemm_tuned.iter().map(|t| t.chosen_us).sum();
        let _ = writeln!(
            s,
            "cuBLASLt algorithms timed for {} problems, {changed} not the heuristic's first pick: one call of each {first:.0} -> {chosen:.0} us",
            r.gemm_tuned.len()
        );
    }
    s
}

/// A (name, seconds, launches) list, its first `n` in milliseconds: the busiest
/// kernels, or the idle before launches.
fn kernel_list(v: &[(String, f64, usize)], n: usize, digits: usize) -> String {
    let items: Vec<String> = v
        .iter()
        .take(n)
        .map(|(k, t, c)| format!("{k} {:.digits$} ({c})", t * 1e3))
        .collect();
    items.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: BenchArgs,
    }

    /// A flow without a bf16 row beside it reads "-" against bf16, not NaN, and
    /// truncated rollout draws are named in the header.
    #[test]
    fn render_marks_missing_ratios_and_truncation() {
        let a = Cli::parse_from(["bench", "--flow", "fp8", "--top-p", "0.95"]).a;
        let step = |flow: &str, vs_bf16| phases::StepRow {
            flow: flow.into(),
            batch: 64,
            total_s: 1.0,
            rollout_s: 0.5,
            train_s: 0.5,
            other_s: 0.0,
            vs_bf16,
            first_total_s: 1.2,
            first_rollout_s: 0.7,
            micro_batches: 1,
            micro_tokens: 16384,
            train_top_kernels: vec![("wg_fp8_rows_tma".into(), 0.0123, 392)],
            train_idle_before: vec![("cublasLt matmul".into(), 0.00042, 17)],
        };
        let r = Report {
            step: vec![step("fp8", f64::NAN), step("bf16-fp8rollout", 1.05)],
            ..Default::default()
        };
        let text = render(&r, &a);
        assert!(text.contains("top-k 0 top-p 0.95"), "{text}");
        assert!(!text.contains("NaN"), "{text}");
        // The row up to its vs-bf16 column (the first step's times follow).
        let row = |flow: &str| {
            let l = text.lines().find(|l| l.starts_with(flow)).unwrap();
            assert!(l.ends_with("(1.200, 0.700)"), "{text}");
            l.split("  (").next().unwrap().to_string()
        };
        assert!(row("fp8 ").trim_end().ends_with(" -"), "{text}");
        assert!(
            row("bf16-fp8rollout").trim_end().ends_with("1.05x"),
            "{text}"
        );
        // The profiled step's training kernels, in ms with their launches.
        assert!(
            text.contains("train top: wg_fp8_rows_tma 12.3 (392)"),
            "{text}"
        );
        // And the stream's idle time before its launches, in ms.
        assert!(
            text.contains("train idle before: cublasLt matmul 0.42 (17)"),
            "{text}"
        );
    }
}
