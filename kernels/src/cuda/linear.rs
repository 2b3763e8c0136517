//! The linear layer `y [M, N] = x [M, K] w [N, K]^T (+ b)` on the GPU, per
//! [`GemmPrecision`], with the numbers of `ops::linear` (f32 accumulation; in the
//! low-precision modes the output and the gradients are rounded to BF16 values,
//! stored as f32).
//!
//! - F32: cuBLASLt f32 (`CUBLAS_COMPUTE_32F`, no TF32).
//! - BF16: operands rounded to BF16 (padded copies), f32 accumulation; the
//!   forward through the BF16 split-K / rows kernels (`gemv_bf16`, batch-invariant
//!   as the FP8 ones) or, with `batch_invariant` off, cuBLASLt.
//! - FP8: forward X 1x128 x W 128x128 through the split-K decode kernel or its
//!   any-batch twin `gemm_fp8_rows`, which add a row's products in the same order
//!   (batch-invariant: rollout equals training bit for bit; with
//!   `batch_invariant` off, batches over [`GEMV_MAX_TOKENS`] rows use cuBLASLt);
//!   DGrad dY 1x128 x the same W blocks transposed; WGrad dY and X both
//!   128x1 along tokens.
//!
//! GEMMs write a padded f32 `D`; one epilogue pass adds the bias, rounds, and
//! writes the `[rows, cols]` result.

use cudarc::driver::CudaSlice;

use super::context::{Arg, OPS};
use super::gemm::{dense_gemm, fp8_gemm_nt, Dense, LtType};
use super::gemv::{gemm_fp8_rows, gemv_fp8_partial, split_k_pays, GEMV_MAX_TOKENS};
use super::gemv_bf16::{gemm_bf16_rows, gemv_bf16_partial, Bf16Rows};
use super::quantize::{
    quantize_block128, quantize_col128x1, quantize_row1x128, to_bf16_padded, Fp8Quantized,
};
use super::{check_len, ensure, pad16, Ctx, Gpu, Result};
use crate::{Flow, GemmPrecision, GemmRole};

/// A weight `[N, K]` prepared for one step: the copies the flow's GEMM roles read.
/// In the `fp8` flow the 128x128 blocks are quantized once and read by rollout,
/// training forward and (transposed) DGrad alike.
pub struct GpuWeight {
    pub n: usize,
    pub k: usize,
    f32: Option<CudaSlice<f32>>,
    /// BF16 bits `[pad16(N)][pad16(K)]`.
    bf16: Option<CudaSlice<u16>>,
    fp8: Option<Fp8Quantized>,
    /// Blocks of `W^T [K, N]`, when the flow's DGrad is FP8.
    fp8_t: Option<Fp8Quantized>,
    /// FP8 and BF16 forward GEMMs add each row's products in one order whatever
    /// the number of rows (the split-K decode kernels and `gemm_*_rows`), so
    /// rollout and training logprobs agree bit for bit; off, FP8 batches of more
    /// than 64 rows use cuBLASLt's block-scaled GEMM and BF16 forwards cuBLASLt's
    /// BF16 GEMM (faster, an accumulation order that depends on the batch).
    pub batch_invariant: bool,
}

impl GpuWeight {
    /// Prepare the device master weight `w [n, k]` for every GEMM role of `flow`.
    pub fn prepare(
        gpu: &Gpu,
        w: &CudaSlice<f32>,
        n: usize,
        k: usize,
        flow: Flow,
    ) -> Result<GpuWeight> {
        check_len("weight", w, n * k, format!("[{n}, {k}]"))?;
        let mut p = GpuWeight {
            n,
            k,
            f32: None,
            bf16: None,
            fp8: None,
            fp8_t: None,
            batch_invariant: true,
        };
        let roles = [
            GemmRole::RolloutForward,
            GemmRole::TrainForward,
            GemmRole::DGrad,
        ];
        for role in roles {
            match flow.precision(role) {
                GemmPrecision::F32 if p.f32.is_none() => {
                    p.f32 = Some(
                        gpu.stream()
                            .clone_dtod(&w.slice(..n * k))
                            .ctx("copying a weight")?,
                    )
                }
                GemmPrecision::Bf16 if p.bf16.is_none() => {
                    p.bf16 = Some(to_bf16_padded(gpu, w, n, k, pad16(n), pad16(k))?)
                }
                GemmPrecision::Fp8 if p.fp8.is_none() => {
                    let t = flow.precision(GemmRole::DGrad) == GemmPrecision::Fp8;
                    let (q, qt) = quantize_block128(gpu, w, n, k, t)?;
                    p.fp8 = Some(q);
                    p.fp8_t = qt;
                }
                _ => {}
            }
        }
        Ok(p)
    }

    /// [`GpuWeight::prepare`] from a host weight.
    pub fn from_host(gpu: &Gpu, w: &[f32], n: usize, k: usize, flow: Flow) -> Result<GpuWeight> {
        ensure(w.len() == n * k, || {
            format!("weight holds {} values for [{n}, {k}]", w.len())
        })?;
        Self::prepare(gpu, &gpu.upload(w)?, n, k, flow)
    }

