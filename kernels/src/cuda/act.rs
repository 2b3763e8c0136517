//! A layer output whose values the low-precision flows round to BF16 (the GEMMs'
//! "f32 accumulation, BF16 output"): kept as f32, or as those BF16 values, half
//! the bytes and the same numbers. The batch-invariant rows GEMMs store the BF16
//! form themselves (`linear::linear_forward_group_act`, `linear_forward_act`); the
//! ops that read it (SwiGLU forward and backward for gate and up; the log-prob
//! statistics and backward for the LM head's logits) take either and widen BF16
//! exactly, so their bits do not depend on the form.

use cudarc::driver::CudaSlice;

use super::context::Arg;
use super::{check_len, Gpu, Result};

/// An owned `[rows, cols]` activation, row-major without padding.
pub enum Act {
    F32(CudaSlice<f32>),
    /// BF16 bits of values that are BF16 already (exact in f32).
    Bf16(CudaSlice<u16>),
}

/// A borrowed [`Act`].
#[derive(Clone, Copy)]
pub enum ActRef<'a> {
    F32(&'a CudaSlice<f32>),
    Bf16(&'a CudaSlice<u16>),
}

impl Act {
    pub fn view(&self) -> ActRef<'_> {
        match self {
            Act::F32(x) => ActRef::F32(x),
            Act::Bf16(x) => ActRef::Bf16(x),
        }
    }

    /// The f32 values: the buffer itself, or the BF16 values widened (exact) into
    /// `keep`, for an op that reads f32 alone.
    pub fn as_f32<'a>(
        &'a self,
        gpu: &Gpu,
        keep: &'a mut Option<CudaSlice<f32>>,
    ) -> Result<&'a CudaSlice<f32>> {
        match self {
            Act::F32(x) => Ok(x),
            Act::Bf16(x) => Ok(keep.insert(super::tensor::bf16_to_f32(gpu, x)?)),
        }
    }
}

impl<'a> From<&'a CudaSlice<f32>> for ActRef<'a> {
    fn from(x: &'a CudaSlice<f32>) -> Self {
        ActRef::F32(x)
    }
}

impl<'a> From<&'a CudaSlice<u16>> for ActRef<'a> {
    fn from(x: &'a CudaSlice<u16>) -> Self {
        ActRef::Bf16(x)
    }
}

impl ActRef<'_> {
    pub fn is_bf16(self) -> bool {
        matches!(self, ActRef::Bf16(_))
    }

    /// The kernel for this form: `f32_name`, or its twin `bf16_name` that reads the
    /// BF16 values.
    pub(crate) fn kernel(self, f32_name: &'static str, bf16_name: &'static str) -> &'static str {
        match self.is_bf16() {
            true => bf16_name,
            false => f32_name,
        }
    }

    /// Check that it holds `need` values (`what` and `shape` name it in the error).
    pub(crate) fn check(self, what: &str, need: usize, shape: &str) -> Result<()> {
        match self {
            ActRef::F32(x) => check_len(what, x, need, shape),
            ActRef::Bf16(x) => check_len(&format!("{what} (BF16)"), x, need, shape),
        }
    }

    /// Its device address.
    pub(crate) fn ptr(self, gpu: &Gpu) -> u64 {
        match self {
            ActRef::F32(x) => gpu.ptr(x),
            ActRef::Bf16(x) => gpu.ptr(x),
        }
    }

    /// Its device address as a kernel argument.
    pub(crate) fn ptr_arg(self, gpu: &Gpu) -> Arg {
        Arg::P(self.ptr(gpu))
    }

    /// [`ActRef::check`], then [`ActRef::ptr_arg`].
    pub(crate) fn arg(self, gpu: &Gpu, what: &str, need: usize, shape: &str) -> Result<Arg> {
        self.check(what, need, shape)?;
        Ok(self.ptr_arg(gpu))
    }
}
