//! One BF16 WGrad and one BF16 DGrad for the projections that read the same input
//! (q, k, v; gate, up) in the flows whose backward GEMMs are BF16: their dy as one
//! stacked operand `[m][sum of n]` (`ops::swiglu_backward_bf16_stacked`;
//! `ops::qk_norm_rope_backward_pair_stacked` with `flash::flash_backward_operand_at`),
//! their weights' BF16 copies as the row blocks of one `[sum of n][k]`
//! ([`super::GpuWeight::prepare_stacked`]). At Qwen3-0.6B's widths the GEMMs of one
//! projection leave much of an H100 idle: at 4,096 rows a layer's five BF16 DGrads
//! take 189 us alone and two stacked ones 175, its WGrads 187 and 172 (`cuda_timing
//! backward_gemm_timing`). The FP8 twins are [`super::wgrad_fp8_stacked`] and
//! [`super::linear_dgrad_fp8_stacked`].
//!
//! cuBLASLt picks its kernel by shape, so a stacked block is the sums of one GEMM a
//! projection in f32, added in an order that may differ (`cuda_stacked` bounds it).

use std::sync::Arc;

use cudarc::driver::CudaSlice;

use super::{dense, dense_at, GemmOut, GpuWeight, XIn, XOperand};
use crate::cuda::gemm::{dense_gemm_to, LtType};
use crate::cuda::{check_len, ensure, Gpu, Result};

/// `dw [sum of n][k] = dy^T x`, dy the projections' stacked BF16 operand
/// `[m][sum of n]`, x `[m, k]` (its BF16 copy made once in `xin`). Row block i is
/// projection i's dW, for its gradient to hold ([`crate::cuda::grad::GradAcc::add_bf16_part`]).
/// `k` and `sum of n` multiples of 16 (no padding columns).
pub fn wgrad_bf16_stacked(
    gpu: &Gpu,
    (dy, n): (&CudaSlice<u16>, usize),
    (x, m, k): (XIn, usize, usize),
    xin: &mut XOperand,
) -> Result<Arc<CudaSlice<u16>>> {
    check_stacked("stacked BF16 WGrad", dy, m, n, k)?;
    x.check(m, k)?;
    let xb = xin.of(m, k)?.bf16(gpu, x, m, k)?;
    let d = gpu.uninit::<u16>(n * k)?;
    let (a, b) = (
        dense(gpu, dy, LtType::Bf16, m, n, n),
        dense(gpu, xb, LtType::Bf16, m, k, k),
    );
    dense_gemm_to(gpu, (a, true), (b, false), (gpu.ptr(&d), k, LtType::Bf16))?;
    Ok(Arc::new(d))
}

/// `dx [m, k] = dy w`, dy the projections' stacked BF16 operand `[m][sum of n]` and
/// `w` their stacked BF16 weights `[sum of n][k]` (`Stacked::Bf16`): the sum of the
/// projections' dx comes out of the GEMM, as it wrote it (BF16, row stride k).
pub fn linear_dgrad_bf16_stacked(
    gpu: &Gpu,
    (dy, n): (&CudaSlice<u16>, usize),
    w: &CudaSlice<u16>,
    (m, k): (usize, usize),
) -> Result<GemmOut> {
    check_stacked("stacked BF16 DGrad", dy, m, n, k)?;
    check_len("stacked BF16 weights", w, n * k, format!("[{n}][{k}]"))?;
    let d = gpu.uninit::<u16>(m * k)?;
    let (a, b) = (
        dense(gpu, dy, LtType::Bf16, m, n, n),
        dense(gpu, w, LtType::Bf16, n, k, k),
    );
    dense_gemm_to(gpu, (a, false), (b, false), (gpu.ptr(&d), k, LtType::Bf16))?;
    Ok(GemmOut::Bf16(d, k))
}

/// dy `[m][n]` with `m > 0` and `n`, `k` positive multiples of 16.
fn check_stacked(what: &str, dy: &CudaSlice<u16>, m: usize, n: usize, k: usize) -> Result<()> {
    ensure(
        m > 0 && n > 0 && k > 0 && n.is_multiple_of(16) && k.is_multiple_of(16),
        || format!("{what}: [{m}, {n}] x {k}: need rows, and widths multiples of 16"),
    )?;
    check_len(&format!("{what} dy"), dy, m * n, format!("[{m}][{n}]"))
}

/// One projection's BF16 DGrad `dx [m, k] = dy w` with dy its columns
/// `[col, col + n)` of a stacked operand `[m][ld]` (where the stacked weights are
/// not made, `JET_DGRAD_STACK=0`), as the GEMM wrote it (BF16, row stride k).
pub fn linear_dgrad_bf16_part(
    gpu: &Gpu,
    (dy, col, ld): (&CudaSlice<u16>, usize, usize),
    w: &GpuWeight,
    m: usize,
) -> Result<GemmOut> {
    let (n, k) = (w.n, w.k);
    check_stacked("a stacked operand's BF16 DGrad", dy, m, ld, k)?;
    ensure(col + n <= ld && col.is_multiple_of(8), || {
        format!(
            "BF16 DGrad of columns {col}..{} of a stacked dy of {ld}",
            col + n
        )
    })?;
    let wb = w
        .bf16_view()
        .ok_or_else(|| w.missing(crate::GemmPrecision::Bf16))?;
    let d = gpu.uninit::<u16>(m * k)?;
    let (a, b) = (
        dense_at(gpu.ptr(dy) + 2 * col as u64, LtType::Bf16, m, n, ld),
        dense_at(wb.ptr(gpu), LtType::Bf16, n, k, k),
    );
    dense_gemm_to(gpu, (a, false), (b, false), (gpu.ptr(&d), k, LtType::Bf16))?;
    Ok(GemmOut::Bf16(d, k))
}

/// The buffer of a stacked BF16 dy `[m][ld]`, unwritten: its producers write every
/// column (q's and k's norm backward and the attention's backward for q/k/v).
pub fn stacked_dy_bf16(gpu: &Gpu, m: usize, ld: usize) -> Result<CudaSlice<u16>> {
    gpu.uninit::<u16>(m * ld)
}
