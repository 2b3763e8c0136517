//! The batch-invariant BF16 forward GEMM `Y = X W^T` (f32 accumulation): the BF16
//! twin of the FP8 split-K decode kernel and `gemm_fp8_rows` (one template,
//! `gemm_sk` in `gemv_fp8.cu`, mma.sync m16n8k16 BF16). Each output's products
//! are chained in k order within a split of [`splits`] groups and the splits added
//! in order, whichever kernel and however many rows: a decoded row has the bits of
//! the training forward's row, so the `bf16` flow is on-policy bit for bit.
//! (cuBLASLt's BF16 GEMM picks its kernel, and with it the order of a row's sum,
//! by the number of rows.)
//!
//! Operands are the padded BF16 copies of `to_bf16_padded`: `[rows_pad][k_pad]`,
//! zeros in the padding.

use cudarc::driver::CudaSlice;

use super::gemv::{
    launch_rows, partial, partial_group, splitk_sum, Elem, Epi, Partial, SkOps, GEMV_MAX_TOKENS,
};
use super::part::Bf16View;
use super::{ensure, Gpu, Result};

/// A BF16 matrix on the device: `rows x cols` values stored `[rows_pad][cols_pad]`.
#[derive(Clone, Copy)]
pub struct Bf16Rows<'a> {
    pub v: Bf16View<'a>,
    pub rows: usize,
    pub cols: usize,
    pub rows_pad: usize,
    pub cols_pad: usize,
}

fn check(x: &Bf16Rows, w: &Bf16Rows) -> Result<()> {
    for (what, a) in [("X", x), ("W", w)] {
        ensure(
            a.rows_pad >= a.rows
                && a.cols_pad >= a.cols
                && a.cols_pad.is_multiple_of(8)
                && a.v.len() >= a.rows_pad * a.cols_pad,
            || {
                format!(
                    "BF16 GEMM {what}: {} values for [{}, {}] padded to [{}, {}] (rows of 8)",
                    a.v.len(),
                    a.rows,
                    a.cols,
                    a.rows_pad,
                    a.cols_pad
                )
            },
        )?;
    }
    ensure(x.cols == w.cols && x.cols_pad == w.cols_pad, || {
        format!(
            "BF16 GEMM: X has K = {} ({} padded), W has K = {} ({})",
            x.cols, x.cols_pad, w.cols, w.cols_pad
        )
    })?;
    ensure(w.cols > 0 && w.rows > 0, || {
        "BF16 GEMM with K = 0 or N = 0".into()
    })
}

fn ops(gpu: &Gpu, x: &Bf16Rows, w: &Bf16Rows, m0: usize) -> SkOps {
    SkOps {
        elem: Elem::Bf16,
        w: (w.v.ptr(gpu), 0, 0),
        x: (x.v.ptr(gpu) + (m0 * x.cols_pad * 2) as u64, 0, 0),
        m: x.rows - m0,
        n: w.rows,
        n_pad: w.rows_pad,
        k_pad: w.cols_pad,
    }
}

/// Partial sums of the split-K kernel for all of `x`'s rows, 64 a block on grid z
/// (the linear layer adds the slices in its epilogue).
pub(crate) fn gemv_bf16_partial(gpu: &Gpu, x: Bf16Rows, w: Bf16Rows) -> Result<Partial> {
    check(&x, &w)?;
    partial(gpu, &ops(gpu, &x, &w, 0))
}

/// [`gemv_bf16_partial`] for up to three weights in one launch ([`partial_group`]).
pub(crate) fn gemv_bf16_partial_group(
    gpu: &Gpu,
    x: Bf16Rows,
    ws: &[Bf16Rows],
) -> Result<Vec<Partial>> {
    let mut o = vec![];
    for w in ws {
        check(&x, w)?;
        o.push(ops(gpu, &x, w, 0));
    }
    partial_group(gpu, &o)
}

fn check_out(x: &Bf16Rows, w: &Bf16Rows, len: usize, ld: usize) -> Result<()> {
    let (m, n) = (x.rows, w.rows);
    ensure(ld >= n && len >= m.saturating_sub(1) * ld + n, || {
        format!("BF16 GEMM output holds {len} values, fewer than [{m}, {n}] with stride {ld}")
    })
}

/// `d [M][ldd] = x [M, K] w [N, K]^T` for any number of rows in one launch (128
/// tokens x 128 outputs a block), each row's bits those of the split-K kernel.
pub fn gemm_bf16_rows(
    gpu: &Gpu,
    x: Bf16Rows,
    w: Bf16Rows,
    d: &CudaSlice<f32>,
    ldd: usize,
) -> Result<()> {
    check(&x, &w)?;
    check_out(&x, &w, d.len(), ldd)?;
    let o = ops(gpu, &x, &w, 0);
    launch_rows(gpu, &o, (gpu.ptr(d), ldd), Epi::NONE)
}

/// [`gemm_bf16_rows`] with the linear layer's epilogue fused (`epi.y`).
pub(crate) fn gemm_bf16_rows_fused(gpu: &Gpu, x: Bf16Rows, w: Bf16Rows, epi: Epi) -> Result<()> {
    check(&x, &w)?;
    check_out(&x, &w, usize::MAX, epi.ldy)?;
    launch_rows(gpu, &ops(gpu, &x, &w, 0), (0, 0), epi)
}

/// [`gemm_bf16_rows`] with the epilogue a training forward fuses into it, for
/// timing the kernel as the step runs it: the sums rounded to BF16, then added to
/// `res` and stored as f32 (the o and down projections), or without `res` stored
/// as BF16 values into `y`'s bytes (v, gate, up and the LM head of a training
/// forward; q and k leave as f32, `gemm_bf16_rows`' form).
pub fn gemm_bf16_rows_step_form(
    gpu: &Gpu,
    x: Bf16Rows,
    w: Bf16Rows,
    y: &CudaSlice<f32>,
    res: Option<&CudaSlice<f32>>,
) -> Result<()> {
    check(&x, &w)?;
    check_out(&x, &w, y.len(), w.rows)?;
    if let Some(r) = res {
        check_out(&x, &w, r.len(), w.rows)?;
    }
    let epi = Epi {
        y: gpu.ptr(y),
        ldy: w.rows,
        bias: 0,
        round: true,
        res: res.map_or(0, |r| gpu.ptr(r)),
        bf16: res.is_none(),
    };
    gemm_bf16_rows_fused(gpu, x, w, epi)
}

/// `y [M][ldy] = x w^T` through the split-K decode kernel, [`GEMV_MAX_TOKENS`]
/// rows a launch, the slices added in order.
pub fn gemv_bf16_into(
    gpu: &Gpu,
    x: Bf16Rows,
    w: Bf16Rows,
    y: &mut CudaSlice<f32>,
    ldy: usize,
) -> Result<()> {
    check(&x, &w)?;
    check_out(&x, &w, y.len(), ldy)?;
    let (m, n) = (x.rows, w.rows);
    let yp = gpu.ptr(y);
    let mut m0 = 0;
    while m0 < m {
        let mc = GEMV_MAX_TOKENS.min(m - m0);
        let p = partial(gpu, &ops(gpu, &x, &w, m0).first(mc))?;
        splitk_sum(
            gpu,
            gpu.ptr(&p.p),
            p.splits,
            (mc, n),
            yp + (m0 * ldy * 4) as u64,
            ldy,
        )?;
        m0 += mc;
    }
    Ok(())
}
