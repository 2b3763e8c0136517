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
//! all unless something else adds into it too (the tied LM head's, whose held
//! output the embedding's scatter settles in the rows it writes alone,
//! [`GradAcc::f32_scatter_mut`]; a WGrad output with padding columns and the f32
//! flow's take the epilogue as before); with more, each dW but the last is added
//! before the next backward pass, all of them in one launch ([`settle_multi`]), or
//! when the next one arrives.
//!
//! A gradient written by a scatter (the embedding's, a few thousand rows of 150k,
//! tied or not) can carry a mask: a byte a [`MASK_CHUNK`]-value chunk, 0 where the chunk holds +0.
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

/// A gradient `[len]`: an f32 accumulator (read as +0 until first written) plus
/// BF16 addends `[len]` not yet added into it: at most [`GradAcc::set_hold`]'s
/// count (one unless set), and one when a reader takes [`GradAcc::src`].
pub struct GradAcc {
    acc: CudaSlice<f32>,
    /// `acc` holds no value yet: the gradient is +0 plus `pending`.
    zero: bool,
    /// The last WGrad outputs, still in BF16, oldest first (added after `acc` in
    /// this order).
    pending: Vec<Held>,
    /// Addends held at most (at least 1).
    hold: usize,
    /// `[ceil(len / MASK_CHUNK)]`: 0 where `acc`'s chunk holds +0 (see the module).
    mask: Option<CudaSlice<u8>>,
}

/// A held BF16 addend: values `[off, off + len)` of a WGrad output, the whole of
/// its own buffer or a row block of one shared by several gradients.
struct Held {
    buf: Arc<CudaSlice<u16>>,
    off: usize,
}

impl Held {
    /// The device address of the addend's first value.
    fn ptr(&self, gpu: &Gpu) -> u64 {
        gpu.ptr(&*self.buf) + 2 * self.off as u64
    }
}

/// Values a mask byte covers (`GRAD_MASK_SHIFT` in common.cuh, held to it by a test).
pub const MASK_CHUNK: usize = 1024;

