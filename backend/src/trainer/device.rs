//! The trainer's work on its device: rollouts, passes and optimizer steps go
//! to the CPU reference or to the GPU (`run.device`), with one set of step
//! logic above them.

use jet_kernels::cuda::CudaError;
use rand::RngCore;

use crate::config::MicroTokens;
use crate::gpu::decode::GpuKvCache;
use crate::gpu::micro::{grad_hold_for, micro_tokens, PassKind};
use crate::gpu::{
    cached_model, keep_model, keep_parts, run_pass_gpu_queued, take_parts, GpuDecoder, GpuState,
    GpuWeights, PendingScored, Slot,
};
use crate::model::ModelWeights;
use crate::rl::optim::OptimConfig;
use crate::rollout::engine::{generate_with, CpuDecoder, Decoder, GenConfig, Sample};
use crate::transformer::PreparedModel;

use super::pass::{run_pass, Micro, Scored, TrainSeq};
use super::pass_loss::PassLoss;
use super::{SetupError, Trainer};

impl From<CudaError> for SetupError {
    fn from(e: CudaError) -> Self {
        SetupError::Device(e.to_string())
    }
}

/// A pass's scored tokens: the CPU's, or a GPU pass's still on the device until
/// [`PassScores::wait`] (so the optimizer step is queued before the host waits).
pub(super) enum PassScores {
    Host(Scored),
    Gpu(PendingScored),
}

impl PassScores {
    /// The scored tokens on the host (a GPU pass: waiting for the stream).
    pub(super) fn wait(self) -> Result<Scored, SetupError> {
        match self {
            PassScores::Host(s) => Ok(s),
            PassScores::Gpu(p) => Ok(p.wait()?),
        }
    }
}

/// Which weights a pass reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Which {
    Policy,
    /// The frozen reference of the KL penalty.
    Reference,
}

/// What a GPU rollout's paged KV cache held: the step metrics'
/// `kv_peak_gib`, `kv_pool_gib` and `rollout_preemptions`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct RolloutKv {
    /// Bytes of the pages in use at most during the rollout.
    pub peak_bytes: usize,
    /// Bytes of the pool (`rollout.kv_cache_gib`, or room for every sequence).
    pub pool_bytes: usize,
    /// Sequences preempted for want of a free page (prefilled again later).
    pub preemptions: usize,
}

/// Gradients of one update: on the host, or in the GPU state's buffer.
pub(super) enum Grads {
    Host(ModelWeights),
    Device,
}

impl Trainer {
    /// Generate `n` samples per prompt with the current weights; on the GPU,
    /// also what its KV cache held.
    pub(super) fn rollout(
        &self,
        prompts: &[Vec<u32>],
        n: usize,
        gen: &GenConfig,
        rng: &mut dyn RngCore,
    ) -> Result<(Vec<Sample>, Option<RolloutKv>), SetupError> {
        let decode = |t: &[u32]| self.tokenizer.decode(t, true).unwrap_or_default();
        let max_pos = self.model_cfg.max_position_embeddings;
        let mut run =
            |dec: &mut dyn Decoder| generate_with(dec, max_pos, prompts, n, gen, &decode, rng);
        match &self.device {
            None => {
                let model = PreparedModel::new(&self.model_cfg, &self.weights, self.flow);
                Ok((run(&mut CpuDecoder::new(&model))?, None))
            }
            Some(d) => {
                // The passes until the next update reuse these copies (and, where
                // the optimizer rewrites them, the passes after it too).
                let model = cached_model(
                    &d.gpu,
                    &d.prepared,
                    Slot::Policy,
                    d.version,
                    &self.model_cfg,
                    &d.weights,
                    (self.flow, self.cfg.run.batch_invariant),
                )?;
                let mut dec = GpuDecoder::new(&model)
                    .with_graphs(self.cfg.run.cuda_graphs)
                    .with_kv_cache_bytes(self.cfg.rollout.kv_cache_bytes());
                let out = run(&mut dec);
                let page = GpuKvCache::page_bytes(&model);
                let kv = dec.kv_use().map(|u| RolloutKv {
                    peak_bytes: u.pages_peak * page,
                    pool_bytes: u.pages * page,
                    preemptions: dec.preemptions(),
                });
                drop(dec);
                keep_model(&d.prepared, Slot::Policy, d.version, model);
                Ok((out?, kv))
            }
        }
    }