    /// The 128x128-block FP8 copy, when the flow has one.
    pub fn fp8(&self) -> Option<&Fp8Quantized> {
        self.fp8.as_ref()
    }

    fn missing(&self, prec: GemmPrecision) -> super::CudaError {
        super::CudaError::Invalid(format!(
            "weight [{}, {}] was not prepared for {prec:?}",
            self.n, self.k
        ))
    }
}

/// `y [rows, cols] = d (row stride ldd) + bias`, rounded to BF16 unless F32; `d`
/// may hold `splits` slices `sstride` apart (split-K), added in order.
#[allow(clippy::too_many_arguments)]
fn epilogue(
    gpu: &Gpu,
    d: &CudaSlice<f32>,
    (ldd, splits, sstride): (usize, usize, usize),
    bias: Option<&CudaSlice<f32>>,
    rows: usize,
    cols: usize,
    prec: GemmPrecision,
) -> Result<CudaSlice<f32>> {
    let y = gpu.uninit::<f32>(rows * cols)?;
    let n = rows * cols;
    gpu.launch(
        &OPS,
        "linear_epilogue",
        (n.div_ceil(256) as u32, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(d)),
            Arg::L(ldd as i64),
            Arg::I(splits as i32),
            Arg::L(sstride as i64),
            Arg::P(bias.map_or(0, |b| gpu.ptr(b))),
            Arg::I(rows as i32),
            Arg::I(cols as i32),
            Arg::I((prec != GemmPrecision::F32) as i32),
            Arg::P(gpu.ptr(&y)),
        ],
    )?;
    Ok(y)
}

fn dense(
    gpu: &Gpu,
    s: &CudaSlice<impl Sized>,
    ty: LtType,
    rows: usize,
    cols: usize,
    ld: usize,
) -> Dense {
    Dense {
        ptr: gpu.ptr(s),
        ty,
        rows,
        cols,
        ld,
    }
}

/// Forward: `x [m, k]` -> `y [m, n]` (rounded to BF16 values unless F32).
pub fn linear_forward(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    m: usize,
    w: &GpuWeight,
    bias: Option<&CudaSlice<f32>>,
    prec: GemmPrecision,
) -> Result<CudaSlice<f32>> {
    let (n, k) = (w.n, w.k);
    check_len("linear input", x, m * k, format!("[{m}, {k}]"))?;
    if let Some(b) = bias {
        check_len("linear bias", b, n, format!("[{n}]"))?;
    }
    if m == 0 {
        return gpu.uninit(0);
    }
    let (np, kp) = (pad16(n), pad16(k));
    let (d, ldd) = match prec {
        GemmPrecision::F32 => {
            let wf = w.f32.as_ref().ok_or_else(|| w.missing(prec))?;
            let d = gpu.uninit::<f32>(m * np)?;
            let (a, b) = (
                dense(gpu, x, LtType::F32, m, k, k),
                dense(gpu, wf, LtType::F32, n, k, k),
            );
            dense_gemm(gpu, a, false, b, true, gpu.ptr(&d), np)?;
            (d, np)
        }
        GemmPrecision::Bf16 => {
            let wb = w.bf16.as_ref().ok_or_else(|| w.missing(prec))?;
            let xb = to_bf16_padded(gpu, x, m, k, m, kp)?;
            if w.batch_invariant {
                let xr = Bf16Rows {
                    v: &xb,
                    rows: m,
                    cols: k,
                    rows_pad: m,
                    cols_pad: kp,
                };
                let wr = Bf16Rows {
                    v: wb,
                    rows: n,
                    cols: k,
                    rows_pad: np,
                    cols_pad: kp,
                };
                if m <= GEMV_MAX_TOKENS || split_k_pays(gpu, m, n) {
                    let p = gemv_bf16_partial(gpu, xr, wr)?;
                    return epilogue(gpu, &p.p, (p.ldp, p.splits, p.sstride), bias, m, n, prec);
                }
                let d = gpu.uninit::<f32>(m * n)?;
                gemm_bf16_rows(gpu, xr, wr, &d, n)?;
                (d, n)
            } else {
                let d = gpu.uninit::<f32>(m * np)?;
                let (a, b) = (
                    dense(gpu, &xb, LtType::Bf16, m, k, kp),
                    dense(gpu, wb, LtType::Bf16, n, k, kp),
                );
                dense_gemm(gpu, a, false, b, true, gpu.ptr(&d), np)?;
                (d, np)
            }
        }
        GemmPrecision::Fp8 => {
            let wq = w.fp8.as_ref().ok_or_else(|| w.missing(prec))?;
            let qx = quantize_row1x128(gpu, x, m, k)?;
            let inv = w.batch_invariant;
            if m <= GEMV_MAX_TOKENS || (inv && split_k_pays(gpu, m, n)) {
                let p = gemv_fp8_partial(gpu, &qx, wq)?;
                return epilogue(gpu, &p.p, (p.ldp, p.splits, p.sstride), bias, m, n, prec);
            }
            if inv {
                let d = gpu.uninit::<f32>(m * n)?;
                gemm_fp8_rows(gpu, &qx, wq, &d, n)?;
                (d, n)
            } else {
                fp8_gemm_nt(gpu, &qx, wq)?
            }
        }
    };
    epilogue(gpu, &d, (ldd, 1, 0), bias, m, n, prec)
}

