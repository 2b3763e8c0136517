//! A step's gradients on the device: one [`GradAcc`] per tensor, in the layout of
//! [`GpuWeights`]. The matrices' last WGrad outputs stay in BF16 until the gradient
//! norm and AdamW read them (`jet_kernels::cuda::grad`); everything else adds into
//! the f32 accumulators through [`GpuGrads::acc`].

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::grad::{GradAcc, GradSrc, ScatterDest, Settle};
use jet_kernels::cuda::{CudaError, Gpu, Result};

use super::weights::{download_tensors, GpuWeights, Index};
use crate::model::ModelWeights;

pub struct GpuGrads {
    pub names: Vec<String>,
    pub bufs: Vec<GradAcc>,
    pub ix: Index,
    /// WGrad outputs a matrix may hold before a pass settles them (None: the
    /// pass's own choice, `gpu::pass`).
    pub hold_cap: Option<usize>,
}

impl GpuGrads {
    /// Zero gradients for `like`'s tensors. The embedding's, which its scatter
    /// writes (a few thousand rows of the vocabulary a step), carries a chunk
    /// mask: cleared and read where something wrote (`GradAcc::new_masked`). Untied,
    /// only the scatter writes it; tied, the LM head's WGrad outputs stay held in
    /// BF16 but for the rows the scatter writes (`GradAcc::f32_scatter_mut`).
    pub fn zeros_like(gpu: &Gpu, like: &GpuWeights) -> Result<GpuGrads> {
        let scattered = like.ix.embed;
        let bufs = like
            .bufs
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if i == scattered {
                    GradAcc::new_masked(gpu, b.len())
                } else {
                    GradAcc::new(gpu, b.len())
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(GpuGrads {
            names: like.names.clone(),
            bufs,
            ix: like.ix.clone(),
            hold_cap: None,
        })
    }

    /// Every gradient back to zero (before an update's passes), writing nothing;
    /// the held BF16 outputs' memory goes back to the pool.
    pub fn clear(&mut self) {
        self.bufs.iter_mut().for_each(GradAcc::clear);
    }

    /// Tensor `i`'s f32 accumulator with everything added so far, for a kernel
    /// that adds into it.
    pub fn acc(&mut self, gpu: &Gpu, i: usize) -> Result<&mut CudaSlice<f32>> {
        self.bufs[i].f32_mut(gpu)
    }

    /// Hold up to `n` WGrad outputs a matrix before settling them into the f32
    /// gradients together (`GradAcc::set_hold`: the same bits; 2 bytes a
    /// parameter of the matrices each).
    pub fn set_hold(&mut self, n: usize) {
        self.bufs.iter_mut().for_each(|b| b.set_hold(n));
    }

    /// The held BF16 addends of every gradient holding as many as it may added
    /// into its accumulator, in one launch (`grad::settle_multi`): before a
    /// backward pass, whose WGrad outputs then find room to be held without a
    /// settle launch a matrix.
    pub fn settle_full(&mut self, gpu: &Gpu) -> Result<()> {
        jet_kernels::cuda::grad::settle_multi(gpu, &mut self.bufs, Settle::Full)
    }

    /// All but the last held addend of each gradient settled (one launch): what
    /// the gradient norm and AdamW read ([`GpuGrads::srcs`]) after a pass.
    pub fn settle_for_read(&mut self, gpu: &Gpu) -> Result<()> {
        jet_kernels::cuda::grad::settle_multi(gpu, &mut self.bufs, Settle::AllButLast)
    }

    /// Gradients `parts` (`(tensor, its n k values)`, in the order of their row
    /// blocks) each hold its block of one stacked WGrad output `dw` (`[sum of n, k]`
    /// BF16, [`GradAcc::add_bf16_part`]) until the norm and the optimizer read it.
    pub fn hold_blocks(
        &mut self,
        gpu: &Gpu,
        dw: &Arc<CudaSlice<u16>>,
        parts: &[(usize, usize)],
    ) -> Result<()> {
        let mut off = 0;
        for &(ix, len) in parts {
            self.bufs[ix].add_bf16_part(gpu, dw, off)?;
            off += len;
        }
        Ok(())
    }

    /// Tensors `i`'s and `j`'s accumulators at once (`i != j`).
    pub fn acc2(
        &mut self,
        gpu: &Gpu,
        i: usize,
        j: usize,
    ) -> Result<(&mut CudaSlice<f32>, &mut CudaSlice<f32>)> {
        if i == j || i.max(j) >= self.bufs.len() {
            return Err(CudaError::Invalid(format!(
                "two gradient accumulators {i} and {j} of {}",
                self.bufs.len()
            )));
        }
        let (lo, hi) = self.bufs.split_at_mut(i.max(j));
        let (a, b) = (lo[i.min(j)].f32_mut(gpu)?, hi[0].f32_mut(gpu)?);
        Ok(if i < j { (a, b) } else { (b, a) })
    }

    /// Tensor `i`'s accumulator, chunk mask and held addends for a scatter that
    /// marks what it writes and settles the rows it writes itself
    /// ([`GradAcc::f32_scatter_mut`]).
    pub fn acc_scatter(&mut self, gpu: &Gpu, i: usize) -> Result<ScatterDest<'_>> {
        self.bufs[i].f32_scatter_mut(gpu)
    }

    /// How the gradient norm and AdamW read each tensor, in order; an error where
    /// one holds more than one addend ([`GpuGrads::settle_for_read`] first).
    pub fn srcs(&self) -> Result<Vec<GradSrc<'_>>> {
        self.bufs.iter().map(GradAcc::src).collect()
    }

    /// Copy every gradient into `w` (same layout), its held addend added first.
    pub fn download_into(&mut self, gpu: &Gpu, w: &mut ModelWeights) -> Result<()> {
        let bufs = self
            .bufs
            .iter_mut()
            .map(|b| b.f32_mut(gpu).map(|x| &*x))
            .collect::<Result<Vec<_>>>()?;
        download_tensors(gpu, &bufs, w, "gradient of ")
    }
}
