//! AdamW on the GPU, element for element the CPU's `rl::optim::AdamW` (same
//! f32/f64 operations), with the global gradient norm from per-tensor f64 sums
//! of squares and the clip's scale computed on the device (`clip_scale`, the
//! host's operations), so AdamW is queued without waiting for the norm; the norm
//! comes down after. All run over all tensors at once (multi-tensor launches:
//! two for the sums, one for the clip, one for the step).

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::adamw::{adamw_multi_scaled, AdamStep, AdamTensor};
use jet_kernels::cuda::tensor::{clip_scale, sum_squares_multi};
use jet_kernels::cuda::{CudaError, Gpu, Result};

use super::grads::GpuGrads;
use super::model::{PreparedParts, Rewrite};
use super::weights::GpuWeights;
use crate::rl::optim::{AdamW, OptimConfig};

pub struct GpuAdam {
    pub m: GpuWeights,
    pub v: GpuWeights,
    /// Optimizer steps taken.
    pub t: u64,
}

/// Each tensor's f64 sum of squares of `g`, on the device, in tensor order.
fn tensor_sums(gpu: &Gpu, g: &GpuGrads) -> Result<CudaSlice<f64>> {
    let mut acc = gpu.zeros::<f64>(g.bufs.len())?;
    sum_squares_multi(gpu, &g.srcs()?, &mut acc)?;
    Ok(acc)
}

/// Global L2 norm of `g` (f64 sums per tensor, added on the host in tensor order).
pub fn global_norm_gpu(gpu: &Gpu, g: &GpuGrads) -> Result<f64> {
    Ok(gpu
        .download(&tensor_sums(gpu, g)?)?
        .iter()
        .sum::<f64>()
        .sqrt())
}

impl GpuAdam {
    /// Device moments from the host optimizer state.
    pub fn upload(gpu: &Gpu, host: &AdamW) -> Result<GpuAdam> {
        Ok(GpuAdam {
            m: GpuWeights::upload(gpu, &host.m)?,
            v: GpuWeights::upload(gpu, &host.v)?,
            t: host.t,
        })
    }

    /// Overwrite the moments and step count with `host`'s, in place.
    pub fn copy_from_host(&mut self, gpu: &Gpu, host: &AdamW) -> Result<()> {
        self.m.copy_from_host(gpu, &host.m)?;
        self.v.copy_from_host(gpu, &host.v)?;
        self.t = host.t;
        Ok(())
    }

    /// Copy the moments and step count back into `host`.
    pub fn download_into(&self, gpu: &Gpu, host: &mut AdamW) -> Result<()> {
        self.m.download_into(gpu, &mut host.m)?;
        self.v.download_into(gpu, &mut host.v)?;
        host.t = self.t;
        Ok(())
    }

    /// One step with learning rate `lr` (as `AdamW::step`); returns the
    /// gradient norm before clipping.
    pub fn step(
        &mut self,
        gpu: &Gpu,
        w: &mut GpuWeights,
        g: &GpuGrads,
        cfg: &OptimConfig,
        lr: f64,
    ) -> Result<f64> {
        Ok(self.step_prepared(gpu, w, g, cfg, lr, None)?.0)
    }

    /// [`GpuAdam::step`], also rewriting `parts`' weight copies (BF16 copies, FP8
    /// blocks) from the new values where all of them can be
    /// (`PreparedParts::targets`), so they serve the next version of the weights
    /// without preparing them again. Returns the norm and whether `parts` were rewritten (if not,
    /// they still hold the old weights' copies).
    pub fn step_prepared(
        &mut self,
        gpu: &Gpu,
        w: &mut GpuWeights,
        g: &GpuGrads,
        cfg: &OptimConfig,
        lr: f64,
        parts: Option<&mut PreparedParts>,
    ) -> Result<(f64, bool)> {
        // The norm and the clip's scale stay on the device for AdamW to read; the
        // norm comes down after the step is queued (no host round trip between).
        let acc = tensor_sums(gpu, g)?;
        let (norm, scale) = clip_scale(gpu, &acc, g.bufs.len(), cfg.grad_clip)?;
        self.t += 1;
        let base = AdamStep {
            lr,
            beta1: cfg.beta1 as f32,
            beta2: cfg.beta2 as f32,
            eps: cfg.eps,
            bc1: 1.0 - cfg.beta1.powi(self.t as i32),
            bc2: 1.0 - cfg.beta2.powi(self.t as i32),
            wd_factor: (1.0 - lr * cfg.weight_decay) as f32,
            decay: true,
            grad_scale: 1.0,
        };
        let mut copies: Vec<Option<Rewrite>> = (0..w.bufs.len()).map(|_| None).collect();
        let targets = parts.and_then(|p| p.targets(&w.ix));
        let wrote = targets.is_some();
        for (i, r) in targets.into_iter().flatten() {
            // One set of copies a tensor, of that tensor's shape: a copy the step
            // skipped would be kept as if it were current.
            let (name, have) = (&w.names[i], w.bufs[i].len());
            if copies[i].is_some() || have != r.len {
                return Err(CudaError::Invalid(format!(
                    "prepared copy of {name}: {} values for a tensor of {have}, or a second copy",
                    r.len
                )));
            }
            copies[i] = Some(r);
        }
        let mut ts: Vec<AdamTensor> = w
            .bufs
            .iter_mut()
            .zip(g.srcs()?)
            .zip(self.m.bufs.iter_mut().zip(self.v.bufs.iter_mut()))
            .zip(w.names.iter().zip(copies))
            .map(|(((p, g), (m, v)), (name, r))| {
                let (p_bf16, blocks) = r.map_or((None, None), |r| (r.bf16, r.blocks));
                AdamTensor {
                    p,
                    g,
                    m,
                    v,
                    decay: !(name.contains("norm") || name.ends_with(".bias")),
                    p_bf16,
                    blocks,
                }
            })
            .collect();
        adamw_multi_scaled(gpu, &mut ts, &base, Some(&scale))?;
        let norm = gpu.download(&norm)?[0];
        Ok((norm, wrote))
    }
}