/// Gradients of a linear layer, on the device.
pub struct GpuLinearGrads {
    /// `[m, k]`
    pub dx: CudaSlice<f32>,
    /// `[n, k]`
    pub dw: CudaSlice<f32>,
    /// `[n]`, when the layer has a bias.
    pub db: Option<CudaSlice<f32>>,
}

/// Backward: from `dy [m, n]` and the forward input `x [m, k]`.
#[allow(clippy::too_many_arguments)]
pub fn linear_backward(
    gpu: &Gpu,
    dy: &CudaSlice<f32>,
    x: &CudaSlice<f32>,
    m: usize,
    w: &GpuWeight,
    has_bias: bool,
    dgrad: GemmPrecision,
    wgrad: GemmPrecision,
) -> Result<GpuLinearGrads> {
    let (n, k) = (w.n, w.k);
    check_len("linear dy", dy, m * n, format!("[{m}, {n}]"))?;
    check_len("linear input", x, m * k, format!("[{m}, {k}]"))?;
    ensure(m > 0, || "linear backward of 0 rows".into())?;
    let (np, kp, mp) = (pad16(n), pad16(k), pad16(m));
    // DGrad: dx [m, k] = dy [m, n] w [n, k]
    let (d, ldd) = match dgrad {
        GemmPrecision::F32 => {
            let wf = w.f32.as_ref().ok_or_else(|| w.missing(dgrad))?;
            let d = gpu.uninit::<f32>(m * kp)?;
            let (a, b) = (
                dense(gpu, dy, LtType::F32, m, n, n),
                dense(gpu, wf, LtType::F32, n, k, k),
            );
            dense_gemm(gpu, a, false, b, false, gpu.ptr(&d), kp)?;
            (d, kp)
        }
        GemmPrecision::Bf16 => {
            let wb = w.bf16.as_ref().ok_or_else(|| w.missing(dgrad))?;
            let dyb = to_bf16_padded(gpu, dy, m, n, m, np)?;
            let d = gpu.uninit::<f32>(m * kp)?;
            let (a, b) = (
                dense(gpu, &dyb, LtType::Bf16, m, n, np),
                dense(gpu, wb, LtType::Bf16, n, k, kp),
            );
            dense_gemm(gpu, a, false, b, false, gpu.ptr(&d), kp)?;
            (d, kp)
        }
        GemmPrecision::Fp8 => {
            let wt = w.fp8_t.as_ref().ok_or_else(|| w.missing(dgrad))?;
            let qdy = quantize_row1x128(gpu, dy, m, n)?;
            fp8_gemm_nt(gpu, &qdy, wt)?
        }
    };
    let dx = epilogue(gpu, &d, (ldd, 1, 0), None, m, k, dgrad)?;
    // WGrad: dw [n, k] = dy [m, n]^T x [m, k]
    let (d, ldd) = match wgrad {
        GemmPrecision::F32 => {
            let d = gpu.uninit::<f32>(n * kp)?;
            let (a, b) = (
                dense(gpu, dy, LtType::F32, m, n, n),
                dense(gpu, x, LtType::F32, m, k, k),
            );
            dense_gemm(gpu, a, true, b, false, gpu.ptr(&d), kp)?;
            (d, kp)
        }
        GemmPrecision::Bf16 => {
            let dyb = to_bf16_padded(gpu, dy, m, n, m, np)?;
            let xb = to_bf16_padded(gpu, x, m, k, m, kp)?;
            let d = gpu.uninit::<f32>(n * kp)?;
            let (a, b) = (
                dense(gpu, &dyb, LtType::Bf16, m, n, np),
                dense(gpu, &xb, LtType::Bf16, m, k, kp),
            );
            dense_gemm(gpu, a, true, b, false, gpu.ptr(&d), kp)?;
            (d, kp)
        }
        GemmPrecision::Fp8 => {
            let qdy = quantize_col128x1(gpu, dy, m, n)?;
            let qx = quantize_col128x1(gpu, x, m, k)?;
            debug_assert_eq!(qdy.rows_pad, mp);
            fp8_gemm_nt(gpu, &qdy, &qx)?
        }
    };
    let dw = epilogue(gpu, &d, (ldd, 1, 0), None, n, k, wgrad)?;
    let db = if has_bias {
        Some(super::ops::column_sums(
            gpu,
            dy,
            m,
            n,
            wgrad != GemmPrecision::F32,
        )?)
    } else {
        None
    };
    Ok(GpuLinearGrads { dx, dw, db })
}
