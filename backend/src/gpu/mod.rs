//! The model, rollout and trainer on an NVIDIA GPU, composed from the CUDA ops
//! of `jet_kernels::cuda` (as `transformer` composes the CPU reference ops).
//!
//! Device state of a run ([`GpuState`]): f32 master weights, AdamW moments and
//! a gradient buffer, all in the layout of `ModelWeights::tensors`. Each step
//! prepares the weights once per flow ([`GpuModel`]: BF16 copies or 128x128
//! FP8 blocks) for the rollout and again after each update for training. The
//! host copies in the trainer are refreshed only when something reads them
//! (checkpoints, the final save): see `Trainer::sync_host`.

pub mod ahead;
pub mod backward;
pub mod decode;
pub mod decode_graph;
pub mod forward;
pub mod generate;
pub mod grads;
mod kept;
pub mod kv_pages;
pub mod layers;
pub mod micro;
pub mod model;
pub mod optim;
pub mod pass;
pub mod pass_loss;
pub mod share;
pub mod weights;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use jet_kernels::cuda::{cuda_available, DirKernelStore, Gpu, Result};

pub use generate::GpuDecoder;
pub use grads::GpuGrads;
pub use model::{GpuModel, PreparedParts};
pub use optim::GpuAdam;
pub use pass::{run_pass_gpu, run_pass_gpu_queued, PendingScored};
pub use weights::GpuWeights;

use crate::model::{ModelConfig, ModelWeights};
use crate::rl::optim::AdamW;
use jet_kernels::Flow;

/// A run's tensors on the device.
pub struct GpuState {
    pub gpu: Arc<Gpu>,
    pub weights: GpuWeights,
    pub adam: GpuAdam,
    /// Gradients of the current update (cleared before each).
    pub grads: GpuGrads,
    /// Frozen weights for the KL penalty.
    pub reference: Option<GpuWeights>,
    /// The trainer's host weights and optimizer are behind these.
    pub host_stale: bool,
    /// Bumped by every change of `weights` (each optimizer step).
    pub version: u64,
    /// Prepared copies of `weights` (slot 0, with the version they were made
    /// at) and of `reference` (slot 1): a step's rollout and its passes before
    /// the first update share one preparation; where the optimizer step rewrites
    /// the copies (`GpuAdam::step_prepared`) they are kept under the new version.
    pub prepared: Mutex<[Option<(u64, PreparedParts)>; 2]>,
}

/// Where compiled kernels are kept between runs: `$JET_KERNEL_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/jet/kernels`, else `~/.cache/jet/kernels`.
pub fn kernel_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("JET_KERNEL_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("jet").join("kernels"))
}

/// Open the first GPU with the kernel cache attached. The error names what is
/// missing (driver library, NVRTC, cuBLASLt, a device).
pub fn open_gpu() -> Result<Arc<Gpu>> {
    let gpu = cuda_available()?;
    if let Some(dir) = kernel_cache_dir() {
        if std::fs::create_dir_all(&dir).is_ok() {
            gpu.set_kernel_store(Arc::new(DirKernelStore(dir)));
        }
    }
    Ok(gpu)
}

impl GpuState {
    /// Upload a run's weights, optimizer and reference.
    pub fn new(
        gpu: Arc<Gpu>,
        w: &ModelWeights,
        opt: &AdamW,
        reference: Option<&ModelWeights>,
    ) -> Result<GpuState> {
        let weights = GpuWeights::upload(&gpu, w)?;
        let grads = GpuGrads::zeros_like(&gpu, &weights)?;
        Ok(GpuState {
            adam: GpuAdam::upload(&gpu, opt)?,
            reference: reference.map(|r| GpuWeights::upload(&gpu, r)).transpose()?,
            weights,
            grads,
            gpu,
            host_stale: false,
            version: 0,
            prepared: Mutex::new([None, None]),
        })
    }
}

/// Which prepared copy a model uses: the policy's weights or the frozen reference.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    Policy = 0,
    Reference = 1,
}

impl Slot {
    /// The version a slot's copies are keyed by, given the policy's: the policy
    /// weights change at every update; the frozen reference only through
    /// `Trainer::host_changed`, which empties both slots.
    fn version(self, policy: u64) -> u64 {
        match self {
            Slot::Policy => policy,
            Slot::Reference => 0,
        }
    }
}

/// A model over `w` in `flow`, reusing the copies kept in `prepared[slot]` when
/// they were made from the same weights (`version`: the policy's, see
/// [`GpuState::prepared`]).
pub fn cached_model<'a>(
    gpu: &Arc<Gpu>,
    prepared: &Mutex<[Option<(u64, PreparedParts)>; 2]>,
    slot: Slot,
    version: u64,
    cfg: &'a ModelConfig,
    w: &'a GpuWeights,
    (flow, batch_invariant): (Flow, bool),
) -> Result<GpuModel<'a>> {
    let kept = prepared.lock().unwrap()[slot as usize].take();
    let mut model = match kept {
        Some((v, p)) if v == slot.version(version) && p.flow() == flow => {
            GpuModel::reuse(gpu, cfg, w, p)
        }
        Some((_, p)) => GpuModel::with_rope(gpu, cfg, w, flow, p.rope().clone())?,
        None => GpuModel::new(gpu, cfg, w, flow)?,
    };
    model.set_batch_invariant(batch_invariant);
    Ok(model)
}

/// Keep `model`'s prepared copies for the next [`cached_model`] of `slot`.
pub fn keep_model(
    prepared: &Mutex<[Option<(u64, PreparedParts)>; 2]>,
    slot: Slot,
    version: u64,
    model: GpuModel,
) {
    keep_parts(prepared, slot, version, model.into_parts());
}

/// Keep `parts`, made from the weights at `version`, for the next [`cached_model`]
/// of `slot`.
pub fn keep_parts(
    prepared: &Mutex<[Option<(u64, PreparedParts)>; 2]>,
    slot: Slot,
    version: u64,
    parts: PreparedParts,
) {
    prepared.lock().unwrap()[slot as usize] = Some((slot.version(version), parts));
}

/// The parts kept for `slot` with the version they were made at (None: nothing
/// kept); [`keep_parts`] puts them back.
pub fn take_parts(
    prepared: &Mutex<[Option<(u64, PreparedParts)>; 2]>,
    slot: Slot,
) -> Option<(u64, PreparedParts)> {
    prepared.lock().unwrap()[slot as usize].take()
}
