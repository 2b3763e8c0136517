//! The GPU model, rollout and trainer against the CPU reference and HF.
//! Without CUDA every test prints "skipping: no CUDA device: ..." and passes.
//! On a GPU machine: `gpu_parity --test-threads=1 --nocapture` prints a
//! `PARITY` line per check before asserting its bound.
//!
//! Errors are norm-wise relative, ||gpu - cpu|| / ||cpu||, unless stated.

mod common;

use std::sync::Arc;

use common::{expected, fixture};

use jet_backend::config::RunConfig;
use jet_backend::gpu::forward::forward as gpu_forward;
use jet_backend::gpu::optim::global_norm_gpu;
use jet_backend::gpu::pass_loss::{loss_settings, PolicyInputs};
use jet_backend::gpu::{
    open_gpu, run_pass_gpu, GpuAdam, GpuDecoder, GpuGrads, GpuModel, GpuWeights,
};
use jet_backend::model::{init_random, load_model, Arch, ModelConfig, ModelWeights};
use jet_backend::rl::loss::{token_loss, LossConfig, TokenInput};
use jet_backend::rl::mismatch::mismatch;
use jet_backend::rl::optim::{global_norm, AdamW, OptimConfig, Schedule};
use jet_backend::rollout::engine::{generate_with, GenConfig};
use jet_backend::rollout::sampler::SamplingParams;
use jet_backend::trainer::pass::{run_pass, TrainSeq};
use jet_backend::trainer::pass_loss::{LossStats, PassLoss, PolicyLoss};
use jet_backend::trainer::Trainer;
use jet_backend::transformer::PreparedModel;
use jet_kernels::cuda::grad::{set_scatter_settles, ScatterSettle};
use jet_kernels::cuda::linear::Stacked;
use jet_kernels::cuda::policy_loss::{policy_loss, LossInputs, LossTerms as DeviceLossTerms};
use jet_kernels::cuda::Gpu;
use jet_kernels::{Flow, GemmRole};
use rand::SeedableRng;

fn gpu() -> Option<Arc<Gpu>> {
    match open_gpu() {
        Ok(g) => Some(g),
        Err(e) => {
            println!("skipping: no CUDA device: {e}");
            None
        }
    }
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut n, mut d) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        n += ((x - y) as f64).powi(2);
        d += (*y as f64).powi(2);
    }
    (n / d.max(1e-300)).sqrt()
}

fn report(what: &str, err: f64, bound: f64) {
    println!("PARITY | {what:<52} | {err:.2e} | <= {bound:.0e}");
    assert!(err <= bound, "{what}: {err:.3e} above {bound:.0e}");
}

/// The HF fixtures on the GPU, with the CPU test's bounds (max |ours - HF| / max |HF|).
#[test]
fn hf_fixtures_on_gpu() {
    let Some(g) = gpu() else { return };
    for name in ["qwen3-tiny", "llama-tiny", "qwen2-tiny"] {
        let (cfg, w) = load_model(&fixture(name)).unwrap();
        let dw = GpuWeights::upload(&g, &w).unwrap();
        for (flow, bound) in [(Flow::F32, 1e-4), (Flow::Bf16, 3e-2), (Flow::Fp8, 0.25)] {
            let model = GpuModel::new(&g, &cfg, &dw, flow).unwrap();
            let (mut num, mut den) = (0f64, 0f64);
            for (toks, hf) in expected(name) {
                // The trainer's forward: logits kept as BF16 values where the LM
                // head's rows GEMM writes them, read widened.
                let out = gpu_forward(
                    &model,
                    &[toks.as_slice()],
                    GemmRole::TrainForward,
                    false,
                    true,
                )
                .unwrap();
                let mut keep = None;
                let logits = out.logits.as_f32(&g, &mut keep).unwrap();
                let ours = g.download_n(logits, hf.len()).unwrap();
                for (a, b) in ours.iter().zip(&hf) {
                    num = num.max((a - b).abs() as f64);
                    den = den.max(b.abs() as f64);
                }
            }
            report(
                &format!("HF logits {name} {}", flow.name()),
                num / den,
                bound,
            );
        }
    }
}

fn tiny() -> ModelConfig {
    ModelConfig {
        arch: Arch::Qwen3,
        vocab_size: 61,
        hidden_size: 256,
        intermediate_size: 384,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 64,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        rope_scaling: None,
        max_position_embeddings: 96,
        tie_word_embeddings: true,
        attention_bias: false,
        qk_norm: true,
        bos_token_id: None,
        eos_token_ids: vec![0],
    }
}

/// Qwen3-0.6B's widths (hidden 1024, MLP 3072, 16/8 heads of 128) in two layers
/// with a 4,096-token vocabulary.
fn qwen3_widths() -> ModelConfig {
    ModelConfig {
        vocab_size: 4096,
        hidden_size: 1024,
        intermediate_size: 3072,
        num_attention_heads: 16,
        num_key_value_heads: 8,
        head_dim: 128,
        max_position_embeddings: 64,
        ..tiny()
    }
}

/// Each sample's tokens and the bits of its logprobs.
fn sample_bits(samples: &[jet_backend::rollout::engine::Sample]) -> Vec<(Vec<u32>, Vec<u32>)> {
    samples
        .iter()
        .map(|x| {
            let lp: Vec<u32> = x.logprobs.iter().map(|v| v.to_bits()).collect();
            (x.tokens.clone(), lp)
        })
        .collect()
}

fn seqs() -> Vec<TrainSeq> {
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    [(4usize, 9usize), (6, 17), (3, 40)]
        .iter()
        .map(|&(p, n)| TrainSeq {
            tokens: (0..n)
                .map(|_| rand::Rng::random_range(&mut r, 1..61u32))
                .collect(),
            prompt_len: p,
        })
        .collect()
}

fn ocfg() -> OptimConfig {
    OptimConfig {
        lr: 1e-3,
        warmup_steps: 0,
        schedule: Schedule::Constant,
        min_lr_ratio: 1.0,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        grad_clip: 1.0,
    }
}

/// One whole training step (tempered pass with a GRPO-like per-token loss,
/// backward, AdamW) on the GPU against the CPU: logprobs, loss, gradient norm,
/// every gradient tensor and the updated weights.
#[test]
fn whole_step_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cfg = tiny();
    let w0 = init_random(&cfg, 3);
    let seqs = seqs();
    let adv = [1.0f64, -0.5, 0.25];
    let n_tok: usize = seqs.iter().map(|s| s.response_len()).sum();
    // (flow, logp, loss, grads, grad norm, update) bounds.
    let bounds = [
        (Flow::F32, 1e-5, 1e-5, 1e-4, 1e-5, 2e-2),
        (Flow::Bf16, 2e-2, 2e-2, 5e-2, 5e-2, 0.2),
        // FP8 gradients of the norm weights are sums of many small, cancelling
        // terms: cuBLASLt's accumulation moves them most (input_layernorm 5.3e-2).
        // The update bound is loose because AdamW's first step is ~lr * sign(g):
        // every small gradient component that changes sign moves a whole lr (with
        // the BF16-operand attention of this flow: 0.302 measured on an H200).
        (Flow::Fp8, 2e-2, 2e-2, 0.15, 5e-2, 0.4),
    ];
    for (flow, b_lp, b_loss, b_g, b_norm, b_upd) in bounds {
        let f = flow.name();
        // CPU.
        let (mut loss_c, mut loss_g) = (0.0f64, 0.0f64);
        let mut gf_c = |i: usize, _t: usize, lp: f64, _e: f64| {
            loss_c -= adv[i] * lp / n_tok as f64;
            (-adv[i] / n_tok as f64, 0.0)
        };
        let model = PreparedModel::new(&cfg, &w0, flow);
        let (sc, gc) = run_pass(&model, &seqs, 0.8, 2, Some(PassLoss::Host(&mut gf_c)));
        drop(model);
        let gc = gc.unwrap();
        let mut wc = w0.clone();
        let mut oc = AdamW::new(&cfg);
        let norm_c = oc.step(&mut wc, &gc, &ocfg(), 1e-3);
        // GPU.
        let mut dw = GpuWeights::upload(&g, &w0).unwrap();
        let mut dg = GpuGrads::zeros_like(&g, &dw).unwrap();
        let mut gf_g = |i: usize, _t: usize, lp: f64, _e: f64| {
            loss_g -= adv[i] * lp / n_tok as f64;
            (-adv[i] / n_tok as f64, 0.0)
        };
        let sg = {
            let model = GpuModel::new(&g, &cfg, &dw, flow).unwrap();
            let loss = PassLoss::Host(&mut gf_g);
            run_pass_gpu(&model, &seqs, 0.8, 2, Some((loss, &mut dg))).unwrap()
        };
        let norm_pre = global_norm_gpu(&g, &dg).unwrap();
        let mut ga = GpuAdam::upload(&g, &AdamW::new(&cfg)).unwrap();
        let norm_g = ga.step(&g, &mut dw, &dg, &ocfg(), 1e-3).unwrap();
        assert_eq!(norm_pre, norm_g);
        let mut grads_g = ModelWeights::zeros(&cfg);
        dg.download_into(&g, &mut grads_g).unwrap();
        let mut wg = w0.clone();
        dw.download_into(&g, &mut wg).unwrap();

        let flat = |v: &[Vec<f64>]| v.iter().flatten().map(|&x| x as f32).collect::<Vec<_>>();
        report(
            &format!("{f}: response logprobs"),
            rel(&flat(&sg.logp), &flat(&sc.logp)),
            b_lp,
        );
        report(
            &format!("{f}: entropies"),
            rel(&flat(&sg.entropy), &flat(&sc.entropy)),
            b_lp,
        );
        report(
            &format!("{f}: loss"),
            ((loss_g - loss_c) / loss_c).abs(),
            b_loss,
        );
        report(
            &format!("{f}: gradient norm"),
            ((norm_g - norm_c) / norm_c).abs(),
            b_norm,
        );
        assert!((global_norm(&gc) - norm_c).abs() < 1e-12);
        let mut worst = (0.0, String::new());
        for ((name, a), (_, b)) in grads_g.tensors().into_iter().zip(gc.tensors()) {
            let e = rel(a, b);
            if e > worst.0 {
                worst = (e, name);
            }
        }
        report(
            &format!("{f}: worst gradient tensor ({})", worst.1),
            worst.0,
            b_g,
        );
        // Updated weights, relative to the size of the update.
        let (mut num, mut den) = (0f64, 0f64);
        for (((_, a), (_, b)), (_, o)) in
            wg.tensors().into_iter().zip(wc.tensors()).zip(w0.tensors())
        {
            for ((x, y), z) in a.iter().zip(b.iter()).zip(o.iter()) {
                num += ((x - y) as f64).powi(2);
                den += ((y - z) as f64).powi(2);
            }
        }
        report(
            &format!("{f}: updated weights / update size"),
            (num / den).sqrt(),
            b_upd,
        );
    }
}

