//! The AdamW update on the device (`adamw.cu`), bit-exact with [`adamw_reference`],
//! the CPU loop the backend's optimizer runs: f32 moments and parameters, the step
//! itself in f64, rounded to f32 once. The kernel spells every operation as a
//! round-to-nearest intrinsic, so no multiply-add is ever fused.

use cudarc::driver::CudaSlice;

use super::context::{Arg, ADAMW};
use super::grad::GradSrc;
use super::part::Bf16View;
use super::quantize::{Fp8Quantized, TDest};
use super::{check_len, ensure, Gpu, Result};
use crate::fp8::{Grouping, GROUP};

/// The scalars of one AdamW step for one tensor.
#[derive(Clone, Copy, Debug)]
pub struct AdamStep {
    /// Learning rate.
    pub lr: f64,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f64,
    /// Bias corrections `1 - beta1^t` and `1 - beta2^t` (t counts from 1).
    pub bc1: f64,
    pub bc2: f64,
    /// Decoupled weight decay: `p *= wd_factor` (e.g. `1 - lr * wd`) when `decay`.
    pub wd_factor: f32,
    pub decay: bool,
    /// The gradient is multiplied by this first (gradient clipping, loss scaling).
    pub grad_scale: f32,
}

/// The specification: one AdamW step on every element of `p`, `g`, `m`, `v` (equal
/// lengths), in exactly this order of f32 and f64 operations.
#[allow(clippy::needless_range_loop)] // the loop is the spec, index by index
pub fn adamw_reference(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: &AdamStep) {
    let n = p.len();
    assert!(
        g.len() == n && m.len() == n && v.len() == n,
        "adamw_reference: lengths p {n}, g {}, m {}, v {}",
        g.len(),
        m.len(),
        v.len()
    );
    let (b1, b2) = (s.beta1, s.beta2);
    for i in 0..n {
        let gi = g[i] * s.grad_scale;
        m[i] = b1 * m[i] + (1.0 - b1) * gi;
        v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
        let mhat = m[i] as f64 / s.bc1;
        let vhat = v[i] as f64 / s.bc2;
        if s.decay {
            p[i] *= s.wd_factor;
        }
        p[i] -= (s.lr * mhat / (vhat.sqrt() + s.eps)) as f32;
    }
}

/// One AdamW step in place on the first `n` values of `p`, `m`, `v` from gradient
/// `g` (all `[n]`, f32); grid `ceil(n / 256)` blocks of 256 threads, no scratch.
pub fn adamw_step(
    gpu: &Gpu,
    p: &mut CudaSlice<f32>,
    g: &CudaSlice<f32>,
    m: &mut CudaSlice<f32>,
    v: &mut CudaSlice<f32>,
    n: usize,
    s: &AdamStep,
) -> Result<()> {
    for (what, b) in [
        ("adamw p", &*p),
        ("adamw g", g),
        ("adamw m", &*m),
        ("adamw v", &*v),
    ] {
        check_len(what, b, n, format!("[{n}]"))?;
    }
    gpu.launch(
        &ADAMW,
        "adamw_step",
        (n.div_ceil(256) as u32, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(p)),
            Arg::P(gpu.ptr(g)),
            Arg::P(gpu.ptr(m)),
            Arg::P(gpu.ptr(v)),
            Arg::L(n as i64),
        ]
        .into_iter()
        .chain(scalars(s, true))
        .collect::<Vec<_>>(),
    )
}

/// The step's scalars as `adamw.cu` takes them (with the decay flag for the
/// one-tensor kernel; the multi-tensor one reads it from its table).
fn scalars(s: &AdamStep, with_decay: bool) -> Vec<Arg> {
    let mut a = vec![
        Arg::D(s.lr),
        Arg::F(s.beta1),
        Arg::F(s.beta2),
        Arg::D(s.eps),
        Arg::D(s.bc1),
        Arg::D(s.bc2),
        Arg::D(recip(s.bc1)),
        Arg::D(recip(s.bc2)),
        Arg::F(s.wd_factor),
    ];
    if with_decay {
        a.push(Arg::I(s.decay as i32));
    }
    a.push(Arg::F(s.grad_scale));
    a
}

/// `1 / b` correctly rounded (Rust's f64 division), which the kernel's division
/// by a bias correction multiplies by before its exact correction; 0, which
/// makes the kernel divide, when `b` or its reciprocal is not a normal number.
fn recip(b: f64) -> f64 {
    let r = 1.0 / b;
    if b.is_normal() && r.is_normal() {
        r
    } else {
        0.0
    }
}

/// One tensor of an [`adamw_multi`] step: `p`, `m`, `v` updated in place from
/// the gradient `g` (f32, or an accumulator with its BF16 addend: [`GradSrc`]),
/// all of `p`'s length; weight decay when `decay`. `p_bf16`: the parameter's BF16
/// copy (a GEMM operand whose rows have no padding columns: its first n values are
/// the weight's, row by row), rewritten from the new values with
/// `to_bf16_padded`'s rounding, so it need not be made again. `blocks`: the
/// parameter's 128x128 FP8 blocks (a weight `[rows, cols]` of `p`'s length),
/// rewritten from the new values with `quantize_block128`'s bits (the step and the
/// quantizer in one launch, `adamw_block128_multi`).
pub struct AdamTensor<'a> {
    pub p: &'a mut CudaSlice<f32>,
    pub g: GradSrc<'a>,
    pub m: &'a mut CudaSlice<f32>,
    pub v: &'a mut CudaSlice<f32>,
    pub decay: bool,
    pub p_bf16: Option<Bf16View<'a>>,
    pub blocks: Option<BlockTargets<'a>>,
}