    /// Score `seqs` with `which` weights; with `grad`, also the gradients of that loss.
    /// A GPU pass returns once queued: its scores come with [`PassScores::wait`].
    pub(super) fn pass(
        &mut self,
        which: Which,
        seqs: &[TrainSeq],
        temperature: f64,
        grad: Option<PassLoss>,
    ) -> Result<(PassScores, Option<Grads>), SetupError> {
        let micro = self.micro(seqs, temperature)?;
        let kind = self.pass_kind(seqs, temperature);
        let want = grad.is_some();
        match self.device.as_mut() {
            None => {
                let w = match which {
                    Which::Policy => &self.weights,
                    Which::Reference => self.reference.as_ref().unwrap_or(&self.weights),
                };
                let model = PreparedModel::new(&self.model_cfg, w, self.flow);
                let (s, g) = run_pass(&model, seqs, temperature, micro, grad);
                Ok((PassScores::Host(s), g.map(Grads::Host)))
            }
            Some(d) => {
                if want {
                    d.grads.clear();
                    // WGrad outputs held a matrix between settles: as many as the
                    // largest micro-batch leaves room for (`gpu::micro::grad_hold`).
                    let reference = d.reference.is_some();
                    let on = (seqs, micro);
                    let cap = grad_hold_for(&d.gpu, &self.model_cfg, kind, reference, on)?;
                    d.grads.hold_cap = Some(cap);
                }
                let GpuState {
                    gpu,
                    weights,
                    grads,
                    reference,
                    version,
                    prepared,
                    ..
                } = d;
                let (slot, w) = match (which, reference.as_ref()) {
                    (Which::Reference, Some(r)) => (Slot::Reference, r),
                    _ => (Slot::Policy, &*weights),
                };
                let mode = (self.flow, self.cfg.run.batch_invariant);
                let model = cached_model(gpu, prepared, slot, *version, &self.model_cfg, w, mode)?;
                let grad = grad.map(|f| (f, grads));
                let s = run_pass_gpu_queued(&model, seqs, temperature, micro, grad);
                keep_model(prepared, slot, *version, model);
                Ok((PassScores::Gpu(s?), want.then_some(Grads::Device)))
            }
        }
    }

    /// What a GPU pass over `seqs` at `temperature` keeps a token (`gpu::micro`).
    fn pass_kind(&self, seqs: &[TrainSeq], temperature: f64) -> PassKind {
        let invariant = self.cfg.run.batch_invariant;
        PassKind::of_seqs(&self.model_cfg, self.flow, temperature, invariant, seqs)
    }

    /// The micro-batches' bounds for a pass over `seqs` at `temperature`:
    /// `train.micro_batch_tokens`, its `"auto"` sized to the GPU (`gpu::micro`),
    /// or no token bound on the CPU.
    fn micro(&self, seqs: &[TrainSeq], temperature: f64) -> Result<Micro, SetupError> {
        let setting = self.cfg.train.micro_batch_tokens;
        let tokens = match (setting, self.device.as_ref()) {
            (MicroTokens::Max(n), None) => n,
            (MicroTokens::Auto, None) => 0,
            (_, Some(d)) => {
                let kind = self.pass_kind(seqs, temperature);
                let reference = d.reference.is_some();
                micro_tokens(setting, &d.gpu, &self.model_cfg, kind, reference)?
            }
        };
        Ok(Micro {
            seqs: self.cfg.train.micro_batch,
            tokens,
        })
    }