/// Addends a gradient may hold at most (`SETTLE_MAX` in tensor.cu, held to it by a
/// test): `grad_settle_multi`'s table has a pointer for each.
pub const HOLD_MAX: usize = 8;

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
            pending: Vec::new(),
            hold: 1,
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
            pending: Vec::new(),
            hold: 1,
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
        self.pending.clear();
    }

    /// Hold up to `n` addends (clamped to 1 ..= [`HOLD_MAX`]) before adding them
    /// into the f32 accumulator, all in one pass over it: with micro-batches, a
    /// settle reads and writes the f32 gradient once for `n` WGrad outputs instead
    /// of once each (the same adds in the same order, so the same bits). Each held
    /// addend keeps 2 bytes a value until it is settled.
    pub fn set_hold(&mut self, n: usize) {
        self.hold = n.clamp(1, HOLD_MAX);
    }

    /// Addends held now.
    pub fn held(&self) -> usize {
        self.pending.len()
    }

    /// How the gradient norm and AdamW read it now: the accumulator plus the last
    /// addend. Holding more than one is an error: [`settle_multi`] with
    /// [`Settle::AllButLast`] first.
    pub fn src(&self) -> Result<GradSrc<'_>> {
        ensure(self.pending.len() <= 1, || {
            format!(
                "a gradient read with {} BF16 addends held (one at most)",
                self.pending.len()
            )
        })?;
        Ok(GradSrc {
            acc: (!self.zero).then_some(&self.acc),
            pend: self.pending.last().map(|h| (&*h.buf, h.off)),
            len: self.acc.len(),
            mask: self.mask.as_ref(),
        })
    }

    /// Hold `dw` (BF16, `[len]`: a WGrad output without padding columns) as the
    /// next addend; where as many as [`GradAcc::set_hold`] allows are held already,
    /// they are added into the f32 first.
    pub fn add_bf16(&mut self, gpu: &Gpu, dw: CudaSlice<u16>) -> Result<()> {
        let n = self.len();
        check_len("gradient addend (BF16)", &dw, n, format!("[{n}]"))?;
        self.make_room(gpu)?;
        self.pending.push(Held {
            buf: Arc::new(dw),
            off: 0,
        });
        Ok(())
    }

    /// The held addends settled where one more would exceed the hold.
    fn make_room(&mut self, gpu: &Gpu) -> Result<()> {
        match self.pending.len() >= self.hold {
            true => self.settle(gpu),
            false => Ok(()),
        }
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
        self.make_room(gpu)?;
        self.pending.push(Held {
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
        self.clear_if_zero(gpu)?;
        Ok((&mut self.acc, self.mask.as_mut()))
    }

    /// [`GradAcc::f32_marked_mut`] for a scatter that adds into a few rows and
    /// settles the held addends of those rows itself (`embedding_bwd`): the tied
    /// embedding's gradient, which the LM head's WGrad outputs are held in. With a
    /// mask and addends no other gradient shares, nothing is settled here: the
    /// scatter takes the held addends' values in the rows it writes (in order,
    /// then its own) and zeroes them there, so the rest stay held and the
    /// accumulator is written in those rows alone (a 0.6B step settled all 155M
    /// values, 0.31 ms, to add a few thousand rows). Only where the gradient holds
    /// one addend at a time (a pass of one micro-batch, or a hold of 1): with
    /// several micro-batches' outputs held, the GRPO-shaped fp8 training phase ran
    /// 4-12 ms slower (H100, fifty-seventh session, not understood), so there every
    /// addend is settled first, as [`GradAcc::f32_marked_mut`] does, and none is
    /// handed over ([`ScatterSettle`] switches it).
    pub fn f32_scatter_mut(&mut self, gpu: &Gpu) -> Result<ScatterDest<'_>> {
        // A held block of a buffer another gradient holds too must not be zeroed.
        let own = self.pending.iter().all(|h| Arc::strong_count(&h.buf) == 1);
        let rows = match scatter_settles() {
            ScatterSettle::Off => false,
            ScatterSettle::OneHeld => self.hold == 1,
            ScatterSettle::AnyHold => true,
        };
        if self.mask.is_none() || !own || !rows {
            let (acc, mask) = self.f32_marked_mut(gpu)?;
            return Ok(ScatterDest {
                acc,
                mask,
                held: Vec::new(),
            });
        }
        self.clear_if_zero(gpu)?;
        let held = self.pending.iter().map(|h| h.ptr(gpu)).collect();
        Ok(ScatterDest {
            acc: &mut self.acc,
            mask: self.mask.as_mut(),
            held,
        })
    }

    /// A gradient nothing has written yet gets its +0 in the accumulator: the
    /// chunks the mask marks zeroed (the others hold +0 already), else all of it.
    fn clear_if_zero(&mut self, gpu: &Gpu) -> Result<()> {
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
        Ok(())
    }

    /// Add the held BF16 addends into the f32 accumulator, oldest first: one
    /// (`grad_settle`: the WGrad epilogue's values) or several
    /// ([`settle_multi`]'s launch over this gradient alone).
    fn settle(&mut self, gpu: &Gpu) -> Result<()> {
        if self.pending.len() > 1 {
            return settle_multi(gpu, std::slice::from_mut(self), Settle::All);
        }
        let Some((acc, d, n)) = self.settle_args(gpu, 1)? else {
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
                Arg::P(d[0]),
                Arg::L(n as i64),
                Arg::P(gpu.ptr(&self.acc)),
            ],
        )?;
        // Dropped only once the launch is queued: an error keeps the addend held.
        self.settled(1);
        Ok(())
    }

    /// What a settle of the oldest `count` held addends reads: the accumulator (0:
    /// read as +0), the addends and the length, the mask marked whole. None where
    /// nothing is to be settled, or the gradient is empty (the addends then
    /// dropped).
    fn settle_args(&mut self, gpu: &Gpu, count: usize) -> Result<Option<(u64, Vec<u64>, usize)>> {
        let count = count.min(self.pending.len());
        if count == 0 {
            return Ok(None);
        }
        let d = self.pending[..count].iter().map(|h| h.ptr(gpu)).collect();
        mark_all(gpu, self.mask.as_mut())?;
        let n = self.acc.len();
        if n == 0 {
            self.pending.clear();
            return Ok(None);
        }
        let acc = if self.zero { 0 } else { gpu.ptr(&self.acc) };
        Ok(Some((acc, d, n)))
    }

    /// The oldest `count` addends are in the accumulator now.
    fn settled(&mut self, count: usize) {
        self.pending.drain(..count.min(self.pending.len()));
        self.zero = false;
    }
}

/// Where a scatter adds into a gradient ([`GradAcc::f32_scatter_mut`]): the
/// accumulator, its chunk mask (to mark what it writes), and the held BF16 addends
/// (device addresses, oldest first) it adds into the rows it writes before its own
/// values, zeroing them there.
pub struct ScatterDest<'a> {
    pub acc: &'a mut CudaSlice<f32>,
    pub mask: Option<&'a mut CudaSlice<u8>>,
    pub held: Vec<u64>,
}

/// Where a scatter settles the held addends of the rows it writes itself
/// ([`GradAcc::f32_scatter_mut`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScatterSettle {
    /// Nowhere: the whole gradient is settled first (`JET_SCATTER_SETTLE=0`, the
    /// behaviour before the fifty-seventh session).
    Off,
    /// Where the gradient holds one addend at a time (the default).
    OneHeld,
    /// At any hold (`JET_SCATTER_SETTLE=all`, a measurement switch: with eight
    /// held, the fp8 GRPO-shaped step's training ran 4-12 ms slower, H100,
    /// fifty-seventh session).
    AnyHold,
}