/// A weight's FP8 GEMM operands that an optimizer step rewrites: its 128x128
/// blocks `w` (Block128 of `[rows, cols]`) and, when the flow's DGrad is FP8, those
/// of its transpose `t` (`[cols, rows]`).
pub struct BlockTargets<'a> {
    pub w: &'a mut Fp8Quantized,
    pub t: Option<TTarget<'a>>,
}

/// Where an optimizer step writes a weight's `W^T` blocks: buffers of its own, or
/// its columns of a stacked `W^T` shared with the projections that read the same
/// input ([`TDest::part`]).
pub enum TTarget<'a> {
    Own(&'a mut Fp8Quantized),
    Part(TDest),
}

/// [`adamw_step`] on every tensor of `ts` in one launch (two with FP8 blocks to rewrite) (`s.decay` is replaced
/// by each tensor's own): the same operations per element, so the same bits as
/// one launch per tensor (on the gradient's values), without a launch's host work
/// per tensor (a 0.6B model has 310 tensors).
pub fn adamw_multi(gpu: &Gpu, ts: &mut [AdamTensor], s: &AdamStep) -> Result<()> {
    adamw_multi_scaled(gpu, ts, s, None)
}

/// [`adamw_multi`] with the gradient's scale read on the device from `scale[0]`
/// (`tensor::clip_scale`'s) instead of `s.grad_scale`: the same operations, so
/// the same bits as `adamw_multi` given that value, without the host waiting for
/// the gradient norm before it launches the step.
pub fn adamw_multi_scaled(
    gpu: &Gpu,
    ts: &mut [AdamTensor],
    s: &AdamStep,
    scale: Option<&CudaSlice<f32>>,
) -> Result<()> {
    if let Some(x) = scale {
        check_len("adamw gradient scale", x, 1, "[1]")?;
    }
    // Tensors with FP8 blocks to rewrite take the fused launch, the others
    // adamw_multi's (disjoint tensors: the order of the two does not matter).
    // Both tables are built, every tensor checked, before either kernel runs: an
    // error leaves every tensor as it was.
    let (fused, plain): (Vec<&mut AdamTensor>, Vec<&mut AdamTensor>) =
        ts.iter_mut().partition(|t| t.blocks.is_some());
    let (btab, bcount, bfirst) = blocks_table(gpu, fused)?;
    let mut tab: Vec<i64> = Vec::with_capacity(plain.len() * 10);
    let mut first = 0usize;
    for t in plain.iter() {
        let n = t.p.len();
        let (state, pend) = check_tensor(gpu, t)?;
        tab.extend(state);
        tab.extend([
            n as i64,
            first as i64,
            t.decay as i64,
            pend,
            t.p_bf16.map_or(0, |b| b.ptr(gpu)) as i64,
            t.g.mask_ptr(gpu, "adamw g")? as i64,
        ]);
        first += n.div_ceil(1024);
    }
    let count = plain.len();
    super::ensure(
        first <= i32::MAX as usize && bfirst <= i32::MAX as usize,
        || format!("adamw: {first} + {bfirst} blocks is more than a launch takes"),
    )?;
    // Each thread of the fused kernel parks its eight new quads while the step runs.
    launch_table(
        gpu,
        ("adamw_block128_multi", 512, 8 * 512 * 16),
        (&btab, bcount, bfirst),
        s,
        scale,
    )?;
    launch_table(gpu, ("adamw_multi", 256, 0), (&tab, count, first), s, scale)
}

