//! Model-level checks: rollout and training agree bitwise where the flow says
//! they must, and the full backward matches finite differences.

use jet_kernels::{Flow, GemmRole};

use super::*;
use crate::model::{init_random, Arch, ModelConfig, ModelWeights};

pub(crate) fn tiny_config(arch: Arch, tied: bool) -> ModelConfig {
    ModelConfig {
        arch,
        vocab_size: 37,
        hidden_size: 24,
        intermediate_size: 40,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        rope_scaling: None,
        max_position_embeddings: 64,
        tie_word_embeddings: tied,
        attention_bias: arch == Arch::Qwen2,
        qk_norm: arch == Arch::Qwen3,
        bos_token_id: None,
        eos_token_ids: vec![0],
    }
}

/// Random weights with norms and biases away from 1 and 0, larger than HF's init
/// so that every path matters.
pub(crate) fn weights(cfg: &ModelConfig, seed: u64) -> ModelWeights {
    let mut w = init_random(cfg, seed);
    let mut s = seed;
    for (name, t) in w.tensors_mut() {
        for v in t.iter_mut() {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((s >> 33) as f64 / (1u64 << 31) as f64) as f32 - 0.5;
            *v = if name.contains("norm") {
                1.0 + 0.4 * u
            } else if name.contains("bias") {
                0.4 * u
            } else {
                *v * 4.0
            };
        }
    }
    w
}

fn rollout_logits(model: &PreparedModel, prompts: &[&[u32]], conts: &[&[u32]]) -> Vec<Vec<f32>> {
    // Prefill the prompts, then feed the continuations one token at a time with
    // sequences of different lengths dropping out, as the rollout engine does.
    let v = model.cfg.vocab_size;
    let (mut cache, last) = prefill(model, prompts, GemmRole::RolloutForward);
    let mut out: Vec<Vec<f32>> = (0..prompts.len())
        .map(|i| last[i * v..(i + 1) * v].to_vec())
        .collect();
    let steps = conts.iter().map(|c| c.len()).max().unwrap_or(0);
    for t in 0..steps {
        let active: Vec<usize> = (0..conts.len()).filter(|&i| t < conts[i].len()).collect();
        let toks: Vec<u32> = active.iter().map(|&i| conts[i][t]).collect();
        let l = decode_step(model, &mut cache, &active, &toks, GemmRole::RolloutForward);
        for (r, &i) in active.iter().enumerate() {
            out[i].extend_from_slice(&l[r * v..(r + 1) * v]);
        }
    }
    out
}

fn training_logits(model: &PreparedModel, prompts: &[&[u32]], conts: &[&[u32]]) -> Vec<Vec<f32>> {
    let v = model.cfg.vocab_size;
    let seqs: Vec<Vec<u32>> = prompts
        .iter()
        .zip(conts)
        .map(|(p, c)| [*p, *c].concat())
        .collect();
    let refs: Vec<&[u32]> = seqs.iter().map(|s| s.as_slice()).collect();
    let f = forward(model, &refs, GemmRole::TrainForward, false, false);
    let mut out = Vec::new();
    let mut start = 0;
    for (p, c) in prompts.iter().zip(conts) {
        // Logits that predict each continuation token and the one after.
        let r0 = start + p.len() - 1;
        out.push(f.logits[r0 * v..(r0 + c.len() + 1) * v].to_vec());
        start += p.len() + c.len();
    }
    out
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn rollout_equals_training_bitwise_when_the_flow_says_so() {
    let prompts: [&[u32]; 3] = [&[1, 2, 3], &[4, 5], &[6, 7, 8, 9, 10]];
    let conts: [&[u32]; 3] = [&[11, 12, 13, 14], &[15], &[16, 17, 18]];
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
        let cfg = tiny_config(arch, arch == Arch::Llama);
        let w = weights(&cfg, 3);
        for flow in [Flow::F32, Flow::Bf16, Flow::Fp8, Flow::Bf16Fp8Rollout] {
            let model = PreparedModel::new(&cfg, &w, flow);
            let r = rollout_logits(&model, &prompts, &conts);
            let t = training_logits(&model, &prompts, &conts);
            let same = r.iter().zip(&t).all(|(a, b)| bits(a) == bits(b));
            assert_eq!(
                same,
                flow.rollout_is_training_forward(),
                "{arch:?} {flow}: bitwise equal = {same}"
            );
        }
    }
}

