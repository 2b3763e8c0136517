//! A parameter's gradient on the device while a step's backward passes add into it.
//!
//! The low-precision flows' WGrad GEMMs write dW in BF16; their epilogue
//! (`linear_epilogue_bf16`) then added it into the f32 gradient: 2 + 4 bytes read
//! and 4 written a parameter, on top of zeroing the gradient (4) before the step.
//! A [`GradAcc`] keeps the last BF16 dW instead, and the readers of the gradient
//! (the gradient norm, AdamW: `grad_val` in `common.cuh`) add it where they load
//! the value, with the epilogue's `__fadd_rn(acc, dW)`; an accumulator nothing has
//! written yet is read as +0 and never zeroed. The values, so the bits, are the
//! epilogue's. With one micro-batch a matrix's gradient is not written in f32 at
//! all unless something else adds into it too (the tied LM head's, which the
//! embedding's scatter settles; a WGrad output with padding columns and the f32
//! flow's take the epilogue as before); with more, each dW but the last is added
//! before the next backward pass, all of them in one launch ([`settle_multi`]), or
//! when the next one arrives.
//!
//! A gradient written by a scatter (the untied embedding's, a few thousand rows of
//! 150k) can carry a mask: a byte a [`MASK_CHUNK`]-value chunk, 0 where the chunk holds +0.
//! The scatter marks the chunks it writes; clearing zeroes the marked chunks alone
//! (`grad_mask_clear`, in place of a memset of the whole table: 2.5 GB at Qwen3-8B),
//! and the gradient norm and AdamW take the unmarked chunks as the +0 they hold
//! without reading them. Any other writer marks every chunk ([`GradAcc::f32_mut`]),
//! so a chunk marked 0 always holds +0 and a reader may ignore the mask.
//!
//! A WGrad GEMM over projections that share their input (q, k, v; gate, up) writes
//! one BF16 `[sum of n, k]` output whose row blocks are the projections' dW: each
//! gradient holds its block of that shared buffer ([`GradAcc::add_bf16_part`]).
//!
//! Memory: every held dW lives until the optimizer step (2 bytes a parameter of the
//! matrices: ~0.9 GB at Qwen3-0.6B, ~2.8 GB at Qwen3-8B shapes with 4 layers), at the
//! end of the backward, when the activations are mostly freed.

use std::sync::Arc;

use cudarc::driver::CudaSlice;

use super::context::{Arg, TENSOR};
use super::part::Bf16View;
use super::{check_len, ensure, Ctx, Gpu, Result};

/// A gradient `[len]`: an f32 accumulator (read as +0 until first written) plus, at
/// most, one BF16 addend `[len]` not yet added into it.
pub struct GradAcc {
    acc: CudaSlice<f32>,
    /// `acc` holds no value yet: the gradient is +0 plus `pending`.
    zero: bool,
    /// The last WGrad output, still in BF16 (added after `acc`).
    pending: Option<Held>,
    /// `[ceil(len / MASK_CHUNK)]`: 0 where `acc`'s chunk holds +0 (see the module).
    mask: Option<CudaSlice<u8>>,
}

/// A held BF16 addend: values `[off, off + len)` of a WGrad output, the whole of
/// its own buffer or a row block of one shared by several gradients.
struct Held {
    buf: Arc<CudaSlice<u16>>,
    off: usize,
}

/// Values a mask byte covers (`GRAD_MASK_SHIFT` in common.cuh, held to it by a test).
pub const MASK_CHUNK: usize = 1024;

/// How a kernel reads one gradient of `len` values: `acc` (None: +0) plus, when
/// given, `pend`'s BF16 values (`grad_val`). What [`super::adamw::adamw_multi`] and
/// [`super::tensor::sum_squares_multi`] take.
#[derive(Clone, Copy)]
pub struct GradSrc<'a> {
    pub acc: Option<&'a CudaSlice<f32>>,
    /// The BF16 addend: values `[off, off + len)` of the buffer.
    pub pend: Option<(&'a CudaSlice<u16>, usize)>,
    pub len: usize,
    /// `acc`'s [`MASK_CHUNK`]-value chunks that may hold nonzeros (None: all of them).
    pub mask: Option<&'a CudaSlice<u8>>,
}