/// A pass of one micro-batch a sequence whose matrices' gradients hold their
/// WGrad outputs two or three at a time (`GpuGrads::hold_cap`, settled together)
/// gives the gradients of one settled a pass, bit for bit, in the flows whose
/// WGrad outputs are held (BF16 and FP8, tied and untied LM heads); the gradient
/// norm (which reads them held) agrees bit for bit too. The tied embedding's
/// scatter settles the LM head's held outputs in the rows it writes alone
/// (`GradAcc::f32_scatter_mut`), against a baseline that settles them whole.
#[test]
fn held_wgrad_outputs_settle_to_the_same_gradients() {
    let Some(g) = gpu() else { return };
    let seqs = seqs();
    let n_tok: usize = seqs.iter().map(|s| s.response_len()).sum();
    let untied = ModelConfig {
        tie_word_embeddings: false,
        ..qwen3_widths()
    };
    for (name, cfg) in [("qwen3 widths", qwen3_widths()), ("untied", untied)] {
        for flow in [Flow::Bf16, Flow::Fp8] {
            let w0 = init_random(&cfg, 6);
            let dw = GpuWeights::upload(&g, &w0).unwrap();
            let model = GpuModel::new(&g, &cfg, &dw, flow).unwrap();
            let run = |cap: usize, scatter: bool| {
                set_scatter_settles(match scatter {
                    true => ScatterSettle::OneHeld,
                    false => ScatterSettle::Off,
                });
                let mut dg = GpuGrads::zeros_like(&g, &dw).unwrap();
                dg.hold_cap = Some(cap);
                let loss = PassLoss::Const {
                    dlogp: -1.0 / n_tok as f64,
                    dentropy: 0.0,
                };
                run_pass_gpu(&model, &seqs, 1.0, 1, Some((loss, &mut dg))).unwrap();
                let held = dg.bufs.iter().map(|b| b.held()).max().unwrap_or(0);
                assert!(
                    held <= 1,
                    "{name} {flow}: {held} addends held after the pass"
                );
                let norm = global_norm_gpu(&g, &dg).unwrap();
                let mut h = ModelWeights::zeros(&cfg);
                dg.download_into(&g, &mut h).unwrap();
                let bits: Vec<u32> = h
                    .tensors()
                    .into_iter()
                    .flat_map(|(_, t)| t.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                    .collect();
                (norm, bits)
            };
            // The baseline settles the tied embedding's held LM head outputs
            // whole before its scatter; at hold 1 the others settle the scattered
            // rows alone (`GradAcc::f32_scatter_mut`; holds of more settle whole).
            let (n1, b1) = run(1, false);
            for (cap, scatter) in [(1, true), (2, true), (3, true)] {
                let (n, b) = run(cap, scatter);
                let differ = b1.iter().zip(&b).filter(|(x, y)| x != y).count();
                println!(
                    "PARITY held {cap} a matrix (scatter settles its rows: {scatter}) vs settled a pass ({name}, {flow}): {differ} of {} gradient values differ, norm {n1:e} vs {n:e}",
                    b1.len()
                );
                assert_eq!(differ, 0, "{name} {flow} hold {cap}: gradients");
                assert_eq!(n1.to_bits(), n.to_bits(), "{name} {flow} hold {cap}: norm");
            }
        }
    }
}

/// The optimizer step that rewrites the prepared weight copies (BF16 copies, FP8
/// 128x128 blocks and their transposes) from the new values
/// (`GpuAdam::step_prepared`) leaves them equal, bit for bit, to copies made
/// afresh from the updated weights, so the next update's forward (and the next
/// rollout) reads the same operands, in every flow.
/// The step reads the backward's gradients with their last WGrad outputs held in
/// BF16 (two micro-batches, tied and untied LM heads): its norm, weights and
/// moments equal those of the same step on the gradients settled into f32.
#[test]
fn optimizer_step_keeps_the_weight_copies_prepared() {
    let Some(g) = gpu() else { return };
    let seqs = seqs();
    let adv = [1.0f64, -0.5, 0.25];
    let n_tok: usize = seqs.iter().map(|s| s.response_len()).sum();
    let untied = ModelConfig {
        tie_word_embeddings: false,
        ..qwen3_widths()
    };
    let cfgs = [
        ("tiny", tiny()),
        ("qwen3 widths", qwen3_widths()),
        ("untied", untied),
    ];
    for (name, cfg) in cfgs {
        for flow in [Flow::Bf16, Flow::Bf16Fp8Rollout, Flow::Fp8] {
            let w0 = init_random(&cfg, 4);
            let mut dw = GpuWeights::upload(&g, &w0).unwrap();
            let mut dg = GpuGrads::zeros_like(&g, &dw).unwrap();
            let mut parts = {
                let model = GpuModel::new(&g, &cfg, &dw, flow).unwrap();
                let mut gf = |i: usize, _t: usize, _lp: f64, _e: f64| (-adv[i] / n_tok as f64, 0.0);
                run_pass_gpu(
                    &model,
                    &seqs,
                    0.8,
                    2,
                    Some((PassLoss::Host(&mut gf), &mut dg)),
                )
                .unwrap();
                model.into_parts()
            };
            let mut ga = GpuAdam::upload(&g, &AdamW::new(&cfg)).unwrap();
            let (norm, rewrote) = ga
                .step_prepared(&g, &mut dw, &dg, &ocfg(), 1e-2, Some(&mut parts))
                .unwrap();
            // The same step on the same gradients settled into f32 first.
            let mut host_g = ModelWeights::zeros(&cfg);
            dg.download_into(&g, &mut host_g).unwrap();
            let mut dw_f = GpuWeights::upload(&g, &w0).unwrap();
            let mut ga_f = GpuAdam::upload(&g, &AdamW::new(&cfg)).unwrap();
            let norm_f = ga_f.step(&g, &mut dw_f, &dg, &ocfg(), 1e-2).unwrap();
            let flat = |w: &GpuWeights| -> Vec<u32> {
                let mut h = ModelWeights::zeros(&cfg);
                w.download_into(&g, &mut h).unwrap();
                h.tensors()
                    .into_iter()
                    .flat_map(|(_, t)| t.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                    .collect()
            };
            let mut held_vs_f32 = usize::from(norm.to_bits() != norm_f.to_bits());
            for (a, b) in [(&dw, &dw_f), (&ga.m, &ga_f.m), (&ga.v, &ga_f.v)] {
                let (a, b) = (flat(a), flat(b));
                held_vs_f32 += a.iter().zip(&b).filter(|(x, y)| x != y).count();
            }
            println!(
                "PARITY | {name} {}: AdamW on held BF16 gradients vs settled f32 (norm, p, m, v) | {held_vs_f32} differing",
                flow.name()
            );
            assert_eq!(held_vs_f32, 0);
            assert!(rewrote, "{name} {}: rewritten", flow.name());
            let fresh = GpuModel::new(&g, &cfg, &dw, flow).unwrap();
            let kept = GpuModel::reuse(&g, &cfg, &dw, parts);
            // Every prepared copy's bits: the BF16 values, then the FP8 codes and
            // scales of W and W^T (whichever the flow has).
            let bits = |w: &jet_kernels::cuda::linear::GpuWeight| -> Vec<u32> {
                let mut out: Vec<u32> = w
                    .bf16_view()
                    .map(|b| b.to_host(&g).unwrap())
                    .unwrap_or_default()
                    .into_iter()
                    .map(u32::from)
                    .collect();
                for q in [w.fp8(), w.fp8_t()].into_iter().flatten() {
                    out.extend(g.download(&q.codes).unwrap().into_iter().map(u32::from));
                    out.extend(g.download(&q.scales).unwrap().iter().map(|x| x.to_bits()));
                }
                assert!(!out.is_empty(), "a weight with no prepared copy");
                out
            };
            let mut differ = 0;
            let mut total = 0;
            for (a, b) in fresh.layers.iter().zip(&kept.layers) {
                for (x, y) in [
                    (&a.q, &b.q),
                    (&a.k, &b.k),
                    (&a.v, &b.v),
                    (&a.o, &b.o),
                    (&a.gate, &b.gate),
                    (&a.up, &b.up),
                    (&a.down, &b.down),
                ] {
                    let (x, y) = (bits(x), bits(y));
                    total += x.len();
                    differ += x.iter().zip(&y).filter(|(p, q)| p != q).count();
                }
                // The layer's stacked DGrad operands (q/k/v and gate/up: fp8 their
                // W^T, whose members hold none of their own; the BF16 flows their
                // BF16 weights, whose members are its rows), rewritten in place by
                // AdamW.
                for (x, y) in [(&a.qkv_st, &b.qkv_st), (&a.gu_st, &b.gu_st)] {
                    assert_eq!(
                        x.is_some(),
                        y.is_some(),
                        "{name}: stacked DGrad operand in one model only"
                    );
                    let w16 = |s: &Option<Stacked>| {
                        s.as_ref()
                            .and_then(Stacked::bf16)
                            .map(|b| g.download(b).unwrap())
                    };
                    if let (Some(x), Some(y)) = (w16(x), w16(y)) {
                        total += x.len();
                        differ += x.iter().zip(&y).filter(|(p, q)| p != q).count();
                    }
                    let (tx, ty) = (
                        x.as_ref().and_then(Stacked::fp8_t),
                        y.as_ref().and_then(Stacked::fp8_t),
                    );
                    if let (Some(x), Some(y)) = (tx, ty) {
                        let (xc, yc) =
                            (g.download(&x.codes).unwrap(), g.download(&y.codes).unwrap());
                        let (xs, ys) = (
                            g.download(&x.scales).unwrap(),
                            g.download(&y.scales).unwrap(),
                        );
                        total += xc.len() + xs.len();
                        differ += xc.iter().zip(&yc).filter(|(p, q)| p != q).count();
                        differ += xs
                            .iter()
                            .zip(&ys)
                            .filter(|(p, q)| p.to_bits() != q.to_bits())
                            .count();
                    }
                }
            }
            let (x, y) = (bits(&fresh.lm_head), bits(&kept.lm_head));
            total += x.len();
            differ += x.iter().zip(&y).filter(|(p, q)| p != q).count();
            println!(
                "PARITY | {name} {}: weight copies (BF16, FP8 blocks) rewritten by AdamW vs made afresh | {differ} differing of {total}",
                flow.name()
            );
            assert_eq!(differ, 0);
        }
    }
}

/// Fill `bytes` of the device's memory pool with `fill` and give them back: the
/// allocations that follow are likely to land on those bytes.
fn poison_pool(g: &Gpu, bytes: usize, fill: u8) {
    let mut b = g.zeros::<u8>(bytes).unwrap();
    g.write(&mut b, &vec![fill; bytes]).unwrap();
    g.sync().unwrap();
}

/// A training pass (forward, loss head, backward) reads nothing it did not write:
/// the same gradients, bit for bit, whether the pool it allocates from held 0xff
/// bytes (NaN in f32) or zeros. (A change that only moved three allocations once
/// made fp8 runs differ from one another: NOTES.md, fourteenth session.)
#[test]
fn training_pass_reads_only_what_it_wrote() {
    let Some(g) = gpu() else { return };
    let seqs = seqs();
    let adv = [1.0f64, -0.5, 0.25];
    let n_tok: usize = seqs.iter().map(|s| s.response_len()).sum();
    for (name, cfg) in [("tiny", tiny()), ("qwen3 widths", qwen3_widths())] {
        let w0 = init_random(&cfg, 3);
        let dw = GpuWeights::upload(&g, &w0).unwrap();
        for flow in [Flow::F32, Flow::Bf16, Flow::Fp8] {
            let grads = |fill: u8| {
                poison_pool(&g, 1 << 30, fill);
                let mut dg = GpuGrads::zeros_like(&g, &dw).unwrap();
                let model = GpuModel::new(&g, &cfg, &dw, flow).unwrap();
                let mut gf = |i: usize, _t: usize, _lp: f64, _e: f64| (-adv[i] / n_tok as f64, 0.0);
                run_pass_gpu(
                    &model,
                    &seqs,
                    0.8,
                    2,
                    Some((PassLoss::Host(&mut gf), &mut dg)),
                )
                .unwrap();
                let mut out = ModelWeights::zeros(&cfg);
                dg.download_into(&g, &mut out).unwrap();
                out.tensors()
                    .into_iter()
                    .flat_map(|(_, t)| t.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                    .collect::<Vec<u32>>()
            };
            let (a, b) = (grads(0xff), grads(0x00));
            let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
            println!(
                "PARITY | {name} {}: gradients, pool of 0xff vs of zeros | {differ} differing of {}",
                flow.name(),
                a.len()
            );
            assert_eq!(
                differ,
                0,
                "{name} {}: a read of unwritten memory",
                flow.name()
            );
        }
    }
}

/// Greedy or sampled generation on the GPU, `n` samples a prompt, RNG seeded `seed`.
fn generate_gpu(
    model: &GpuModel,
    prompts: &[Vec<u32>],
    n: usize,
    gen: &GenConfig,
    seed: u64,
) -> Vec<jet_backend::rollout::engine::Sample> {
    generate_gpu_graphs(model, prompts, n, gen, seed, true, true).0
}

/// [`generate_gpu`] with decode steps replayed as CUDA graphs or launched one
/// kernel at a time, run ahead of the host or not; also the steps kept ahead.
fn generate_gpu_graphs(
    model: &GpuModel,
    prompts: &[Vec<u32>],
    n: usize,
    gen: &GenConfig,
    seed: u64,
    graphs: bool,
    ahead: bool,
) -> (Vec<jet_backend::rollout::engine::Sample>, usize) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let max_pos = model.cfg.max_position_embeddings;
    let mut dec = GpuDecoder::new(model)
        .with_graphs(graphs)
        .with_step_ahead(ahead);
    let out = generate_with(
        &mut dec,
        max_pos,
        prompts,
        n,
        gen,
        &|_| String::new(),
        &mut rng,
    )
    .unwrap();
    (out, dec.steps_kept_ahead())
}

/// Roll out 4 samples of 16 prompts (24 tokens, seeded sampling) and score them
/// with the training pass: (max |dlogp| rollout vs training, mismatch_kl).
fn rollout_vs_training(
    g: &Arc<Gpu>,
    cfg: &ModelConfig,
    dw: &GpuWeights,
    flow: Flow,
    invariant: bool,
) -> (f64, f64) {
    let prompts: Vec<Vec<u32>> = (0..16).map(|i| vec![1 + i as u32 % 50, 7, 9, 11]).collect();
    let gen = GenConfig {
        max_new_tokens: 24,
        sampling: SamplingParams::default(),
        stop_token_ids: vec![0],
        stop_strings: vec![],
        max_batch: 0,
    };
    let mut model = GpuModel::new(g, cfg, dw, flow).unwrap();
    model.set_batch_invariant(invariant);
    let samples = generate_gpu(&model, &prompts, 4, &gen, 9);
    let seqs = TrainSeq::of_samples(&prompts, &samples);
    let sc = run_pass_gpu(&model, &seqs, 1.0, 8, None).unwrap();
    let train: Vec<f64> = sc.logp.iter().flatten().copied().collect();
    let roll: Vec<f64> = samples
        .iter()
        .flat_map(|s| s.logprobs.iter().map(|&x| x as f64))
        .collect();
    let mm = mismatch(&train, &roll);
    let max_abs = train
        .iter()
        .zip(&roll)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    println!(
        "MISMATCH | {:<16} | hidden {} | invariant {invariant} | tokens {} | mismatch_kl {:.3e} | max |dlogp| {max_abs:.3e} | token_mult_prob_error {:.3e}",
        flow.name(),
        cfg.hidden_size,
        train.len(),
        mm.mismatch_kl,
        mm.token_mult_prob_error
    );
    (max_abs, mm.mismatch_kl)
}

/// The GPU rollout's logprobs against the GPU training pass over the same
/// samples: the mismatch the fp8 flow shows on the GPU, per flow.
#[test]
fn rollout_vs_training_mismatch_on_gpu() {
    let Some(g) = gpu() else { return };
    let cfg = tiny();
    let dw = GpuWeights::upload(&g, &init_random(&cfg, 4)).unwrap();
    // Bounds on max |dlogp|: f32 shares kernels between decode and training up
    // to summation order; bf16 and fp8 are bit-identical: the tensor-core
    // attention gives a decoded row the training forward's bits and the BF16 and
    // FP8 forward GEMMs are batch-invariant (the split-K decode kernels and
    // gemm_*_rows add a row's products in one order).
    let mut kl = Vec::new();
    for (flow, bound) in [
        (Flow::F32, 1e-4),
        (Flow::Bf16, 0.0),
        (Flow::Fp8, 0.0),
        (Flow::Bf16Fp8Rollout, 10.0),
    ] {
        let (max_abs, mkl) = rollout_vs_training(&g, &cfg, &dw, flow, true);
        report(
            &format!("{}: rollout vs training max |dlogp|", flow.name()),
            max_abs,
            bound,
        );
        kl.push(mkl);
    }
    // The paper's point on the GPU: one FP8 flow is on-policy (0), FP8 rollouts
    // with BF16 training are not.
    assert!(
        kl[2] < kl[3],
        "fp8 mismatch_kl {} vs bf16-fp8rollout {}",
        kl[2],
        kl[3]
    );
}

/// The same at Qwen3-0.6B's widths (hidden 1024, MLP 3072, 16/8 heads of 128; two
/// layers, a 4,096-token vocabulary), where cuBLASLt's BF16 GEMM orders a
/// decode row's sum differently from a training row's: with the batch-invariant
/// kernels (the default) bf16 and fp8 are exactly on-policy; cuBLASLt's numbers
/// are printed for the record.
#[test]
fn rollout_equals_training_bitwise_at_qwen3_widths() {
    let Some(g) = gpu() else { return };
    let cfg = qwen3_widths();
    let dw = GpuWeights::upload(&g, &init_random(&cfg, 6)).unwrap();
    // FP8 twice: the decode's gate/up + SwiGLU as these widths take it by default
    // (split-K kernel, then swiglu_sk_operand) and in one launch, forced (the path of
    // wider models).
    for (flow, gu_fused) in [
        (Flow::Bf16, None),
        (Flow::Fp8, None),
        (Flow::Fp8, Some(true)),
    ] {
        jet_kernels::cuda::linear::set_gate_up_fused(gu_fused);
        let (max_abs, _) = rollout_vs_training(&g, &cfg, &dw, flow, true);
        report(
            &format!(
                "{} (0.6B widths, gate/up one launch {gu_fused:?}): rollout vs training max |dlogp|",
                flow.name()
            ),
            max_abs,
            0.0,
        );
        rollout_vs_training(&g, &cfg, &dw, flow, false);
    }
    jet_kernels::cuda::linear::set_gate_up_fused(None);
}

/// The same bitwise equality for the layer layouts without Qwen3's q/k norms:
/// Llama (no biases) and Qwen2 (q, k, v biases). Their decode steps take the
/// separate q/k/v kernels and norm + RoPE launches while the o, gate/up and
/// down projections' epilogues still run fused (`linear::fused`).
#[test]
fn rollout_equals_training_bitwise_for_llama_and_qwen2_layouts() {
    let Some(g) = gpu() else { return };
    for (arch, bias) in [(Arch::Llama, false), (Arch::Qwen2, true)] {
        let cfg = ModelConfig {
            arch,
            attention_bias: bias,
            qk_norm: false,
            ..qwen3_widths()
        };
        let dw = GpuWeights::upload(&g, &init_random(&cfg, 7)).unwrap();
        for flow in [Flow::Bf16, Flow::Fp8] {
            let (max_abs, _) = rollout_vs_training(&g, &cfg, &dw, flow, true);
            report(
                &format!(
                    "{} ({arch:?} layout): rollout vs training max |dlogp|",
                    flow.name()
                ),
                max_abs,
                0.0,
            );
        }
    }
}

/// The trainer end to end on the GPU (embedded tiny-arith, shortened): SFT and
/// GRPO steps run with finite metrics; the first SFT loss agrees with the CPU's.
#[test]
fn trainer_runs_on_gpu() {
    if gpu().is_none() {
        return;
    }
    let mut cfg = RunConfig::tiny_arith();
    cfg.sft.steps = 30;
    cfg.run.steps = 3;
    cfg.run.eval_every = 2;
    let mut cpu = Trainer::new(cfg.clone(), None).unwrap();
    cfg.run.device = "cuda".into();
    let mut t = Trainer::new(cfg, None).unwrap();
    let first_cpu = cpu.next_step().unwrap().unwrap();
    let mut losses = Vec::new();
    let mut last = None;
    while let Some(m) = t.next_step() {
        let m = m.unwrap();
        assert!(m.loss.is_finite() && m.grad_norm.is_finite(), "{m:?}");
        losses.push((m.phase.clone(), m.loss));
        last = Some(m);
    }
    let first = losses[0].1;
    report(
        "trainer: first SFT loss, GPU vs CPU",
        ((first - first_cpu.loss) / first_cpu.loss).abs(),
        2e-2,
    );
    let sft_end = losses.iter().rfind(|(p, _)| p == "sft").unwrap().1;
    println!(
        "TRAINER | SFT loss {first:.4} -> {sft_end:.4}; last RL step {:?}",
        last.as_ref()
            .map(|m| (m.mismatch_kl, m.heldout_accuracy, m.rollout_tokens_per_s))
    );
    assert!(
        sft_end < first,
        "SFT loss did not fall: {first} -> {sft_end}"
    );
    let m = last.unwrap();
    assert!(m.mismatch_kl.unwrap().is_finite() && m.heldout_accuracy.is_some());
    // The rollout's paged cache: pages in use at peak, within the pool (room
    // for every sequence: nothing preempted).
    let (peak, pool) = (m.kv_peak_gib.unwrap(), m.kv_pool_gib.unwrap());
    println!("TRAINER | KV {peak:.3e} of {pool:.3e} GiB at peak");
    assert!(
        peak > 0.0 && peak <= pool,
        "KV peak {peak} GiB, pool {pool} GiB"
    );
    assert_eq!(m.rollout_preemptions, Some(0));
    // Host copies follow the device on demand.
    t.sync_host().unwrap();
    assert!(t
        .weights
        .tensors()
        .iter()
        .all(|(_, x)| x.iter().all(|v| v.is_finite())));
}

/// Greedy generation on the GPU against the CPU from the same weights, with
/// prompts of different lengths (packed prefill, per-slot KV cache, sequences
/// leaving the batch at different steps): the same tokens, logprobs within 1e-4.
#[test]
fn greedy_generation_matches_cpu() {
    let Some(g) = gpu() else { return };
    // tiny-arith's head_dim is 32; the other tests use 64.
    for hd in [64, 32] {
        greedy_case(
            &g,
            ModelConfig {
                head_dim: hd,
                ..tiny()
            },
        );
    }
}

fn greedy_case(g: &Arc<Gpu>, cfg: ModelConfig) {
    let hd = cfg.head_dim;
    let w0 = init_random(&cfg, 8);
    let dw = GpuWeights::upload(g, &w0).unwrap();
    let prompts: Vec<Vec<u32>> = (0..12)
        .map(|i| {
            (0..(2 + 3 * i % 17))
                .map(|j| 1 + ((i * 7 + j * 3) % 59) as u32)
                .collect()
        })
        .collect();
    let gen = GenConfig {
        max_new_tokens: 20,
        sampling: SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
        },
        stop_token_ids: vec![5, 6],
        stop_strings: vec![],
        max_batch: 0,
    };
    for flow in [Flow::F32, Flow::Fp8] {
        let cpu_model = PreparedModel::new(&cfg, &w0, flow);
        let mut r1 = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let cpu = jet_backend::rollout::engine::generate(
            &cpu_model,
            &prompts,
            1,
            &gen,
            &|_| String::new(),
            &mut r1,
        );
        let model = GpuModel::new(g, &cfg, &dw, flow).unwrap();
        let gpu = generate_gpu(&model, &prompts, 1, &gen, 1);
        let same = cpu
            .iter()
            .zip(&gpu)
            .filter(|(a, b)| a.tokens == b.tokens)
            .count();
        let lens: Vec<(usize, usize)> = cpu
            .iter()
            .zip(&gpu)
            .map(|(a, b)| (a.tokens.len(), b.tokens.len()))
            .collect();
        println!(
            "GREEDY | hd {hd} {} | {same}/{} samples identical | lengths {lens:?}",
            flow.name(),
            cpu.len()
        );
        let mut worst = 0f64;
        for (a, b) in cpu.iter().zip(&gpu) {
            for ((ta, la), (tb, lb)) in a
                .tokens
                .iter()
                .zip(&a.logprobs)
                .zip(b.tokens.iter().zip(&b.logprobs))
            {
                if ta != tb {
                    break;
                }
                worst = worst.max((la - lb).abs() as f64);
            }
        }
        report(
            &format!(
                "hd {hd} {}: greedy logprobs GPU vs CPU (common prefix)",
                flow.name()
            ),
            worst,
            if flow == Flow::F32 { 1e-4 } else { 5e-2 },
        );
        if flow == Flow::F32 {
            assert_eq!(same, cpu.len(), "greedy f32 generations differ");
        }
    }
}

/// Top-k / top-p on the device (`sample_top` over each row's kept set), end to end at
/// Qwen3-0.6B widths in the fp8 flow: top-k 1 at temperature 1 keeps only the
/// argmax (lowest index on ties), so its samples have greedy's bits, tokens and
/// logprobs; top-p 0.9 with top-k 40 at temperature 0.8 gives the same samples for
/// the same seed and other samples for another.
#[test]
fn top_k_and_top_p_sample_on_the_device() {
    let Some(g) = gpu() else { return };
    let cfg = qwen3_widths();
    let w0 = init_random(&cfg, 14);
    let dw = GpuWeights::upload(&g, &w0).unwrap();
    let prompts: Vec<Vec<u32>> = (0..9)
        .map(|i| {
            (0..(3 + 2 * i % 11))
                .map(|j| 1 + ((i * 13 + j * 7) % 4000) as u32)
                .collect()
        })
        .collect();
    let model = GpuModel::new(&g, &cfg, &dw, Flow::Fp8).unwrap();
    let gen = |temperature, top_p, top_k| GenConfig {
        max_new_tokens: 16,
        sampling: SamplingParams {
            temperature,
            top_p,
            top_k,
        },
        stop_token_ids: vec![3, 5],
        stop_strings: vec![],
        max_batch: 0,
    };
    let greedy = sample_bits(&generate_gpu(&model, &prompts, 2, &gen(0.0, 1.0, 0), 1));
    let top1 = sample_bits(&generate_gpu(&model, &prompts, 2, &gen(1.0, 1.0, 1), 1));
    let differ = greedy.iter().zip(&top1).filter(|(a, b)| a != b).count();
    println!(
        "TOPK | top-k 1 vs greedy: {differ} of {} samples differ",
        greedy.len()
    );
    assert_eq!(differ, 0, "top-k 1 must draw greedy's tokens and logprobs");
    let nucleus = gen(0.8, 0.9, 40);
    let a = sample_bits(&generate_gpu(&model, &prompts, 2, &nucleus, 7));
    let b = sample_bits(&generate_gpu(&model, &prompts, 2, &nucleus, 7));
    let c = sample_bits(&generate_gpu(&model, &prompts, 2, &nucleus, 8));
    let other = a.iter().zip(&c).filter(|(x, y)| x.0 != y.0).count();
    println!(
        "TOPP | top-p 0.9 top-k 40 T 0.8: same seed identical {}, another seed changes {other} of {}",
        a == b,
        a.len()
    );
    assert_eq!(a, b, "top-p: the same seed must give the same samples");
    assert!(other > 0, "top-p: another seed changed no sample");
}

/// Continuous batching on the GPU: with at most 5 sequences live (finished ones'
/// slots refilled by prefills between decode steps), every greedy sample has the
/// bits it has when all 36 decode together in the fp8 flow, whose GEMMs are
/// batch-invariant by construction. bf16 and f32 are printed: their GEMMs are
/// cuBLASLt's, whose order for 1-5 rows against 36 is its heuristic's choice.
#[test]
fn continuous_batching_keeps_greedy_samples_bitwise() {
    let Some(g) = gpu() else { return };
    let cfg = tiny();
    let w0 = init_random(&cfg, 12);
    let dw = GpuWeights::upload(&g, &w0).unwrap();
    let prompts: Vec<Vec<u32>> = (0..12)
        .map(|i| {
            (0..(2 + 5 * i % 13))
                .map(|j| 1 + ((i * 11 + j * 5) % 59) as u32)
                .collect()
        })
        .collect();
    for flow in [Flow::F32, Flow::Bf16, Flow::Fp8] {
        let model = GpuModel::new(&g, &cfg, &dw, flow).unwrap();
        let run = |max_batch: usize| {
            let gen = GenConfig {
                max_new_tokens: 24,
                sampling: SamplingParams {
                    temperature: 0.0,
                    top_p: 1.0,
                    top_k: 0,
                },
                stop_token_ids: vec![3, 5, 6, 7],
                stop_strings: vec![],
                max_batch,
            };
            sample_bits(&generate_gpu(&model, &prompts, 3, &gen, 1))
        };
        let all = run(0);
        let few = run(5);
        let differ = all.iter().zip(&few).filter(|(a, b)| a != b).count();
        let lens: Vec<usize> = all.iter().map(|x| x.0.len()).collect();
        println!(
            "CONTBATCH | {:<5} | max_batch 5 vs 36: {differ} of {} samples differ | lengths {lens:?}",
            flow.name(),
            all.len()
        );
        if flow == Flow::Fp8 {
            assert_eq!(differ, 0, "fp8: continuous batching changed samples");
        }
    }
}

/// 13 prompts of 2-8 tokens (the graph tests' batches shrink through buckets).
fn thirteen_prompts() -> Vec<Vec<u32>> {
    (0..13)
        .map(|i| {
            (0..(2 + 3 * i % 7))
                .map(|j| 1 + ((i * 7 + j * 3) % 53) as u32)
                .collect()
        })
        .collect()
}

/// Decode steps replayed as CUDA graphs give every sample the bits the same
/// steps give launched kernel by kernel: seeded sampling with stop tokens, so
/// the batch shrinks through the buckets (padding rows beside the real ones),
/// all at once and with at most 5 live (refills between steps), at the tiny
/// shape and at Qwen3-0.6B widths, in both flows with the tensor-core attention.
/// Graphs run ahead of the host (rows that stopped run one step more, dropped)
/// and graphs that wait for it give the same bits too, at temperature 1 and
/// 0.7 and with top-p 0.9 / top-k 40 at 0.8; some steps must have run ahead and
/// been kept.
#[test]
fn decode_graphs_equal_launched_steps_bitwise() {
    let Some(g) = gpu() else { return };
    let wide = qwen3_widths();
    let prompts = thirteen_prompts();
    for cfg in [tiny(), wide] {
        let dw = GpuWeights::upload(&g, &init_random(&cfg, 21)).unwrap();
        for flow in [Flow::Bf16, Flow::Fp8] {
            let model = GpuModel::new(&g, &cfg, &dw, flow).unwrap();
            assert!(
                model.flash_attention(),
                "the graph path needs the tensor-core attention"
            );
            // (max_batch, temperature, top_p, top_k): plain draws, and a truncated
            // one (sample_top over the log-softmax rows, ahead of the host too).
            for (max_batch, temperature, top_p, top_k) in [
                (0, 1.0, 1.0, 0),
                (5, 1.0, 1.0, 0),
                (0, 0.7, 1.0, 0),
                (5, 0.8, 0.9, 40),
            ] {
                let gen = GenConfig {
                    max_new_tokens: 20,
                    sampling: SamplingParams {
                        temperature,
                        top_p,
                        top_k,
                    },
                    // About one token in 13 ends a sample, at either vocabulary.
                    stop_token_ids: (3..cfg.vocab_size as u32).step_by(13).collect(),
                    stop_strings: vec![],
                    max_batch,
                };
                let bits = |graphs: bool, ahead: bool| {
                    let (s, kept) =
                        generate_gpu_graphs(&model, &prompts, 3, &gen, 4, graphs, ahead);
                    (sample_bits(&s), kept)
                };
                let ((ahead, kept), (graphed, _), (launched, _)) =
                    (bits(true, true), bits(true, false), bits(false, false));
                let count = |x: &[(Vec<u32>, Vec<u32>)]| {
                    x.iter().zip(&launched).filter(|(a, b)| a != b).count()
                };
                let (differ, differ_ahead) = (count(&graphed), count(&ahead));
                let lens: Vec<usize> = launched.iter().map(|x| x.0.len()).collect();
                println!(
                    "GRAPHS | {:<5} | hidden {} | max_batch {max_batch} | T {temperature} top-p {top_p} top-k {top_k} | {differ} of {} samples differ, {differ_ahead} run ahead ({kept} steps kept ahead) | lengths {lens:?}",
                    flow.name(),
                    cfg.hidden_size,
                    launched.len()
                );
                assert_eq!(graphed.len(), launched.len());
                assert_eq!(ahead.len(), launched.len());
                assert_eq!(differ, 0, "{}: graphs changed samples", flow.name());
                assert_eq!(
                    differ_ahead,
                    0,
                    "{}: steps ahead changed samples",
                    flow.name()
                );
                assert!(kept > 0, "{}: no step ran ahead", flow.name());
                assert!(
                    lens.iter().any(|&l| l < 20) && lens.iter().any(|&l| l > 3),
                    "stop tokens should end some samples early and not all at once: {lens:?}"
                );
            }
        }
    }
}

/// A run's rollouts after its first replay the decode graphs the first one
/// captured (`gpu::kept`: the KV cache lives at addresses reserved once, its
/// memory given back between rollouts, and the graphs are parked with them).
/// Over one model a second rollout captures nothing, replays every graph the
/// first captured and draws the same bits; one that needs a larger cache takes
/// new places and captures again; a smaller one then fits those places and
/// replays its graphs, still with the first rollout's bits; another model's
/// rollout replays none. BF16 and FP8 flows, responses ending at random
/// lengths so the batch shrinks through several buckets.
#[test]
fn decode_graphs_kept_across_rollouts_give_the_same_bits() {
    let Some(g) = gpu() else { return };
    let cfg = tiny();
    let prompts = thirteen_prompts();
    let gen = |max_new_tokens| GenConfig {
        max_new_tokens,
        sampling: SamplingParams::default(),
        stop_token_ids: (3..cfg.vocab_size as u32).step_by(13).collect(),
        stop_strings: vec![],
        max_batch: 0,
    };
    // (sample bits, graphs captured, graphs replayed from the rollout before).
    let run = |model: &GpuModel, new_tokens: usize| {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let mut dec = GpuDecoder::new(model);
        let max_pos = model.cfg.max_position_embeddings;
        let s = generate_with(
            &mut dec,
            max_pos,
            &prompts,
            3,
            &gen(new_tokens),
            &|_| String::new(),
            &mut rng,
        )
        .unwrap();
        let (captured, reused) = dec.graphs_captured();
        (sample_bits(&s), captured, reused)
    };
    let dw = GpuWeights::upload(&g, &init_random(&cfg, 21)).unwrap();
    let dw2 = GpuWeights::upload(&g, &init_random(&cfg, 22)).unwrap();
    // What an earlier rollout parked on the device (an earlier test's, the
    // last flow's): replaced by a rollout of another shape, whose cache places
    // hold none of this test's.
    let wide = qwen3_widths();
    let ww = GpuWeights::upload(&g, &init_random(&wide, 3)).unwrap();
    let reset = || {
        let m = GpuModel::new(&g, &wide, &ww, Flow::Bf16).unwrap();
        let mut dec = GpuDecoder::new(&m);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let one = [vec![1, 2]];
        generate_with(&mut dec, 64, &one, 1, &gen(2), &|_| String::new(), &mut rng).unwrap();
    };
    for flow in [Flow::Bf16, Flow::Fp8] {
        reset();
        let model = GpuModel::new(&g, &cfg, &dw, flow).unwrap();
        let (first, c1, r1) = run(&model, 20);
        let (second, c2, r2) = run(&model, 20);
        let (_, c3, r3) = run(&model, 90);
        let (fourth, c4, r4) = run(&model, 20);
        let other = GpuModel::new(&g, &cfg, &dw2, flow).unwrap();
        let (_, c5, r5) = run(&other, 20);
        println!(
            "KEPT | {:<5} | captured / replayed: {c1} / -, {c2} / {r2}, longer {c3} / {r3}, shorter {c4} / {r4}, other model {c5} / {r5}",
            flow.name()
        );
        let lens: Vec<usize> = first.iter().map(|x| x.0.len()).collect();
        assert_eq!(r1, 0, "{}: nothing of this model was kept", flow.name());
        assert!(
            c1 >= 2,
            "{}: the batch should pass several buckets: {lens:?}",
            flow.name()
        );
        assert_eq!(
            (c2, r2),
            (0, c1),
            "{}: the second rollout captures nothing",
            flow.name()
        );
        assert_eq!(
            second,
            first,
            "{}: replayed graphs changed samples",
            flow.name()
        );
        assert!(
            c3 > 0 && r3 == 0,
            "{}: a larger cache takes new places",
            flow.name()
        );
        assert!(
            r4 > 0,
            "{}: a smaller cache fits the larger one's places",
            flow.name()
        );
        assert_eq!(
            fourth,
            first,
            "{}: graphs over the larger places changed samples",
            flow.name()
        );
        assert_eq!(
            r5,
            0,
            "{}: another model's weights are elsewhere",
            flow.name()
        );
        assert!(c5 > 0);
    }
}

/// The paged KV cache: prompts of 20-130 tokens (pages of 64 rows partly and
/// wholly filled, three samples each sharing their prompt's full pages), greedy
/// to 120 new tokens, with room for every sequence and under budgets of 16 and
/// 12 pages (of a worst case of 72), where the engine admits what fits and
/// preempts the youngest sequences, prefilling them again later. The pool is
/// never overdrawn and, in the BF16 and FP8 flows (batch-invariant), every
/// sample keeps its tokens and logprobs bit for bit and the training pass over
/// the preempted run's samples
/// gives its logprobs exactly (rollout == training under paging, sharing and
/// preemption).
#[test]
fn paged_cache_under_a_budget_keeps_samples_bitwise() {
    let Some(g) = gpu() else { return };
    let cfg = ModelConfig {
        max_position_embeddings: 300,
        ..tiny()
    };
    let dw = GpuWeights::upload(&g, &init_random(&cfg, 31)).unwrap();
    let prompts: Vec<Vec<u32>> = [50usize, 64, 70, 128, 130, 20]
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| 1 + ((i * 13 + j * 7) % 59) as u32).collect())
        .collect();
    for flow in [Flow::F32, Flow::Bf16, Flow::Fp8] {
        let model = GpuModel::new(&g, &cfg, &dw, flow).unwrap();
        let page = jet_backend::gpu::decode::GpuKvCache::page_bytes(&model);
        let run = |max_batch: usize, pages: Option<usize>| {
            let gen = GenConfig {
                max_new_tokens: 120,
                sampling: SamplingParams {
                    temperature: 0.0,
                    top_p: 1.0,
                    top_k: 0,
                },
                stop_token_ids: vec![],
                stop_strings: vec![],
                max_batch,
            };
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
            let mut dec = GpuDecoder::new(&model).with_kv_cache_bytes(pages.map(|p| p * page));
            let out = generate_with(
                &mut dec,
                cfg.max_position_embeddings,
                &prompts,
                3,
                &gen,
                &|_| String::new(),
                &mut rng,
            )
            .unwrap();
            let u = dec.kv_use().unwrap();
            let rows = (u.prefill_rows, u.prefill_rows_asked);
            (
                out,
                dec.preemptions(),
                u.pages_peak,
                u.pages,
                rows.0,
                rows.1,
            )
        };
        let (all, short, _, _, rows, asked) = run(0, None);
        assert_eq!(short, 0, "{}: room for every sequence", flow.name());
        assert_eq!(
            asked,
            3 * rows,
            "{}: each prompt prefilled once",
            flow.name()
        );
        for (max_batch, pages) in [(0, 16), (5, 12)] {
            let (got, short, peak, pool, _, _) = run(max_batch, Some(pages));
            let differ = sample_bits(&got)
                .iter()
                .zip(&sample_bits(&all))
                .filter(|(a, b)| a != b)
                .count();
            println!(
                "PAGED | {:<5} | max_batch {max_batch} | {pages} pages | {short} preempted | peak {peak} of {pool} pages | {differ} of {} samples differ",
                flow.name(),
                got.len()
            );
            assert!(short > 0, "{}: {pages} pages should preempt", flow.name());
            assert!(
                peak <= pool && pool < pages,
                "{}: peak {peak}, pool {pool}",
                flow.name()
            );
            // The f32 flow's GEMMs are not batch-invariant (a re-prefill's rows
            // may round apart from the decode steps'): printed, not asserted.
            if flow != Flow::F32 {
                assert_eq!(differ, 0, "{}: paging changed a greedy sample", flow.name());
                let seqs = TrainSeq::of_samples(&prompts, &got);
                let sc = run_pass_gpu(&model, &seqs, 1.0, 8, None).unwrap();
                let train: Vec<f64> = sc.logp.iter().flatten().copied().collect();
                let roll: Vec<f64> = got
                    .iter()
                    .flat_map(|s| s.logprobs.iter().map(|&x| x as f64))
                    .collect();
                let max_abs = train
                    .iter()
                    .zip(&roll)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                report(
                    &format!(
                        "{} paged and preempted: rollout vs training max |dlogp|",
                        flow.name()
                    ),
                    max_abs,
                    0.0,
                );
            }
        }
    }
}