#[test]
fn backward_matches_finite_differences() {
    // The ops are checked one by one in f64 (jet-kernels); here the composition is
    // checked in f32 along random directions, with f64 central differences.
    for (arch, tied) in [
        (Arch::Qwen3, false),
        (Arch::Llama, true),
        (Arch::Qwen2, false),
    ] {
        let cfg = tiny_config(arch, tied);
        let w = weights(&cfg, 11);
        let seqs: [&[u32]; 2] = [&[1, 5, 9, 2, 7], &[3, 3, 8]];
        let n_rows = 8;
        let mut s = 99u64;
        let mut rnd = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as f64 / (1u64 << 31) as f64 - 0.5
        };
        let dlogits: Vec<f32> = (0..n_rows * cfg.vocab_size).map(|_| rnd() as f32).collect();
        let loss = |w: &ModelWeights| -> f64 {
            let m = PreparedModel::new(&cfg, w, Flow::F32);
            let f = forward(&m, &seqs, GemmRole::TrainForward, false, false);
            f.logits
                .iter()
                .zip(&dlogits)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum()
        };
        let model = PreparedModel::new(&cfg, &w, Flow::F32);
        let f = forward(&model, &seqs, GemmRole::TrainForward, true, false);
        let g = backward(&model, f.acts.as_ref().unwrap(), &dlogits);
        // One direction per tensor, plus one over all tensors at once.
        let names: Vec<String> = w
            .tensors()
            .into_iter()
            .map(|(n, _)| n.to_string())
            .collect();
        for target in names.iter().map(Some).chain([None]) {
            let mut dir = ModelWeights::zeros(&cfg);
            let mut analytic = 0.0f64;
            let mut norm2 = 0.0f64;
            for (name, d) in dir.tensors_mut() {
                if target.is_some_and(|t| *t != name) {
                    continue;
                }
                for dv in d.iter_mut() {
                    *dv = rnd() as f32;
                    norm2 += (*dv as f64).powi(2);
                }
            }
            // A unit direction, so that the step's size does not grow with the tensor.
            for (_, d) in dir.tensors_mut() {
                for dv in d.iter_mut() {
                    *dv /= norm2.sqrt() as f32;
                }
            }
            for ((_, d), (_, gt)) in dir.tensors().into_iter().zip(g.tensors()) {
                analytic += d
                    .iter()
                    .zip(gt.iter())
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>();
            }
            let eps = 1e-2f32;
            let shifted = |sign: f32| {
                let mut w2 = w.clone();
                for ((_, t), (_, d)) in w2.tensors_mut().into_iter().zip(dir.tensors()) {
                    for (tv, dv) in t.iter_mut().zip(d.iter()) {
                        *tv += sign * eps * dv;
                    }
                }
                loss(&w2)
            };
            let fd = (shifted(1.0) - shifted(-1.0)) / (2.0 * eps as f64);
            let what = target.map_or("all tensors".to_string(), |t| t.clone());
            assert!(
                (fd - analytic).abs() <= 1e-2 * fd.abs().max(analytic.abs()) + 1e-3,
                "{arch:?} {what}: analytic {analytic} vs finite difference {fd}"
            );
        }
    }
}

#[test]
fn head_rows_give_those_rows_logits_and_the_same_gradients() {
    // The LM head over some rows only (a trainer's scored rows): each row's logits
    // are the bits of the full forward's row in every flow, and the gradients are
    // those of the full backward with zero dlogits on the other rows (to f32
    // rounding: the head's WGrad sums fewer rows, so in another order).
    let seqs: [&[u32]; 3] = [&[1, 5, 9, 2, 7], &[3, 3, 8], &[4, 6, 10, 12]];
    let rows = [2usize, 3, 5, 6, 9, 10];
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
        let cfg = tiny_config(arch, arch == Arch::Llama);
        let v = cfg.vocab_size;
        let w = weights(&cfg, 5);
        for flow in [Flow::F32, Flow::Bf16, Flow::Fp8] {
            let model = PreparedModel::new(&cfg, &w, flow);
            let full = forward(&model, &seqs, GemmRole::TrainForward, true, false);
            let part = forward_rows(
                &model,
                &seqs,
                GemmRole::TrainForward,
                (true, false),
                Some(&rows),
            );
            assert_eq!(part.logits.len(), rows.len() * v);
            for (j, &r) in rows.iter().enumerate() {
                assert_eq!(
                    bits(&part.logits[j * v..(j + 1) * v]),
                    bits(&full.logits[r * v..(r + 1) * v]),
                    "{arch:?} {flow}: logits of row {r}"
                );
            }
            if flow == Flow::Fp8 {
                // Its head WGrad quantizes dlogits in groups along the rows it reads,
                // so fewer rows regroup them: not comparable at f32 rounding.
                continue;
            }
            let dpart: Vec<f32> = (0..rows.len() * v)
                .map(|i| ((i * 7919 % 103) as f32 - 51.0) / 50.0)
                .collect();
            let mut dfull = vec![0.0f32; full.logits.len()];
            for (j, &r) in rows.iter().enumerate() {
                dfull[r * v..(r + 1) * v].copy_from_slice(&dpart[j * v..(j + 1) * v]);
            }
            let gp = backward(&model, part.acts.as_ref().unwrap(), &dpart);
            let gf = backward(&model, full.acts.as_ref().unwrap(), &dfull);
            for ((name, a), (_, b)) in gp.tensors().into_iter().zip(gf.tensors()) {
                let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-6);
                let worst = a
                    .iter()
                    .zip(b.iter())
                    .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
                let tol = if flow == Flow::F32 { 1e-5 } else { 1e-2 };
                assert!(
                    worst <= tol * scale,
                    "{arch:?} {flow} {name}: differs by {worst} (largest {scale})"
                );
            }
        }
    }
}
