//! A GPU pass's scored tokens kept on the device until the pass ends, and the
//! gradient of its loss computed there (`PassLoss::Policy` by the `policy_loss`
//! kernel, `PassLoss::Const` by fills): the pass queues every micro-batch's
//! forward, loss and backward without a host sync, and downloads the logprobs,
//! entropies and loss terms of all its tokens once, at its end.

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::logsoftmax::GpuTokenLogprobs;
use jet_kernels::cuda::policy_loss::{
    policy_loss, LossGrad, LossInputs, LossSettings, LossTerms as DeviceTerms,
};
use jet_kernels::cuda::tensor::fill;
use jet_kernels::cuda::{CudaError, Gpu, Result};

use crate::rl::loss::LossConfig;
use crate::trainer::pass::{Scored, TrainSeq};
use crate::trainer::pass_loss::{LossTerms, PassLoss, PolicyLoss};

/// The kernel's settings of `cfg`.
pub fn loss_settings(cfg: &LossConfig) -> LossSettings {
    LossSettings {
        clip_low: cfg.clip_low,
        clip_high: cfg.clip_high,
        tis_cap: cfg.tis_cap,
        kl_coef: cfg.kl_coef,
        entropy_coef: cfg.entropy_coef,
    }
}

/// The policy loss's per-token inputs over a pass's response tokens, each
/// `[tokens]` in the pass's scored order (sequence after sequence).
pub struct PolicyInputs<T> {
    pub logp_old: Option<T>,
    pub logp_rollout: T,
    pub logp_ref: Option<T>,
    /// The token's sequence's advantage.
    pub advantage: T,
}

impl PolicyInputs<Vec<f64>> {
    /// `p`'s inputs for the pass over `seqs`; an error where `p`'s arrays do not
    /// cover them (`PolicyLoss::check`).
    pub fn of(p: &PolicyLoss, seqs: &[TrainSeq]) -> std::result::Result<Self, String> {
        p.check(seqs)?;
        let flat = |a: &[Vec<f64>]| -> Vec<f64> {
            let rows = seqs.iter().enumerate();
            rows.flat_map(|(i, s)| a[p.base + i][..s.response_len()].iter().copied())
                .collect()
        };
        let each = seqs.iter().enumerate();
        Ok(PolicyInputs {
            logp_old: p.logp_old.map(flat),
            logp_rollout: flat(p.logp_rollout),
            logp_ref: p.logp_ref.map(flat),
            advantage: each
                .flat_map(|(i, s)| std::iter::repeat_n(p.advantage[p.base + i], s.response_len()))
                .collect(),
        })
    }

    /// On the device.
    pub fn upload(&self, g: &Gpu) -> Result<PolicyInputs<CudaSlice<f64>>> {
        let up = |x: &Option<Vec<f64>>| x.as_ref().map(|x| g.upload(x)).transpose();
        Ok(PolicyInputs {
            logp_old: up(&self.logp_old)?,
            logp_rollout: g.upload(&self.logp_rollout)?,
            logp_ref: up(&self.logp_ref)?,
            advantage: g.upload(&self.advantage)?,
        })
    }
}

impl PolicyInputs<CudaSlice<f64>> {
    /// As the kernel takes them.
    pub fn view(&self) -> LossInputs<'_> {
        LossInputs {
            logp_old: self.logp_old.as_ref(),
            logp_rollout: &self.logp_rollout,
            logp_ref: self.logp_ref.as_ref(),
            advantage: &self.advantage,
        }
    }
}

/// The policy loss on the device: its settings, inputs and statistics over the pass.
struct DevicePolicy {
    cfg: LossSettings,
    n_tokens: usize,
    inputs: PolicyInputs<CudaSlice<f64>>,
    terms: DeviceTerms,
}

/// What a micro-batch's gradient is.
enum DeviceGrad {
    Policy(Box<DevicePolicy>),
    Const { dlogp: f32, dentropy: f32 },
}

/// A pass's scored tokens `[n]` on the device, filled micro-batch after
/// micro-batch, and the gradient of its loss (none for a pass that only scores).
pub(super) struct DeviceScores {
    n: usize,
    logp: CudaSlice<f32>,
    entropy: CudaSlice<f32>,
    grad: Option<DeviceGrad>,
}