/// A GRPO group's prompt run once in training (`gpu::share`): the training pass
/// with the sequences' shared prompt rows kept once gives the unshared pass's
/// logprobs and entropies bit for bit (the forward's rows are the same bits, so
/// rollout == training holds either way) and its gradients to rounding (the
/// shared rows' dk, dv summed before their backward, FP8's WGrad groups formed
/// over fewer rows), for the three layer layouts (q/k norms; none; q, k, v
/// biases), head_dim 64 and 128, a prompt longer than an attention tile and a
/// group split over two micro-batches (where it is larger than one).
#[test]
fn shared_prompt_rows_give_the_unshared_pass() {
    use jet_backend::gpu::pass::run_pass_gpu_with;
    let Some(g) = gpu() else { return };
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(17);
    let mut tok = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| rand::Rng::random_range(&mut r, 1..61u32))
            .collect()
    };
    // Three prompts (70, 5 and 2 tokens) with 3, 3 and 2 samples of 1 to 40 tokens,
    // in groups, then one sequence of its own.
    let mut seqs = Vec::new();
    for (p, lens) in [
        (70usize, [1usize, 17, 40]),
        (5, [9, 30, 2]),
        (2, [12, 3, 0]),
    ] {
        let prompt = tok(p);
        for &n in lens.iter().filter(|&&n| n > 0) {
            seqs.push(TrainSeq {
                tokens: [prompt.clone(), tok(n)].concat(),
                prompt_len: p,
            });
        }
    }
    seqs.push(TrainSeq {
        tokens: tok(20),
        prompt_len: 6,
    });
    let adv: Vec<f64> = (0..seqs.len()).map(|i| 1.0 - 0.3 * i as f64).collect();
    let layouts = [
        ("qwen3 hd64", tiny()),
        ("qwen3 0.6B widths", qwen3_widths()),
        (
            "llama",
            ModelConfig {
                arch: Arch::Llama,
                qk_norm: false,
                ..tiny()
            },
        ),
        (
            "qwen2",
            ModelConfig {
                arch: Arch::Qwen2,
                qk_norm: false,
                attention_bias: true,
                ..tiny()
            },
        ),
    ];
    for (name, cfg) in layouts {
        let cfg = ModelConfig {
            vocab_size: 61,
            max_position_embeddings: 128,
            ..cfg
        };
        let w0 = init_random(&cfg, 8);
        for (flow, bound) in [(Flow::Bf16, 2e-2), (Flow::Fp8, 5e-2)] {
            let dw = GpuWeights::upload(&g, &w0).unwrap();
            let model = GpuModel::new(&g, &cfg, &dw, flow).unwrap();
            // Micro-batches of 4 (each group whole) and of 2 (the first group split
            // over two), at temperature 1 (the logits kept as BF16 values) and 0.8
            // (f32, divided in place), with gradients and without (no activations
            // kept).
            let pass = |share: bool, t: f64, with_grad: bool, micro: usize| {
                let mut dg = GpuGrads::zeros_like(&g, &dw).unwrap();
                let mut gf =
                    |i: usize, t: usize, _lp: f64, _e: f64| (-adv[i] / (1 + t) as f64, 0.01);
                let grad = with_grad.then_some((PassLoss::Host(&mut gf), &mut dg));
                let sc = run_pass_gpu_with(&model, &seqs, (t, micro.into()), grad, share)
                    .and_then(|p| p.wait())
                    .unwrap();
                let mut grads = ModelWeights::zeros(&cfg);
                dg.download_into(&g, &mut grads).unwrap();
                (sc, grads)
            };
            let bits = |v: &[Vec<f64>]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
            let mut worst = (0.0, String::new());
            for (t, with_grad, micro) in [(1.0, true, 4), (0.8, true, 2), (1.0, false, 4)] {
                let (s0, g0) = pass(false, t, with_grad, micro);
                let (s1, g1) = pass(true, t, with_grad, micro);
                let what = format!("{name} {flow} T {t} grad {with_grad} micro {micro}");
                assert_eq!(bits(&s1.logp), bits(&s0.logp), "{what}: logprobs");
                assert_eq!(bits(&s1.entropy), bits(&s0.entropy), "{what}: entropies");
                for ((n, a), (_, b)) in g1.tensors().into_iter().zip(g0.tensors()) {
                    let e = if with_grad { rel(a, b) } else { 0.0 };
                    if e > worst.0 {
                        worst = (e, format!("T {t}, {n}"));
                    }
                }
            }
            report(
                &format!("{name} {flow}: shared vs unshared ({})", worst.1),
                worst.0,
                bound,
            );
        }
    }
}