impl<'a> GradSrc<'a> {
    /// Plain f32 values.
    pub fn f32(x: &'a CudaSlice<f32>) -> GradSrc<'a> {
        GradSrc {
            acc: Some(x),
            pend: None,
            len: x.len(),
            mask: None,
        }
    }

    /// The mask's pointer (0: none), checked against the length.
    pub(crate) fn mask_ptr(&self, gpu: &Gpu, what: &str) -> Result<u64> {
        let Some(m) = self.mask.filter(|_| self.acc.is_some()) else {
            return Ok(0);
        };
        check_mask(&format!("{what} (chunk mask)"), m, self.len)?;
        Ok(gpu.ptr(m))
    }

    /// The kernels' (acc, pend) pointers (0: none), after checking the lengths.
    pub(crate) fn ptrs(&self, gpu: &Gpu, what: &str) -> Result<(u64, u64)> {
        let n = self.len;
        if let Some(a) = self.acc {
            check_len(what, a, n, format!("[{n}]"))?;
        }
        if let Some((p, off)) = self.pend {
            Bf16View::part(&format!("{what} (BF16 addend)"), p, off, n)?;
        }
        Ok((
            self.acc.map_or(0, |a| gpu.ptr(a)),
            self.pend.map_or(0, |(p, off)| gpu.ptr(p) + 2 * off as u64),
        ))
    }
}

impl GradAcc {
    /// A zero gradient of `len` values.
    pub fn new(gpu: &Gpu, len: usize) -> Result<GradAcc> {
        Ok(GradAcc {
            acc: gpu.zeros(len)?,
            zero: true,
            pending: None,
            mask: None,
        })
    }

    /// A zero gradient of `len` values with a chunk mask, for one that a scatter
    /// writes ([`GradAcc::f32_marked_mut`]): cleared and read chunk by chunk.
    pub fn new_masked(gpu: &Gpu, len: usize) -> Result<GradAcc> {
        let mut g = GradAcc::new(gpu, len)?;
        g.mask = Some(gpu.zeros(len.div_ceil(MASK_CHUNK))?);
        Ok(g)
    }

    /// A gradient whose accumulator already holds `acc`'s values.
    pub fn from_f32(acc: CudaSlice<f32>) -> GradAcc {
        GradAcc {
            acc,
            zero: false,
            pending: None,
            mask: None,
        }
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.acc.len()
    }

    /// Whether the gradient has no values (a zero-length tensor).
    pub fn is_empty(&self) -> bool {
        self.acc.is_empty()
    }

    /// Back to zero, without writing: the next step's gradient. Drops the BF16
    /// addend's buffer.
    pub fn clear(&mut self) {
        self.zero = true;
        self.pending = None;
    }

    /// How the gradient norm and AdamW read it now.
    pub fn src(&self) -> GradSrc<'_> {
        GradSrc {
            acc: (!self.zero).then_some(&self.acc),
            pend: self.pending.as_ref().map(|h| (&*h.buf, h.off)),
            len: self.acc.len(),
            mask: self.mask.as_ref(),
        }
    }

    /// Hold `dw` (BF16, `[len]`: a WGrad output without padding columns) as the
    /// next addend; the one held before, if any, is added into the f32 first.
    pub fn add_bf16(&mut self, gpu: &Gpu, dw: CudaSlice<u16>) -> Result<()> {
        let n = self.len();
        check_len("gradient addend (BF16)", &dw, n, format!("[{n}]"))?;
        self.settle(gpu)?;
        self.pending = Some(Held {
            buf: Arc::new(dw),
            off: 0,
        });
        Ok(())
    }

    /// [`GradAcc::add_bf16`] of values `[off, off + len)` of `buf`, a WGrad output
    /// that other gradients hold blocks of too (freed when the last lets go).
    pub fn add_bf16_part(
        &mut self,
        gpu: &Gpu,
        buf: &Arc<CudaSlice<u16>>,
        off: usize,
    ) -> Result<()> {
        Bf16View::part("gradient addend (BF16)", buf, off, self.len())?;
        self.settle(gpu)?;
        self.pending = Some(Held {
            buf: Arc::clone(buf),
            off,
        });
        Ok(())
    }

    /// The f32 accumulator with every addend in it (zeroed first if nothing wrote
    /// it): for kernels that add into it themselves, and for downloads.
    /// A mask, if any, then marks every chunk: the caller may add anywhere.
    pub fn f32_mut(&mut self, gpu: &Gpu) -> Result<&mut CudaSlice<f32>> {
        self.f32_marked_mut(gpu)?;
        // After the clear, which unmarks what it zeroes.
        mark_all(gpu, self.mask.as_mut())?;
        Ok(&mut self.acc)
    }

    /// [`GradAcc::f32_mut`] for a writer that marks, in the mask (when there is
    /// one), every chunk it writes (`embedding_backward_marked`): a
    /// cleared masked gradient zeroes only the chunks marked before. A writer that
    /// leaves a chunk it wrote unmarked breaks the mask's promise (readers would
    /// take that chunk as +0): one that does not mark takes `f32_mut`.
    pub fn f32_marked_mut(
        &mut self,
        gpu: &Gpu,
    ) -> Result<(&mut CudaSlice<f32>, Option<&mut CudaSlice<u8>>)> {
        self.settle(gpu)?;
        if self.zero {
            match self.mask.as_mut() {
                Some(mask) if !self.acc.is_empty() => {
                    let n = self.acc.len();
                    gpu.launch(
                        &TENSOR,
                        "grad_mask_clear",
                        (n.div_ceil(MASK_CHUNK * 256) as u32, 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Arg::P(gpu.ptr(&self.acc)),
                            Arg::P(gpu.ptr(mask)),
                            Arg::L(n as i64),
                        ],
                    )?;
                }
                Some(_) => {}
                None => gpu
                    .stream()
                    .memset_zeros(&mut self.acc)
                    .ctx("zeroing a gradient")?,
            }
            self.zero = false;
        }
        Ok((&mut self.acc, self.mask.as_mut()))
    }