    /// One optimizer step; returns the gradient norm before clipping. `poison`
    /// (fault injection) turns the gradients into NaN first.
    pub(super) fn apply(
        &mut self,
        grads: Grads,
        oc: &OptimConfig,
        lr: f64,
        poison: bool,
    ) -> Result<f64, SetupError> {
        match (grads, self.device.as_mut()) {
            (Grads::Host(mut g), None) => {
                if poison {
                    g.norm[0] = f32::NAN;
                }
                Ok(self.opt.step(&mut self.weights, &g, oc, lr))
            }
            (Grads::Device, Some(d)) => {
                if poison {
                    let n = d.grads.ix.norm;
                    let len = d.grads.bufs[n].len();
                    let acc = d.grads.acc(&d.gpu, n)?;
                    jet_kernels::cuda::tensor::fill(&d.gpu, acc, len, f32::NAN)?;
                }
                // The policy's prepared copies of these weights, when the optimizer
                // can rewrite them from the new values (BF16 copies, FP8 blocks); they then
                // serve the next version without being made again.
                let (mut current, other) = match take_parts(&d.prepared, Slot::Policy) {
                    Some((v, p)) if v == d.version && p.flow() == self.flow => (Some(p), None),
                    other => (None, other),
                };
                let (w, g) = (&mut d.weights, &d.grads);
                let stepped = d.adam.step_prepared(&d.gpu, w, g, oc, lr, current.as_mut());
                let (norm, rewrote) = match stepped {
                    Ok(x) => x,
                    Err(e) => {
                        // The weights did not change: the parts are as they were.
                        let back = current.map(|p| (d.version, p)).or(other);
                        if let Some((v, p)) = back {
                            keep_parts(&d.prepared, Slot::Policy, v, p);
                        }
                        return Err(e.into());
                    }
                };
                // The gradient is spent: its held BF16 outputs go back to the pool
                // before the next rollout.
                d.grads.clear();
                d.host_stale = true;
                d.version += 1;
                // Put the parts back: new ones for the new version, or the old
                // ones (stale, kept for their RoPE table) as they were.
                let kept = match (current, other) {
                    (Some(p), _) => Some((d.version - u64::from(!rewrote), p)),
                    (None, other) => other,
                };
                if let Some((v, p)) = kept {
                    keep_parts(&d.prepared, Slot::Policy, v, p);
                }
                Ok(norm)
            }
            _ => Err(SetupError::Device(
                "gradients and weights are on different devices".into(),
            )),
        }
    }

    /// Bring the host weights and optimizer up to date with the device (before
    /// anything reads `weights` or `opt`: checkpoints, the final save).
    pub fn sync_host(&mut self) -> Result<(), SetupError> {
        if let Some(d) = self.device.as_mut() {
            if d.host_stale {
                d.weights.download_into(&d.gpu, &mut self.weights)?;
                d.adam.download_into(&d.gpu, &mut self.opt)?;
                d.host_stale = false;
            }
        }
        Ok(())
    }

    /// The host weights, optimizer or reference were replaced (a restore, the
    /// end of SFT): copy them to the device, into the buffers already there (a
    /// second set could exhaust device memory on a large model).
    pub fn host_changed(&mut self) -> Result<(), SetupError> {
        if let Some(d) = self.device.as_mut() {
            // The prepared copies were made from the weights about to be
            // overwritten: dropped first, so a copy failing halfway leaves none.
            d.version += 1;
            *d.prepared.lock().unwrap() = [None, None];
            d.weights.copy_from_host(&d.gpu, &self.weights)?;
            d.adam.copy_from_host(&d.gpu, &self.opt)?;
            match (&mut d.reference, &self.reference) {
                (Some(dev), Some(host)) => dev.copy_from_host(&d.gpu, host)?,
                (dev, host) => {
                    *dev = host
                        .as_ref()
                        .map(|r| GpuWeights::upload(&d.gpu, r))
                        .transpose()?
                }
            }
            d.host_stale = false;
        }
        Ok(())
    }

    /// Device name for logs: "cpu" or the GPU's name.
    pub fn device_name(&self) -> String {
        self.device
            .as_ref()
            .map_or_else(|| "cpu".to_string(), |d| d.gpu.name().to_string())
    }
}
