//! BF16 values on the device that kernels read (and AdamW writes) through their
//! address: a buffer of their own, or a block of a shared one. q's, k's and v's BF16
//! weights are row blocks of one `[q + k + v, hidden]` buffer a layer (gate's and
//! up's of one `[2 intermediate, hidden]`), so one BF16 DGrad GEMM reads all three
//! while the forward, the decode GEMMs and AdamW still see each weight alone.

use cudarc::driver::CudaSlice;

use super::{ensure, Ctx, Gpu, Result};

/// `len` BF16 values from element `off` of `buf`.
#[derive(Clone, Copy)]
pub struct Bf16View<'a> {
    buf: &'a CudaSlice<u16>,
    off: usize,
    len: usize,
}

impl<'a> Bf16View<'a> {
    /// Values `[off, off + len)` of `buf`, checked (`what` names them in the error).
    pub fn part(what: &str, buf: &'a CudaSlice<u16>, off: usize, len: usize) -> Result<Self> {
        ensure(off.checked_add(len).is_some_and(|e| e <= buf.len()), || {
            format!(
                "{what}: values [{off}, {}) of a buffer of {}",
                off.saturating_add(len),
                buf.len()
            )
        })?;
        Ok(Bf16View { buf, off, len })
    }

    /// The device address of the first value.
    pub fn ptr(&self, gpu: &Gpu) -> u64 {
        gpu.ptr(self.buf) + 2 * self.off as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The values, copied to the host (waits for the stream).
    pub fn to_host(&self, gpu: &Gpu) -> Result<Vec<u16>> {
        let mut out = vec![0u16; self.len];
        if self.len > 0 {
            let src = self.buf.slice(self.off..self.off + self.len);
            gpu.stream()
                .memcpy_dtoh(&src, &mut out)
                .ctx("copying BF16 values to the host")?;
        }
        gpu.sync()?;
        Ok(out)
    }
}

impl<'a> From<&'a CudaSlice<u16>> for Bf16View<'a> {
    fn from(buf: &'a CudaSlice<u16>) -> Self {
        Bf16View {
            buf,
            off: 0,
            len: buf.len(),
        }
    }
}
