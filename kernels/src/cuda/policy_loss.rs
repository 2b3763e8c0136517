//! The GRPO policy loss of each scored token on the GPU (`policy_loss.cu`): the
//! PPO clipped surrogate, an optional truncated importance weight, an optional k3
//! KL to a reference and an entropy bonus, scaled by `1 / n_tokens`. The host's
//! specification is `rl::loss::token_loss` in jet-backend (this crate cannot
//! depend on it; its GPU tests hold the two together): the kernel follows it
//! operation for operation in f64, so the gradient of a GPU pass needs no host
//! round trip between its forward and its backward.

use cudarc::driver::CudaSlice;

use super::context::{Arg, POLICY_LOSS};
use super::tensor::{grid, BLOCK};
use super::{check_len, ensure, Gpu, Result};

/// The loss's settings (those of `rl::loss::LossConfig`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossSettings {
    pub clip_low: f64,
    pub clip_high: f64,
    /// Cap of the truncated importance weight; `None`: no weight (1).
    pub tis_cap: Option<f64>,
    pub kl_coef: f64,
    pub entropy_coef: f64,
}

/// Per-token inputs over a pass's scored tokens, each `[n]` f64 in the pass's
/// token order (sequence after sequence); a launch reads `[at, at + r)`.
pub struct LossInputs<'a> {
    /// The logprobs the ratio is taken against; `None`: the token's own (ratio 1).
    pub logp_old: Option<&'a CudaSlice<f64>>,
    /// The rollout's logprobs (the importance weight's denominator).
    pub logp_rollout: &'a CudaSlice<f64>,
    /// The reference policy's logprobs; `None`: no KL term.
    pub logp_ref: Option<&'a CudaSlice<f64>>,
    /// The token's sequence's advantage.
    pub advantage: &'a CudaSlice<f64>,
}

/// Per-token statistics over a pass's scored tokens, each `[n]`: the loss term
/// (times `1 / n_tokens`), the k3 KL (0 without the term) and whether the clipped
/// surrogate was the smaller (1) or not (0).
pub struct LossTerms {
    pub loss: CudaSlice<f64>,
    pub kl: CudaSlice<f64>,
    pub clipped: CudaSlice<u8>,
}

impl LossTerms {
    /// Room for `n` tokens (written by [`policy_loss`] launches covering them).
    pub fn alloc(gpu: &Gpu, n: usize) -> Result<LossTerms> {
        Ok(LossTerms {
            loss: gpu.zeros(n.max(1))?,
            kl: gpu.zeros(n.max(1))?,
            clipped: gpu.zeros(n.max(1))?,
        })
    }
}

/// The gradient of the loss for `r` scored tokens, each `[r]` f32: what
/// `logsoftmax::ScoredGrad` takes.
pub struct LossGrad {
    pub dlogp: CudaSlice<f32>,
    pub dentropy: CudaSlice<f32>,
}

/// The loss of `r` scored tokens whose `logp [r]` and `entropy [r]` (f32, the
/// forward's outputs) are the pass's tokens `at..at + r`: their gradient (new
/// buffers) and their statistics written into `terms[at..at + r]`. `n_tokens` is
/// the count the loss is averaged over (`1 / n_tokens` computed as on the host).
pub fn policy_loss(
    gpu: &Gpu,
    cfg: &LossSettings,
    n_tokens: usize,
    (logp, entropy): (&CudaSlice<f32>, &CudaSlice<f32>),
    (at, r): (usize, usize),
    inputs: &LossInputs,
    terms: &mut LossTerms,
) -> Result<LossGrad> {
    let (lo, hi) = (1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
    // Rust's clamp refuses an empty range (the host would panic): an error here.
    ensure(lo <= hi, || {
        format!(
            "policy loss: clip range [1 - {}, 1 + {}] is empty",
            cfg.clip_low, cfg.clip_high
        )
    })?;
    let end = at + r;
    let shape = format!("[{end}] (tokens {at}..{end})");
    check_len("policy loss logp", logp, r, format!("[{r}]"))?;
    check_len("policy loss entropy", entropy, r, format!("[{r}]"))?;
    if let Some(x) = inputs.logp_old {
        check_len("policy loss logp_old", x, end, &shape)?;
    }
    check_len("policy loss logp_rollout", inputs.logp_rollout, end, &shape)?;
    if let Some(x) = inputs.logp_ref {
        check_len("policy loss logp_ref", x, end, &shape)?;
    }
    check_len("policy loss advantage", inputs.advantage, end, &shape)?;
    check_len("policy loss terms (loss)", &terms.loss, end, &shape)?;
    check_len("policy loss terms (kl)", &terms.kl, end, &shape)?;
    check_len("policy loss terms (clipped)", &terms.clipped, end, &shape)?;
    let out = LossGrad {
        dlogp: gpu.uninit(r)?,
        dentropy: gpu.uninit(r)?,
    };
    let p = |x: Option<&CudaSlice<f64>>| Arg::P(x.map_or(0, |x| gpu.ptr(x)));
    gpu.launch(
        &POLICY_LOSS,
        "policy_loss",
        grid(r),
        (BLOCK, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(logp)),
            Arg::P(gpu.ptr(entropy)),
            Arg::L(r as i64),
            Arg::L(at as i64),
            p(inputs.logp_old),
            Arg::P(gpu.ptr(inputs.logp_rollout)),
            p(inputs.logp_ref),
            Arg::P(gpu.ptr(inputs.advantage)),
            Arg::D(cfg.clip_low),
            Arg::D(cfg.clip_high),
            Arg::I(cfg.tis_cap.is_some() as i32),
            Arg::D(cfg.tis_cap.unwrap_or(0.0)),
            Arg::D(cfg.kl_coef),
            Arg::D(cfg.entropy_coef),
            Arg::D(1.0 / n_tokens as f64),
            Arg::P(gpu.ptr(&out.dlogp)),
            Arg::P(gpu.ptr(&out.dentropy)),
            Arg::P(gpu.ptr(&terms.loss)),
            Arg::P(gpu.ptr(&terms.kl)),
            Arg::P(gpu.ptr(&terms.clipped)),
        ],
    )?;
    Ok(out)
}