/// Bits apart of two f32 of one sign (the count of representable values between).
fn ulps(a: f32, b: f32) -> u64 {
    if a == b {
        return 0;
    }
    match a.is_sign_negative() == b.is_sign_negative() {
        true => (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs(),
        false => u64::MAX,
    }
}

/// The policy loss's settings over the tests: plain, every term on, a narrow clip
/// range with a cap the weights often pass, the entropy bonus alone.
fn loss_configs() -> [LossConfig; 4] {
    let plain = LossConfig {
        clip_low: 0.2,
        clip_high: 0.28,
        tis_cap: None,
        kl_coef: 0.0,
        entropy_coef: 0.0,
    };
    [
        plain,
        LossConfig {
            tis_cap: Some(2.0),
            kl_coef: 0.1,
            entropy_coef: 0.01,
            ..plain
        },
        LossConfig {
            clip_low: 0.1,
            clip_high: 0.1,
            tis_cap: Some(1.05),
            kl_coef: 0.05,
            entropy_coef: 0.0,
        },
        LossConfig {
            entropy_coef: 0.02,
            ..plain
        },
    ]
}

/// The `policy_loss` kernel against `rl::loss::token_loss`, token by token, over
/// ratios on both sides of the clip range with positive, negative and zero
/// advantages, capped and uncapped importance weights, KL and entropy terms on
/// and off, and no old logprobs (ratio 1): dentropy and `clipped` exactly, dlogp
/// within 1 ulp of f32 (the device's and the host's `exp` may differ in the last
/// bit of f64, which can move the rounding to f32 by one), the loss and KL terms
/// within 1e-12 relative (plus 1e-15 absolute: k3's `exp(x) - x - 1` cancels near
/// 0). The launch reads and writes only its tokens `at..at + r` of the pass.
#[test]
fn policy_loss_kernel_matches_token_loss() {
    let Some(g) = gpu() else { return };
    let (at, r, tail) = (5usize, 96usize, 3usize);
    let total = at + r + tail;
    let n_tokens = 37;
    // Token j of the launch: logp, entropy (f32, as the forward's), and pass-wide
    // arrays whose entries at..at + r are its (the others junk).
    let frac = |j: usize, m: usize| ((j * m) % r) as f64 / r as f64;
    let logp: Vec<f32> = (0..r).map(|j| -0.05 - 0.06 * j as f32).collect();
    let ent: Vec<f32> = (0..r).map(|j| 0.1 + 0.03 * j as f32).collect();
    let pass = |f: &dyn Fn(usize) -> f64| -> Vec<f64> {
        (0..total)
            .map(|k| match k.checked_sub(at).filter(|&j| j < r) {
                Some(j) => f(j),
                None => 7.5,
            })
            .collect()
    };
    // logp - old over [-0.6, 0.6]: ratios 0.55 to 1.8.
    let old = pass(&|j| logp[j] as f64 + 0.6 - 1.2 * frac(j, 7));
    let rollout = pass(&|j| old[at + j] - 0.8 + 1.6 * frac(j, 13));
    let reference = pass(&|j| logp[j] as f64 - 0.5 + frac(j, 5));
    let adv = pass(&|j| [1.0, -0.7, 0.0, 2.5, -1.5][j % 5]);
    let up = |x: &Vec<f64>| g.upload(x).unwrap();
    let (d_old, d_roll, d_ref, d_adv) = (up(&old), up(&rollout), up(&reference), up(&adv));
    let (d_lp, d_ent) = (g.upload(&logp).unwrap(), g.upload(&ent).unwrap());
    // Ratios outside the clip range: [advantage > 0][above the range] seen (the
    // clipped term is the smaller, with no gradient, where the two agree).
    let mut corners = [[false; 2]; 2];
    for cfg in loss_configs() {
        for (with_old, with_ref) in [(false, false), (true, false), (false, true), (true, true)] {
            let inputs = LossInputs {
                logp_old: with_old.then_some(&d_old),
                logp_rollout: &d_roll,
                logp_ref: with_ref.then_some(&d_ref),
                advantage: &d_adv,
            };
            let mut terms = DeviceLossTerms::alloc(&g, total).unwrap();
            let set = loss_settings(&cfg);
            let fwd = (&d_lp, &d_ent);
            let d = policy_loss(&g, &set, n_tokens, fwd, (at, r), &inputs, &mut terms).unwrap();
            let dlogp = g.download_n(&d.dlogp, r).unwrap();
            let dent = g.download_n(&d.dentropy, r).unwrap();
            let loss = g.download_n(&terms.loss, total).unwrap();
            let kl = g.download_n(&terms.kl, total).unwrap();
            let clipped = g.download_n(&terms.clipped, total).unwrap();
            let what = format!("{cfg:?} old {with_old} ref {with_ref}");
            let (mut off_by_one, mut worst) = (0, 0.0f64);
            for j in 0..r {
                let k = at + j;
                let lp = logp[j] as f64;
                let ti = TokenInput {
                    logp: lp,
                    logp_old: if with_old { old[k] } else { lp },
                    logp_rollout: rollout[k],
                    logp_ref: with_ref.then_some(reference[k]),
                    advantage: adv[k],
                };
                let h = token_loss(&cfg, ti, ent[j] as f64, n_tokens);
                let u = ulps(dlogp[j], h.dlogp as f32);
                assert!(
                    u <= 1,
                    "{what} token {j}: dlogp {} vs {}",
                    dlogp[j],
                    h.dlogp
                );
                off_by_one += u as usize;
                assert_eq!(dent[j].to_bits(), (h.dentropy as f32).to_bits(), "{what}");
                assert_eq!(clipped[k] != 0, h.clipped, "{what} token {j}: clipped");
                for (name, dv, hv) in [("loss", loss[k], h.loss), ("kl", kl[k], h.kl)] {
                    let e = (dv - hv).abs();
                    assert!(
                        e <= 1e-12 * hv.abs() + 1e-15,
                        "{what} token {j}: {name} {dv:e} vs {hv:e}"
                    );
                    worst = worst.max(e / hv.abs().max(1e-300));
                }
                let ratio = (lp - ti.logp_old).exp();
                let outside = ratio < 1.0 - cfg.clip_low || ratio > 1.0 + cfg.clip_high;
                if outside && ti.advantage != 0.0 {
                    corners[(ti.advantage > 0.0) as usize][(ratio > 1.0) as usize] = true;
                }
            }
            // The pass's other tokens are not this launch's.
            let outside = (0..total).filter(|k| !(at..at + r).contains(k));
            for k in outside {
                assert!(loss[k] == 0.0 && kl[k] == 0.0 && clipped[k] == 0, "{what}");
            }
            println!(
                "PARITY | policy loss {what}: {off_by_one} dlogp 1 ulp apart of {r}, \
                 loss/kl {worst:.1e} relative"
            );
        }
    }
    assert_eq!(
        corners, [[true; 2]; 2],
        "ratios outside the range at each end, each sign"
    );
}

/// A GPU pass whose policy loss runs on the device (`PassLoss::Policy`: no host
/// round trip inside the pass) against the same pass with the loss as a host
/// closure (`token_loss`, as rl_step computed it before): the same logprobs and
/// entropies bit for bit, the same clipped count, the loss and KL sums within
/// 1e-12 relative, and the same gradients: bit for bit where the kernel's dlogp
/// are the host's for every token (checked by running the kernel alone on the
/// pass's logprobs), else within 1e-5 relative a tensor (a dlogp 1 ulp apart
/// moves its row's gradient by 2^-24 of it). `PassLoss::Const` is its closure,
/// bit for bit. Flows F32, BF16 and FP8, temperature 0.8, two micro-batches.
#[test]
fn device_loss_pass_matches_host_closure() {
    let Some(g) = gpu() else { return };
    let cfg = tiny();
    let w0 = init_random(&cfg, 3);
    let seqs = seqs();
    let n_tok: usize = seqs.iter().map(|s| s.response_len()).sum();
    let adv = [1.0f64, -0.5, 0.25];
    let lc = loss_configs()[1];
    let grads_of = |dg: &mut GpuGrads| {
        let mut h = ModelWeights::zeros(&cfg);
        dg.download_into(&g, &mut h).unwrap();
        h
    };
    let bits = |v: &[Vec<f64>]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
    for flow in [Flow::F32, Flow::Bf16, Flow::Fp8] {
        let dw = GpuWeights::upload(&g, &w0).unwrap();
        let model = GpuModel::new(&g, &cfg, &dw, flow).unwrap();
        let s0 = run_pass_gpu(&model, &seqs, 0.8, 2, None).unwrap();
        let moved = |spread: f64, m: usize| -> Vec<Vec<f64>> {
            let each = s0.logp.iter().enumerate();
            each.map(|(i, v)| {
                let at = |t: usize| ((i * 31 + t * m) % 17) as f64 / 16.0;
                v.iter()
                    .enumerate()
                    .map(|(t, &x)| x + spread * (2.0 * at(t) - 1.0))
                    .collect()
            })
            .collect()
        };
        let (old, rollout, reference) = (moved(0.4, 7), moved(0.5, 5), moved(0.3, 3));
        for logp_old in [None, Some(old.as_slice())] {
            let what = format!("{flow} old {}", logp_old.is_some());
            let pl = PolicyLoss {
                cfg: lc,
                n_tokens: n_tok,
                base: 0,
                logp_old,
                logp_rollout: &rollout,
                logp_ref: Some(&reference),
                advantage: &adv,
            };
            let mut dg_d = GpuGrads::zeros_like(&g, &dw).unwrap();
            let loss = PassLoss::Policy(pl);
            let sd = run_pass_gpu(&model, &seqs, 0.8, 2, Some((loss, &mut dg_d))).unwrap();
            let (mut loss_h, mut clipped_h, mut kl_h) = (0.0, 0usize, 0.0);
            let mut gf = |i: usize, t: usize, lp: f64, e: f64| {
                let l = pl.token(i, t, lp, e);
                loss_h += l.loss;
                clipped_h += l.clipped as usize;
                kl_h += l.kl;
                (l.dlogp, l.dentropy)
            };
            let mut dg_h = GpuGrads::zeros_like(&g, &dw).unwrap();
            let host = PassLoss::Host(&mut gf);
            let sh = run_pass_gpu(&model, &seqs, 0.8, 2, Some((host, &mut dg_h))).unwrap();
            assert_eq!(bits(&sd.logp), bits(&sh.logp), "{what}: logprobs");
            assert_eq!(bits(&sd.entropy), bits(&sh.entropy), "{what}: entropies");
            let mut stats = LossStats::default();
            stats.add(&sd.terms);
            assert_eq!(stats.clipped, clipped_h, "{what}: clipped");
            for (name, d, h) in [("loss", stats.loss, loss_h), ("kl", stats.kl, kl_h)] {
                report(&format!("{what}: {name} sum"), ((d - h) / h).abs(), 1e-12);
            }
            // The kernel alone on the pass's logprobs: are its dlogp the host's?
            let flat32 = |v: &[Vec<f64>]| v.iter().flatten().map(|&x| x as f32).collect::<Vec<_>>();
            let (lp, en) = (flat32(&sd.logp), flat32(&sd.entropy));
            let inputs = PolicyInputs::of(&pl, &seqs).unwrap().upload(&g).unwrap();
            let mut terms = DeviceLossTerms::alloc(&g, n_tok).unwrap();
            let fwd = (&g.upload(&lp).unwrap(), &g.upload(&en).unwrap());
            let set = loss_settings(&lc);
            let view = inputs.view();
            let d = policy_loss(&g, &set, n_tok, fwd, (0, n_tok), &view, &mut terms).unwrap();
            let dlogp = g.download_n(&d.dlogp, n_tok).unwrap();
            let mut k = 0;
            let mut apart = 0;
            for (i, s) in seqs.iter().enumerate() {
                for t in 0..s.response_len() {
                    let h = pl.token(i, t, lp[k] as f64, en[k] as f64).dlogp as f32;
                    apart += (dlogp[k].to_bits() != h.to_bits()) as usize;
                    k += 1;
                }
            }
            let (gd, gh) = (grads_of(&mut dg_d), grads_of(&mut dg_h));
            let mut worst = 0.0f64;
            for ((name, a), (_, b)) in gd.tensors().into_iter().zip(gh.tensors()) {
                if apart == 0 {
                    let same = a
                        .iter()
                        .zip(b.iter())
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "{what}: gradient {name} differs with every dlogp equal"
                    );
                }
                worst = worst.max(rel(a, b));
            }
            println!("PARITY | {what}: {apart} of {n_tok} dlogp 1 ulp from the host's");
            report(
                &format!("{what}: gradients, device vs host loss"),
                worst,
                1e-5,
            );
        }
        // The constant gradient: the same bits as its closure.
        let c = (-1.0 / n_tok as f64, 0.0);
        let mut dg_c = GpuGrads::zeros_like(&g, &dw).unwrap();
        let konst = PassLoss::Const {
            dlogp: c.0,
            dentropy: c.1,
        };
        let sc = run_pass_gpu(&model, &seqs, 0.8, 2, Some((konst, &mut dg_c))).unwrap();
        let mut gf = |_: usize, _: usize, _: f64, _: f64| c;
        let mut dg_h = GpuGrads::zeros_like(&g, &dw).unwrap();
        let sh = run_pass_gpu(
            &model,
            &seqs,
            0.8,
            2,
            Some((PassLoss::Host(&mut gf), &mut dg_h)),
        );
        assert_eq!(
            bits(&sc.logp),
            bits(&sh.unwrap().logp),
            "{flow}: const logprobs"
        );
        let (a, b) = (grads_of(&mut dg_c), grads_of(&mut dg_h));
        for ((name, x), (_, y)) in a.tensors().into_iter().zip(b.tensors()) {
            let same = x
                .iter()
                .zip(y.iter())
                .all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same, "{flow}: const gradient {name}");
        }
    }
}