/// A multi-tensor step kernel `name` (threads a block, dynamic shared bytes) over
/// `blocks` blocks, its table of `count` tensors uploaded, then freed in stream
/// order after the launch.
fn launch_table(
    gpu: &Gpu,
    (name, threads, smem): (&'static str, u32, u32),
    (tab, count, blocks): (&[i64], usize, usize),
    s: &AdamStep,
    scale: Option<&CudaSlice<f32>>,
) -> Result<()> {
    if blocks == 0 {
        return Ok(());
    }
    let tab = gpu.upload(tab)?;
    gpu.launch(
        &ADAMW,
        name,
        (blocks as u32, 1, 1),
        (threads, 1, 1),
        smem,
        &[Arg::P(gpu.ptr(&tab)), Arg::I(count as i32)]
            .into_iter()
            .chain(scalars(s, false))
            .chain([Arg::P(scale.map_or(0, |x| gpu.ptr(x)))])
            .collect::<Vec<_>>(),
    )
}

/// `t`'s pointers as the kernels' tables hold them, after checking that its
/// gradient, moments and BF16 copy hold the parameter's length: p, the gradient's
/// accumulator, m, v, then the gradient's held BF16 addend (0: none).
fn check_tensor(gpu: &Gpu, t: &AdamTensor) -> Result<([i64; 4], i64)> {
    let n = t.p.len();
    super::ensure(t.g.len == n, || {
        format!("adamw g: {} values for a tensor of {n}", t.g.len)
    })?;
    let (g, pend) = t.g.ptrs(gpu, "adamw g")?;
    for (what, b) in [("adamw m", &*t.m), ("adamw v", &*t.v)] {
        check_len(what, b, n, format!("[{n}]"))?;
    }
    if let Some(b) = t.p_bf16 {
        ensure(b.len() >= n, || {
            format!("adamw BF16 copy: {} values for a tensor of {n}", b.len())
        })?;
    }
    let ptr = |x: &CudaSlice<f32>| gpu.ptr(x) as i64;
    Ok(([ptr(&*t.p), g as i64, ptr(&*t.m), ptr(&*t.v)], pend as i64))
}

/// Int64 fields of an `adamw_block128_multi` table row (adamw.cu's BLOCKS_ROW).
const BLOCKS_ROW: usize = 21;

/// `adamw_block128_multi`'s table over the tensors whose FP8 blocks the step
/// rewrites (a block of 512 threads a 128x128 block of each weight), checked:
/// (table, tensors, blocks).
fn blocks_table(gpu: &Gpu, ts: Vec<&mut AdamTensor>) -> Result<(Vec<i64>, usize, usize)> {
    let mut tab: Vec<i64> = Vec::with_capacity(ts.len() * BLOCKS_ROW);
    let mut first = 0usize;
    for t in ts.iter() {
        let Some(b) = t.blocks.as_ref() else {
            continue;
        };
        let (state, pend) = check_tensor(gpu, t)?;
        let (rows, cols) = (b.w.rows, b.w.cols);
        super::ensure(
            b.w.grouping == Grouping::Block128 && rows * cols == t.p.len(),
            || {
                format!(
                    "adamw FP8 blocks: {:?} of [{rows}, {cols}] for a tensor of {}",
                    b.w.grouping,
                    t.p.len()
                )
            },
        )?;
        let (rb, cb) = (rows.div_ceil(GROUP), cols.div_ceil(GROUP));
        super::ensure(
            b.w.rows_pad >= rows
                && b.w.cols_pad >= cols
                && b.w.lds >= cb
                && b.w.codes.len() >= b.w.rows_pad * b.w.cols_pad
                && b.w.scales.len() >= rb * b.w.lds,
            || {
                format!("adamw FP8 blocks of [{rows}, {cols}]: codes or scales too small for their padding")
            },
        )?;
        if let Some(TTarget::Own(bt)) = b.t.as_ref() {
            super::ensure(
                bt.grouping == Grouping::Block128
                    && (bt.rows, bt.cols) == (cols, rows)
                    && (bt.rows_pad, bt.cols_pad) == (b.w.cols_pad, b.w.rows_pad)
                    && bt.lds >= rb
                    && bt.codes.len() >= bt.rows_pad * bt.cols_pad
                    && bt.scales.len() >= cb * bt.lds,
                || {
                    format!(
                        "adamw FP8 blocks of W^T: {:?} of [{}, {}] for a weight [{rows}, {cols}]",
                        bt.grouping, bt.rows, bt.cols
                    )
                },
            )?;
        }
        let dest = match b.t.as_ref() {
            Some(TTarget::Own(bt)) => Some(TDest::own(gpu, bt)),
            Some(TTarget::Part(d)) => {
                d.check(rows, cols)?;
                Some(*d)
            }
            None => None,
        };
        let [ct, st, ldt, _, ldct, zlim] = TDest::entries(dest.as_ref(), 0);
        tab.extend(state);
        tab.extend([
            pend,
            t.p_bf16.map_or(0, |x| x.ptr(gpu)) as i64,
            rows as i64,
            cols as i64,
            b.w.rows_pad as i64,
            b.w.cols_pad as i64,
            gpu.ptr(&b.w.codes) as i64,
            gpu.ptr(&b.w.scales) as i64,
            b.w.lds as i64,
            ct,
            st,
            ldt,
            t.decay as i64,
            first as i64,
            ldct,
            zlim,
            t.g.mask_ptr(gpu, "adamw g")? as i64,
        ]);
        first += rows.div_ceil(GROUP) * cols.div_ceil(GROUP);
    }
    let count = tab.len() / BLOCKS_ROW;
    Ok((tab, count, first))
}

#[cfg(test)]
mod tests {
    /// The host builds `adamw_block128_multi`'s table rows as wide as the kernel
    /// reads them (adamw.cu's BLOCKS_ROW).
    #[test]
    fn blocks_table_rows_are_the_kernels() {
        let src = include_str!("kernels/adamw.cu");
        let row: usize = src
            .lines()
            .find_map(|l| l.strip_prefix("#define BLOCKS_ROW "))
            .and_then(|v| v.trim().parse().ok())
            .expect("adamw.cu defines BLOCKS_ROW");
        assert_eq!(row, super::BLOCKS_ROW);
    }
}
