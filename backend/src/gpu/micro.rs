//! How many tokens a training micro-batch holds on the GPU when
//! `train.micro_batch_tokens = "auto"` (the default).
//!
//! A pass keeps every layer's activations for its backward, so its memory grows
//! with its tokens: at Qwen3-0.6B about 2.6 MB a token in the BF16 flows (28
//! layers of ~64 KB, and the LM head's BF16 logits and their gradient, ~0.6 MB),
//! so one micro-batch of a GRPO step's 64 sequences of 128 + up to 512 tokens
//! (~25K tokens) overdraws an 80 GB H100 (`bench/results/s40/call6-h100`). The
//! bound is the device's memory, less the run's resident state, over a per-token
//! estimate with a margin. It depends on the model, the flow, the pass's kind
//! (temperature, batch invariance; without the tensor-core attention, its longest
//! sequence) and the device's size, never on what happens to be free (the pool
//! keeps what the rollout freed): a run resumed on the same GPU cuts its
//! micro-batches where the first did, so its gradients add in the same order.

use jet_kernels::cuda::flash::flash_supported;
use jet_kernels::cuda::{Gpu, Result};
use jet_kernels::ops::attention::AttnShape;
use jet_kernels::Flow;

use crate::config::MicroTokens;
use crate::model::ModelConfig;
use crate::trainer::pass::{micro_batches, Micro, TrainSeq};

/// Bytes each parameter keeps resident through a training step: f32 master
/// weights and the two AdamW moments (12), the gradient (an f32 accumulator
/// and a BF16 addend, 6) and the flow's prepared copy (BF16 2, or FP8 blocks 1
/// and their scales).
const RESIDENT_PER_PARAM: usize = 20;

/// Bytes a frozen reference (the KL penalty) keeps a parameter: its f32 weights
/// and a prepared copy.
const REFERENCE_PER_PARAM: usize = 6;

/// Left to the CUDA context, cuBLASLt's workspace, kernels and the pool's slack.
const FIXED_BYTES: usize = 2 << 30;

/// The estimate's margin: the measured peaks grew 1.00x (8B shapes at 4 layers)
/// and 1.07x (0.6B) the BF16 estimate a token between 8K and 16K tokens, 1.19x
/// at 0.6B between 4K and 8K (H100, `bench/results/s40`).
const MARGIN: f64 = 1.3;

/// The share of the device's memory a training pass may plan to use.
const USABLE: f64 = 0.9;

/// What a training pass keeps that its bytes a token depend on.
#[derive(Clone, Copy, Debug)]
pub struct PassKind {
    /// The flow trains with the tensor-core attention (BF16 activations,
    /// log-sum-exp kept); else f32 activations and each sequence's attention
    /// probabilities (`AttnSaved::Probs`), `4 nh L` bytes a token a layer.
    pub flash: bool,
    /// A temperature other than 1 divides the logits in place: f32 logits.
    pub tempered: bool,
    /// The batch-invariant kernels (`run.batch_invariant`, the default): gate,
    /// up and the logits kept as BF16 values; else in f32.
    pub invariant: bool,
    /// The pass's longest sequence (the probabilities' `L`).
    pub max_len: usize,
}

impl PassKind {
    /// The kind of a pass of `flow` over sequences of up to `max_len` tokens.
    pub fn of(
        cfg: &ModelConfig,
        flow: Flow,
        temperature: f64,
        invariant: bool,
        max_len: usize,
    ) -> Self {
        let shape = AttnShape {
            n_heads: cfg.num_attention_heads,
            n_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
        };
        PassKind {
            flash: flow != Flow::F32 && flash_supported(shape),
            tempered: temperature != 1.0,
            invariant,
            max_len,
        }
    }

    /// [`PassKind::of`] a pass over `seqs` (its longest sequence the `max_len`).
    pub fn of_seqs(
        cfg: &ModelConfig,
        flow: Flow,
        temperature: f64,
        invariant: bool,
        seqs: &[TrainSeq],
    ) -> Self {
        let longest = seqs.iter().map(|s| s.tokens.len()).max().unwrap_or(0);
        Self::of(cfg, flow, temperature, invariant, longest)
    }
}