impl DeviceScores {
    /// Room for `seqs`' response tokens and, for `loss`, its inputs uploaded
    /// (once for the pass). A host closure's loss is not for the device.
    pub(super) fn new(g: &Gpu, seqs: &[TrainSeq], loss: Option<&PassLoss>) -> Result<Self> {
        let n: usize = seqs.iter().map(|s| s.response_len()).sum();
        let grad = match loss {
            None => None,
            Some(PassLoss::Host(_)) => {
                return Err(CudaError::Invalid(
                    "a host closure's loss does not run on the device".into(),
                ))
            }
            Some(PassLoss::Const { dlogp, dentropy }) => Some(DeviceGrad::Const {
                dlogp: *dlogp as f32,
                dentropy: *dentropy as f32,
            }),
            Some(PassLoss::Policy(p)) => {
                let inputs = PolicyInputs::of(p, seqs).map_err(CudaError::Invalid)?;
                let inputs = inputs.upload(g)?;
                Some(DeviceGrad::Policy(Box::new(DevicePolicy {
                    cfg: loss_settings(&p.cfg),
                    n_tokens: p.n_tokens,
                    inputs,
                    terms: DeviceTerms::alloc(g, n)?,
                })))
            }
        };
        Ok(DeviceScores {
            n,
            logp: g.zeros(n.max(1))?,
            entropy: g.zeros(n.max(1))?,
            grad,
        })
    }

    /// Keep a micro-batch's scored tokens, the pass's tokens `at..at + r`
    /// (`tl`'s `[r]` results), and return their gradient when the pass has a loss.
    pub(super) fn micro(
        &mut self,
        g: &Gpu,
        tl: &GpuTokenLogprobs,
        (at, r): (usize, usize),
    ) -> Result<Option<LossGrad>> {
        g.copy_into_at(&tl.logp, &mut self.logp, at, r)?;
        g.copy_into_at(&tl.entropy, &mut self.entropy, at, r)?;
        match &mut self.grad {
            None => Ok(None),
            Some(DeviceGrad::Const { dlogp, dentropy }) => {
                let mut d = LossGrad {
                    dlogp: g.zeros(r)?,
                    dentropy: g.zeros(r)?,
                };
                // The bits of the host's `as f32` of the constant (+0 stays zeros).
                for (x, v) in [(&mut d.dlogp, *dlogp), (&mut d.dentropy, *dentropy)] {
                    if v.to_bits() != 0 {
                        fill(g, x, r, v)?;
                    }
                }
                Ok(Some(d))
            }
            Some(DeviceGrad::Policy(p)) => {
                let inputs = p.inputs.view();
                let fwd = (&tl.logp, &tl.entropy);
                let d = policy_loss(g, &p.cfg, p.n_tokens, fwd, (at, r), &inputs, &mut p.terms)?;
                Ok(Some(d))
            }
        }
    }

    /// Wait for the pass and bring its tokens' results to the host, sequence after
    /// sequence, `lens` their response lengths.
    pub(super) fn finish(self, g: &Gpu, lens: &[usize]) -> Result<Scored> {
        let logp = g.download_n(&self.logp, self.n)?;
        let entropy = g.download_n(&self.entropy, self.n)?;
        let terms = match &self.grad {
            Some(DeviceGrad::Policy(p)) => {
                let loss = g.download_n(&p.terms.loss, self.n)?;
                let kl = g.download_n(&p.terms.kl, self.n)?;
                let clipped = g.download_n(&p.terms.clipped, self.n)?;
                let each = (0..self.n).map(|k| LossTerms {
                    loss: loss[k],
                    clipped: clipped[k] != 0,
                    kl: kl[k],
                });
                Some(each.collect::<Vec<_>>())
            }
            _ => None,
        };
        let mut scored = Scored::default();
        let mut k = 0;
        for &len in lens {
            let span = k..k + len;
            let widen = |x: &[f32]| x[span.clone()].iter().map(|&v| v as f64).collect();
            scored.logp.push(widen(&logp));
            scored.entropy.push(widen(&entropy));
            if let Some(t) = &terms {
                scored.terms.push(t[span.clone()].to_vec());
            }
            k = span.end;
        }
        Ok(scored)
    }
}