    /// Add the held BF16 addend into the f32 accumulator (`grad_settle`: the WGrad
    /// epilogue's values).
    fn settle(&mut self, gpu: &Gpu) -> Result<()> {
        let Some((acc, d, n)) = self.settle_args(gpu)? else {
            return Ok(());
        };
        gpu.launch(
            &TENSOR,
            "grad_settle",
            (n.div_ceil(1024) as u32, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::P(acc),
                Arg::P(d),
                Arg::L(n as i64),
                Arg::P(gpu.ptr(&self.acc)),
            ],
        )?;
        // Dropped only once the launch is queued: an error keeps the addend held.
        self.pending = None;
        self.zero = false;
        Ok(())
    }

    /// What `grad_settle` reads for the held addend: the accumulator (0: read as
    /// +0), the addend and the length, its mask marked whole. None where nothing
    /// is held, or the gradient is empty (the addend then dropped).
    fn settle_args(&mut self, gpu: &Gpu) -> Result<Option<(u64, u64, usize)>> {
        let Some(h) = self.pending.as_ref() else {
            return Ok(None);
        };
        let d = gpu.ptr(&*h.buf) + 2 * h.off as u64;
        mark_all(gpu, self.mask.as_mut())?;
        let n = self.acc.len();
        if n == 0 {
            self.pending = None;
            return Ok(None);
        }
        let acc = if self.zero { 0 } else { gpu.ptr(&self.acc) };
        Ok(Some((acc, d, n)))
    }
}

/// [`GradAcc::settle`] of every gradient in `accs` that holds an addend, in one
/// launch (`grad_settle_multi`: the same values as one `grad_settle` each). Before a
/// backward pass, so that pass's WGrad outputs find nothing to settle: with
/// micro-batches of a few hundred rows the ~200 launches a pass of one small
/// matrix each took longer than the bytes they move.
pub fn settle_multi(gpu: &Gpu, accs: &mut [GradAcc]) -> Result<()> {
    let mut tab: Vec<i64> = Vec::new();
    let mut first = 0usize;
    for a in accs.iter_mut() {
        let Some((acc, d, n)) = a.settle_args(gpu)? else {
            continue;
        };
        let blocks = n.div_ceil(1024);
        tab.extend([
            acc as i64,
            d as i64,
            n as i64,
            blocks as i64,
            first as i64,
            gpu.ptr(&a.acc) as i64,
        ]);
        first += blocks;
    }
    let t = tab.len() / 6;
    if first > 0 {
        ensure(first <= u32::MAX as usize && t <= i32::MAX as usize, || {
            format!("grad_settle_multi: {first} blocks over {t} gradients")
        })?;
        let tab = gpu.upload(&tab)?;
        gpu.launch(
            &TENSOR,
            "grad_settle_multi",
            (first as u32, 1, 1),
            (256, 1, 1),
            0,
            &[Arg::P(gpu.ptr(&tab)), Arg::I(t as i32)],
        )?;
    }
    // Dropped only once the launch is queued: an error keeps the addends held.
    for a in accs.iter_mut().filter(|a| a.pending.is_some()) {
        a.pending = None;
        a.zero = false;
    }
    Ok(())
}

/// Check that `mask` has a byte for each [`MASK_CHUNK`] of a gradient's `len`
/// values (`what` names it in the error).
pub(crate) fn check_mask(what: &str, mask: &CudaSlice<u8>, len: usize) -> Result<()> {
    let c = len.div_ceil(MASK_CHUNK);
    check_len(what, mask, c, format!("[{c}]"))
}

/// Every chunk of a gradient's mask (if it has one) marked: a writer that does not
/// mark its own chunks is coming.
fn mark_all(gpu: &Gpu, mask: Option<&mut CudaSlice<u8>>) -> Result<()> {
    if let Some(m) = mask {
        gpu.fill_bytes(m, 1)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::MASK_CHUNK;

    /// The kernels index the mask by `value >> GRAD_MASK_SHIFT` (common.cuh); the
    /// host sizes it and launches over it by MASK_CHUNK. They must agree.
    #[test]
    fn kernels_use_the_hosts_mask_chunk() {
        let src = include_str!("kernels/common.cuh");
        let shift: u32 = src
            .lines()
            .find_map(|l| l.strip_prefix("#define GRAD_MASK_SHIFT "))
            .and_then(|v| v.trim().parse().ok())
            .expect("common.cuh defines GRAD_MASK_SHIFT");
        assert_eq!(1usize << shift, MASK_CHUNK);
    }
}