/// Bytes a token of a training pass keeps until its backward (no margin).
///
/// With the tensor-core attention, a layer: the f32 residual stream at its input
/// and middle (x_in, h_mid); the norms' BF16 operands (a, b); q, k, v in BF16;
/// q and k before their norms in f32 with their rstd (`qk_pre`); the attention
/// output in f32 and BF16 and its log-sum-exp; gate and up (BF16, f32 without
/// batch invariance) and SwiGLU's BF16 output; the norms' rstd. FP8 keeps less
/// (no BF16 copies of a, b, the attention output or m) but its peak was not
/// measured alone: it takes BF16's. Without the tensor-core attention every one
/// of them is f32, and the probabilities are kept. Then the LM head: its logits
/// (BF16 values, or f32) and their gradient, the final norm's rows.
pub fn bytes_per_token(cfg: &ModelConfig, kind: PassKind) -> usize {
    let (h, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let qd = nh * cfg.head_dim;
    let kvd = nkv * cfg.head_dim;
    let qk_pre = 4 * (qd + kvd) + 4 * (nh + nkv);
    let layer = if kind.flash {
        let gate_up = if kind.invariant { 4 * inter } else { 8 * inter };
        8 * h + 4 * h + 2 * (qd + 2 * kvd) + qk_pre + 6 * qd + 4 * nh + gate_up + 2 * inter + 8
    } else {
        8 * h
            + 8 * h
            + 4 * (qd + 2 * kvd)
            + qk_pre
            + 4 * qd
            + 12 * inter
            + 8
            + 4 * nh * kind.max_len
    };
    // The logits' and their gradient's bytes a value.
    let (logits, dlogits) = match (kind.flash, kind.invariant && !kind.tempered) {
        (true, true) => (2, 2),
        (true, false) => (4, 2),
        (false, _) => (4, 4),
    };
    cfg.num_hidden_layers * layer + (logits + dlogits) * cfg.vocab_size + 8 * h
}

/// The auto bound for a device of `device_bytes`: what is left once the run's
/// resident state is in, over [`bytes_per_token`] with its margin; at least one
/// token (a sequence longer than the bound runs alone).
pub fn auto_micro_tokens(
    cfg: &ModelConfig,
    kind: PassKind,
    device_bytes: usize,
    reference: bool,
) -> usize {
    let left = left_for_passes(cfg, device_bytes, reference);
    ((left / (bytes_per_token(cfg, kind) as f64 * MARGIN)) as usize).max(1)
}

/// Bytes of a device of `device_bytes` a training pass may plan to use once the
/// run's resident state (and the fixed share) is in.
fn left_for_passes(cfg: &ModelConfig, device_bytes: usize, reference: bool) -> f64 {
    let per_param = RESIDENT_PER_PARAM + if reference { REFERENCE_PER_PARAM } else { 0 };
    let resident = cfg.param_count() * per_param + FIXED_BYTES;
    let usable = (device_bytes as f64 * USABLE) as usize;
    usable.saturating_sub(resident) as f64
}

/// WGrad outputs a matrix's gradient may hold before they are settled into its
/// f32 accumulator together (`GpuGrads::hold_cap`), for passes whose largest
/// micro-batch has `tokens` tokens on a device of `device_bytes`: one, plus as
/// many more of the matrices' BF16 outputs (2 bytes a parameter each) as fit in
/// what is left once the resident state and that micro-batch's activations
/// (the auto bound's estimate with its margin) are in; at most
/// `grad::HOLD_MAX`. Micro-batches sized by `train.micro_batch_tokens = "auto"`
/// leave no room (one: each settled before the next pass); small ones leave
/// room, and each held output saves a read and a write of the f32 gradient.
pub fn grad_hold(
    cfg: &ModelConfig,
    kind: PassKind,
    device_bytes: usize,
    reference: bool,
    tokens: usize,
) -> usize {
    let acts = bytes_per_token(cfg, kind) as f64 * tokens as f64 * MARGIN;
    let left = (left_for_passes(cfg, device_bytes, reference) - acts).max(0.0);
    let addend = (2 * cfg.param_count()).max(1) as f64;
    (1 + (left / addend) as usize).min(jet_kernels::cuda::grad::HOLD_MAX)
}

/// [`grad_hold`] on `gpu` for a pass over `seqs` in micro-batches of `micro`.
pub fn grad_hold_for(
    gpu: &Gpu,
    cfg: &ModelConfig,
    kind: PassKind,
    reference: bool,
    (seqs, micro): (&[TrainSeq], Micro),
) -> Result<usize> {
    let tokens = micro_batches(seqs, micro)
        .into_iter()
        .map(|r| seqs[r].iter().map(|s| s.tokens.len()).sum::<usize>())
        .max()
        .unwrap_or(0);
    Ok(grad_hold(cfg, kind, gpu.total_memory()?, reference, tokens))
}

/// A micro-batch's token bound on `gpu` for a pass of `kind`: `setting`'s
/// number, or for `"auto"` [`auto_micro_tokens`] at the device's size.
pub fn micro_tokens(
    setting: MicroTokens,
    gpu: &Gpu,
    cfg: &ModelConfig,
    kind: PassKind,
    reference: bool,
) -> Result<usize> {
    Ok(match setting {
        MicroTokens::Max(n) => n,
        MicroTokens::Auto => auto_micro_tokens(cfg, kind, gpu.total_memory()?, reference),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::preset;

    const GIB: usize = 1 << 30;

    fn kind(cfg: &ModelConfig, flow: Flow) -> PassKind {
        PassKind::of(cfg, flow, 1.0, true, 640)
    }

    /// The estimate against the peaks measured on an H100 (bench/results/s40, the
    /// BF16 flow first in each run): 0.6B 2.57 MB a token, 8B at 4 layers 1.37 MB;
    /// the auto bound for an 80 GB card lies between the 16K tokens that fit
    /// (52.8 GiB peak at 0.6B) and the 32K that did not.
    #[test]
    fn auto_bound_lies_between_what_fit_and_what_did_not() {
        let small = preset("qwen3-0.6b").unwrap();
        let per = bytes_per_token(&small, kind(&small, Flow::Bf16)) as f64;
        assert!((2.2e6..2.6e6).contains(&per), "0.6B: {per} bytes a token");
        let mut big = preset("qwen3-8b").unwrap();
        big.num_hidden_layers = 4;
        let per8 = bytes_per_token(&big, kind(&big, Flow::Bf16)) as f64;
        assert!(
            (1.25e6..1.45e6).contains(&per8),
            "8B-4l: {per8} bytes a token"
        );
        let h100 = 81_559 * (1 << 20);
        let n = auto_micro_tokens(&small, kind(&small, Flow::Bf16), h100, false);
        assert!((16_384..32_768).contains(&n), "0.6B on 80 GB: {n} tokens");
        // FP8 takes BF16's bound; a reference, a tempered or non-invariant pass, a
        // smaller card leave fewer tokens.
        assert_eq!(
            auto_micro_tokens(&small, kind(&small, Flow::Fp8), h100, false),
            n
        );
        assert!(auto_micro_tokens(&small, kind(&small, Flow::Bf16), h100, true) < n);
        let tempered = PassKind::of(&small, Flow::Bf16, 0.8, true, 640);
        assert!(auto_micro_tokens(&small, tempered, h100, false) < n);
        let loose = PassKind::of(&small, Flow::Bf16, 1.0, false, 640);
        assert!(auto_micro_tokens(&small, loose, h100, false) < n);
        assert!(auto_micro_tokens(&small, kind(&small, Flow::Bf16), 40 * GIB, false) < n);
        // The f32 flow keeps f32 activations and the attention's probabilities,
        // which grow with the longest sequence.
        let f32_640 = auto_micro_tokens(&small, kind(&small, Flow::F32), h100, false);
        let f32_4k = auto_micro_tokens(
            &small,
            PassKind::of(&small, Flow::F32, 1.0, true, 4096),
            h100,
            false,
        );
        assert!(f32_4k < f32_640 && f32_640 < n, "{f32_4k} {f32_640} {n}");
        // Held WGrad outputs: room for all eight beside a GRPO micro-batch of 1,152
        // tokens at 0.6B on 80 GB, none beside the auto bound's micro-batch, and none
        // where the state alone overdraws the card.
        let k = kind(&small, Flow::Bf16);
        assert_eq!(grad_hold(&small, k, h100, true, 1152), 8);
        assert_eq!(grad_hold(&small, k, h100, false, n), 1);
        let full8 = preset("qwen3-8b").unwrap();
        assert_eq!(
            grad_hold(&full8, kind(&full8, Flow::Fp8), h100, true, 512),
            1
        );
        // A model whose state alone overdraws the card still gets a token.
        assert_eq!(
            auto_micro_tokens(&full8, kind(&full8, Flow::Fp8), 40 * GIB, true),
            1
        );
    }
}