/// 0: not read yet; 1, 2, 3: [`ScatterSettle`]'s `Off`, `OneHeld`, `AnyHold`.
static SCATTER_SETTLES: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The [`ScatterSettle`] in force: `JET_SCATTER_SETTLE` (`0`, `all`), else
/// [`ScatterSettle::OneHeld`].
fn scatter_settles() -> ScatterSettle {
    match SCATTER_SETTLES.load(std::sync::atomic::Ordering::Relaxed) {
        1 => ScatterSettle::Off,
        2 => ScatterSettle::OneHeld,
        3 => ScatterSettle::AnyHold,
        _ => {
            let v = std::env::var("JET_SCATTER_SETTLE").unwrap_or_default();
            let mode = match v.trim() {
                "0" => ScatterSettle::Off,
                "all" => ScatterSettle::AnyHold,
                _ => ScatterSettle::OneHeld,
            };
            set_scatter_settles(mode);
            mode
        }
    }
}

/// Set [`ScatterSettle`] for this process (tests that compare the paths).
#[doc(hidden)]
pub fn set_scatter_settles(mode: ScatterSettle) {
    let v = match mode {
        ScatterSettle::Off => 1,
        ScatterSettle::OneHeld => 2,
        ScatterSettle::AnyHold => 3,
    };
    SCATTER_SETTLES.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// Which held addends [`settle_multi`] adds into their accumulators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// Every one.
    All,
    /// Every one of the gradients that hold as many as they may
    /// ([`GradAcc::set_hold`]): before a backward pass, whose WGrad outputs then
    /// find room to be held.
    Full,
    /// All but the last of each: before the gradient norm and AdamW read
    /// ([`GradAcc::src`] takes one addend).
    AllButLast,
}

/// `GradAcc::settle` of the gradients in `accs` as `which` says, in one launch
/// (`grad_settle_multi`: each value's adds in the order of one `grad_settle` an
/// addend, so the same values). With micro-batches of a few hundred rows the ~200
/// launches a pass of one small matrix each took longer than the bytes they move.
pub fn settle_multi(gpu: &Gpu, accs: &mut [GradAcc], which: Settle) -> Result<()> {
    let mut tab: Vec<i64> = Vec::new();
    let mut done: Vec<(usize, usize)> = Vec::new();
    let mut first = 0usize;
    for (i, a) in accs.iter_mut().enumerate() {
        let count = match which {
            Settle::All => a.pending.len(),
            Settle::Full if a.pending.len() >= a.hold => a.pending.len(),
            Settle::Full => 0,
            Settle::AllButLast => a.pending.len().saturating_sub(1),
        };
        let Some((acc, d, n)) = a.settle_args(gpu, count)? else {
            continue;
        };
        ensure(d.len() <= HOLD_MAX, || {
            format!(
                "grad_settle_multi: {} addends held (at most {HOLD_MAX})",
                d.len()
            )
        })?;
        let blocks = n.div_ceil(1024);
        // {acc, n, blocks, first block, y, addends, d[0] .. d[HOLD_MAX - 1]}
        tab.extend([
            acc as i64,
            n as i64,
            blocks as i64,
            first as i64,
            gpu.ptr(&a.acc) as i64,
            d.len() as i64,
        ]);
        tab.extend((0..HOLD_MAX).map(|j| d.get(j).map_or(0, |&p| p as i64)));
        first += blocks;
        done.push((i, d.len()));
    }
    let t = tab.len() / SETTLE_ROW;
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
    for (i, count) in done {
        accs[i].settled(count);
    }
    Ok(())
}

/// Int64 fields of a `grad_settle_multi` table row.
const SETTLE_ROW: usize = 6 + HOLD_MAX;

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
    use super::{HOLD_MAX, MASK_CHUNK};

    /// The value of `#define NAME` in a kernel source.
    fn define(src: &str, name: &str) -> usize {
        let at = format!("#define {name} ");
        src.lines()
            .find_map(|l| l.strip_prefix(at.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("the kernel source defines {name}"))
    }

    /// The kernels index the mask by `value >> GRAD_MASK_SHIFT` (common.cuh); the
    /// host sizes it and launches over it by MASK_CHUNK. They must agree.
    #[test]
    fn kernels_use_the_hosts_mask_chunk() {
        let shift = define(include_str!("kernels/common.cuh"), "GRAD_MASK_SHIFT");
        assert_eq!(1usize << shift, MASK_CHUNK);
    }

    /// `grad_settle_multi`'s table rows have a pointer for each addend a gradient
    /// may hold: the host's HOLD_MAX is the kernel's SETTLE_MAX.
    #[test]
    fn settle_table_holds_every_addend() {
        let max = define(include_str!("kernels/tensor.cu"), "SETTLE_MAX");
        assert_eq!(max, HOLD_MAX);
    }

    /// The embedding's scatter takes every addend the tied LM head's gradient
    /// may hold (`GradAcc::f32_scatter_mut`): ops.cu's EMB_HELD_MAX, the host's
    /// `ops::EMB_HELD_MAX` and HOLD_MAX agree.
    #[test]
    fn the_scatter_takes_every_held_addend() {
        let max = define(include_str!("kernels/ops.cu"), "EMB_HELD_MAX");
        assert_eq!(max, HOLD_MAX);
        assert_eq!(crate::cuda::ops::EMB_HELD_MAX, HOLD_MAX);
    }
}
