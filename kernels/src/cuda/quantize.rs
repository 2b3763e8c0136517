//! E4M3 quantization on the GPU, bit-exact with [`Fp8Matrix::quantize`]
//! (same codes, same scales), written in the layouts cuBLASLt reads.
//!
//! Every quantized operand is "K-contiguous": `[outer, inner]` with the contraction
//! dimension inner and contiguous, which is what the TN-only FP8 GEMM wants.
//!
//! | grouping | source `x [rows, cols]` | codes | scales |
//! | --- | --- | --- | --- |
//! | Row1x128 (activations, dY in DGrad) | outer rows, K = cols | `[rows_pad][cols_pad]` | VEC128 `[ceil(cols/128)][rows_pad]` (outer index contiguous) |
//! | Col128x1 (both WGrad operands) | outer cols, K = rows (tokens) | transposed, `[cols_pad][rows_pad]` | VEC128 `[ceil(rows/128)][cols_pad]` (= the CPU layout) |
//! | Block128 (weights) | outer rows, K = cols | `[rows_pad][cols_pad]` | BLK128x128 `[ceil(rows/128)][lds]`, `lds = roundup(ceil(cols/128), 4)` |
//!
//! `*_pad` = [`pad16`]: E4M3 rows must be 16-byte aligned, and the block-scaled
//! GEMM wants M and N multiples of 4. Padding codes are 0 (a padded row has scale
//! 1, the all-zero rule), so padding adds nothing to any product. The BLK scale
//! stride is padded to 4 because cuBLASLt reads it so (unpadded scales silently
//! give wrong results when ceil(K/128) % 4 != 0, e.g. K = 896).

use cudarc::driver::CudaSlice;

use super::act::ActRef;
use super::context::{Arg, QUANTIZE};
use super::ops::SwigluDh;
use super::part::Bf16View;
use super::{check_len, ensure, pad16, Gpu, Result};
use crate::fp8::{decode, scale_shape, Fp8Matrix, Grouping, GROUP};

/// A quantized matrix on the device (see the module table for the layouts).
pub struct Fp8Quantized {
    pub grouping: Grouping,
    /// Shape of the source matrix `[rows, cols]`.
    pub rows: usize,
    pub cols: usize,
    pub rows_pad: usize,
    pub cols_pad: usize,
    pub codes: CudaSlice<u8>,
    pub scales: CudaSlice<f32>,
    /// Row stride of the BLK128x128 scales (Block128 only; 0 otherwise).
    pub lds: usize,
}

impl Fp8Quantized {
    /// Rows of the K-contiguous operand: rows, or cols for Col128x1.
    pub fn outer(&self) -> usize {
        match self.grouping {
            Grouping::Col128x1 => self.cols,
            _ => self.rows,
        }
    }
    pub fn outer_pad(&self) -> usize {
        match self.grouping {
            Grouping::Col128x1 => self.cols_pad,
            _ => self.rows_pad,
        }
    }
    /// The contraction length K (padded: the codes' row stride).
    pub fn inner(&self) -> usize {
        match self.grouping {
            Grouping::Col128x1 => self.rows,
            _ => self.cols,
        }
    }
    pub fn inner_pad(&self) -> usize {
        match self.grouping {
            Grouping::Col128x1 => self.rows_pad,
            _ => self.cols_pad,
        }
    }

    /// Back to the CPU reference's [`Fp8Matrix`] (unpadded codes, CPU scale layout).
    pub fn to_host(&self, gpu: &Gpu) -> Result<Fp8Matrix> {
        let (r, c) = (self.rows, self.cols);
        let codes_p = gpu.download(&self.codes)?;
        let scales_p = gpu.download(&self.scales)?;
        let mut codes = vec![0u8; r * c];
        for i in 0..r {
            for j in 0..c {
                codes[i * c + j] = match self.grouping {
                    Grouping::Col128x1 => codes_p[j * self.rows_pad + i],
                    _ => codes_p[i * self.cols_pad + j],
                };
            }
        }
        let (sr, sc) = scale_shape(r, c, self.grouping);
        let mut scales = vec![0f32; sr * sc];
        for a in 0..sr {
            for b in 0..sc {
                scales[a * sc + b] = match self.grouping {
                    // VEC128 [L][rows_pad] -> CPU [rows][L]
                    Grouping::Row1x128 => scales_p[b * self.rows_pad + a],
                    Grouping::Col128x1 => scales_p[a * self.cols_pad + b],
                    Grouping::Block128 => scales_p[a * self.lds + b],
                };
            }
        }
        Ok(Fp8Matrix {
            rows: r,
            cols: c,
            grouping: self.grouping,
            values: codes.iter().map(|&q| decode(q)).collect(),
            codes,
            scales,
        })
    }
}

fn check_shape(what: &str, x: &CudaSlice<f32>, rows: usize, cols: usize) -> Result<()> {
    check_len(what, x, rows * cols, format!("[{rows}, {cols}]"))?;
    check_dims(what, rows, cols)
}

/// `[rows, cols]` within what the kernels index with 32-bit ints (padded too).
fn check_dims(what: &str, rows: usize, cols: usize) -> Result<()> {
    ensure(
        rows < i32::MAX as usize / 2 && cols < i32::MAX as usize / 2,
        || format!("{what}: [{rows}, {cols}] is too large"),
    )
}

/// 1x128 groups along the columns (K): activations `x [rows, cols]` for the
/// forward, `dY [tokens, N]` for DGrad.
pub fn quantize_row1x128(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    rows: usize,
    cols: usize,
) -> Result<Fp8Quantized> {
    check_shape("quantize 1x128 input", x, rows, cols)?;
    row1x128(gpu, gpu.ptr(x), "quant_row1x128_f32", rows, cols)
}

/// [`quantize_row1x128`] with the software E4M3 encoder instead of the hardware
/// conversion: the same bits (the parity tests check both).
#[doc(hidden)]
pub fn quantize_row1x128_sw(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    rows: usize,
    cols: usize,
) -> Result<Fp8Quantized> {
    check_shape("quantize 1x128 input", x, rows, cols)?;
    row1x128(gpu, gpu.ptr(x), "quant_row1x128_f32_sw", rows, cols)
}

/// [`quantize_row1x128`] of a BF16 matrix (raw `u16` bits).
pub fn quantize_row1x128_bf16(
    gpu: &Gpu,
    x: &CudaSlice<u16>,
    rows: usize,
    cols: usize,
) -> Result<Fp8Quantized> {
    check_len(
        "quantize 1x128 input",
        x,
        rows * cols,
        format!("[{rows}, {cols}]"),
    )?;
    row1x128(gpu, gpu.ptr(x), "quant_row1x128_bf16", rows, cols)
}

fn row1x128(
    gpu: &Gpu,
    x: u64,
    kernel: &'static str,
    rows: usize,
    cols: usize,
) -> Result<Fp8Quantized> {
    let q = unwritten_row1x128(gpu, rows, cols)?;
    let (rp, cp, l) = (q.rows_pad, q.cols_pad, cols.div_ceil(GROUP));
    // Each warp takes 4 (row, group) pairs (GPW in quantize.cu), 8 warps a block.
    let warps = (rp * l).div_ceil(4);
    gpu.launch(
        &QUANTIZE,
        kernel,
        (warps.div_ceil(8) as u32, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::P(x),
            Arg::L(cols as i64),
            Arg::I(rows as i32),
            Arg::I(cols as i32),
            Arg::I(rp as i32),
            Arg::I(cp as i32),
            Arg::P(gpu.ptr(&q.codes)),
            Arg::P(gpu.ptr(&q.scales)),
        ],
    )?;
    Ok(q)
}

/// The GEMM operand a fused producer ([`rmsnorm_operand`], [`swiglu_operand`])
/// writes beside its f32 output.
pub enum FusedOperand {
    /// 1x128 E4M3 groups, as [`quantize_row1x128`] of the output.
    Fp8(Fp8Quantized),
    /// BF16 copy `[rows][pad16(cols)]`, as [`to_bf16_padded`] of the output.
    Bf16(CudaSlice<u16>),
}

impl FusedOperand {
    /// An unwritten operand of `[rows, cols]`.
    pub(crate) fn alloc(gpu: &Gpu, rows: usize, cols: usize, fp8: bool) -> Result<FusedOperand> {
        Ok(match fp8 {
            true => FusedOperand::Fp8(unwritten_row1x128(gpu, rows, cols)?),
            false => FusedOperand::Bf16(gpu.uninit::<u16>(rows * pad16(cols))?),
        })
    }

    /// The kernel arguments after the output: rows_pad, cols_pad, codes, scales,
    /// BF16 copy (the absent ones null).
    pub(crate) fn args(&self, gpu: &Gpu, rows: usize, cols: usize) -> [Arg; 5] {
        let (codes, scales, yb) = match self {
            FusedOperand::Fp8(q) => (gpu.ptr(&q.codes), gpu.ptr(&q.scales), 0),
            FusedOperand::Bf16(b) => (0, 0, gpu.ptr(b)),
        };
        [
            Arg::I(self.rows_pad(rows) as i32),
            Arg::I(pad16(cols) as i32),
            Arg::P(codes),
            Arg::P(scales),
            Arg::P(yb),
        ]
    }

    pub(crate) fn rows_pad(&self, rows: usize) -> usize {
        match self {
            FusedOperand::Fp8(q) => q.rows_pad,
            FusedOperand::Bf16(_) => rows,
        }
    }
}

/// Widest row [`rmsnorm_operand`] takes (32 warps of 8 groups of 128).
pub const NORM_OPERAND_MAX_DIM: usize = 32 * 8 * GROUP;

/// RMSNorm of `x [rows, dim]` with weight `w [dim]` fused with the operand of its
/// output that the next GEMM reads (`fp8`: 1x128 groups, else the BF16 copy):
/// `(y [rows, dim], rstd [rows], operand)`. The output's bits are those of this
/// kernel's own sum order (not `ops::rmsnorm_forward`'s); the operand's are those
/// of the quantizer or the BF16 copy of that output. Rows of at most eight groups
/// (dim <= 1,024) run a warp a row (`rmsnorm_operand_rows`), repeating the
/// block-a-row launch's sums: the same bits as it and as the decode step's
/// `rmsnorm_sk_operand` (`cuda_invariant`).
pub fn rmsnorm_operand(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    shape: (usize, usize),
    eps: f64,
    fp8: bool,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>, FusedOperand)> {
    match rmsnorm_operand_opt(gpu, x, w, shape, eps, fp8, true)? {
        (Some(y), rstd, op) => Ok((y, rstd, op)),
        (None, ..) => Err(super::CudaError::Invalid(
            "rmsnorm with operand: the output was asked for".into(),
        )),
    }
}

/// Whether the norm with its operand runs a warp a row where its rows allow it
/// (`rmsnorm_operand_rows`; the same bits as a block a row): on unless
/// `JET_NORM_WARP_ROWS=0` (read once), for measuring what it saves.
fn norm_warp_rows() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::cuda::switch_on("JET_NORM_WARP_ROWS"))
}

/// [`rmsnorm_operand`], the f32 output written only when `keep_y` (the operand
/// and rstd always).
#[allow(clippy::type_complexity)]
pub fn rmsnorm_operand_opt(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    shape: (usize, usize),
    eps: f64,
    fp8: bool,
    keep_y: bool,
) -> Result<(Option<CudaSlice<f32>>, CudaSlice<f32>, FusedOperand)> {
    norm_operand(gpu, (x, w), shape, eps, fp8, keep_y, norm_warp_rows())
}

/// [`rmsnorm_operand`] by a block a row whatever the width (the check that the
/// warp-a-row kernel gives the same bits).
#[doc(hidden)]
pub fn rmsnorm_operand_block_rows(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    shape: (usize, usize),
    eps: f64,
    fp8: bool,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>, FusedOperand)> {
    match norm_operand(gpu, (x, w), shape, eps, fp8, true, false)? {
        (Some(y), rstd, op) => Ok((y, rstd, op)),
        (None, ..) => unreachable!("the output is kept"),
    }
}

/// The two above: a warp a row where `warp` and the rows allow it.
#[allow(clippy::type_complexity)]
fn norm_operand(
    gpu: &Gpu,
    (x, w): (&CudaSlice<f32>, &CudaSlice<f32>),
    (rows, dim): (usize, usize),
    eps: f64,
    fp8: bool,
    keep_y: bool,
    warp: bool,
) -> Result<(Option<CudaSlice<f32>>, CudaSlice<f32>, FusedOperand)> {
    check_shape("rmsnorm x", x, rows, dim)?;
    check_len("rmsnorm w", w, dim, format!("[{dim}]"))?;
    ensure(dim > 0 && dim <= NORM_OPERAND_MAX_DIM, || {
        format!("rmsnorm with operand: dim {dim} (must be 1 ..= {NORM_OPERAND_MAX_DIM})")
    })?;
    let y = keep_y.then(|| gpu.uninit::<f32>(rows * dim)).transpose()?;
    let rstd = gpu.uninit::<f32>(rows)?;
    let op = FusedOperand::alloc(gpu, rows, dim, fp8)?;
    let rp = op.rows_pad(rows);
    // Rows of at most eight groups: a warp a row, eight a block (the same bits).
    let groups = dim.div_ceil(GROUP);
    let (name, grid, threads) = match groups <= 8 && warp {
        true => ("rmsnorm_operand_rows", rp.div_ceil(8), 256),
        false => ("rmsnorm_operand", rp, 32 * groups.min(32)),
    };
    if rp > 0 {
        gpu.launch(
            &QUANTIZE,
            name,
            (grid as u32, 1, 1),
            (threads as u32, 1, 1),
            0,
            &[
                &[
                    Arg::P(gpu.ptr(x)),
                    Arg::P(gpu.ptr(w)),
                    Arg::I(rows as i32),
                    Arg::I(dim as i32),
                    Arg::F(eps as f32),
                    Arg::P(y.as_ref().map_or(0, |y| gpu.ptr(y))),
                    Arg::P(gpu.ptr(&rstd)),
                ][..],
                &op.args(gpu, rows, dim),
            ]
            .concat(),
        )?;
    }
    Ok((y, rstd, op))
}

/// SwiGLU `h = g * sigmoid(g) * u` of `gate`, `up [rows, cols]` (as
/// `ops::swiglu_forward`, bit for bit) fused with the operand of `h` that the
/// down projection reads: `(h [rows, cols], operand)`.
/// gate and up are f32 or both the BF16 values a rows GEMM stored
/// ([`super::act::Act`]): the same numbers, so the same bits.
pub fn swiglu_operand<'a>(
    gpu: &Gpu,
    gate: impl Into<ActRef<'a>>,
    up: impl Into<ActRef<'a>>,
    shape: (usize, usize),
    fp8: bool,
) -> Result<(CudaSlice<f32>, FusedOperand)> {
    match swiglu_operand_opt(gpu, gate, up, shape, fp8, true)? {
        (Some(h), op) => Ok((h, op)),
        (None, _) => Err(super::CudaError::Invalid(
            "swiglu with operand: the output was asked for".into(),
        )),
    }
}

/// [`swiglu_operand`], `h` written only when `keep_h` (the operand always).
pub fn swiglu_operand_opt<'a>(
    gpu: &Gpu,
    gate: impl Into<ActRef<'a>>,
    up: impl Into<ActRef<'a>>,
    (rows, cols): (usize, usize),
    fp8: bool,
    keep_h: bool,
) -> Result<(Option<CudaSlice<f32>>, FusedOperand)> {
    check_dims("swiglu", rows, cols)?;
    let (gate, up, bf16) = gu_args(gpu, gate.into(), up.into(), (rows, cols))?;
    let h = keep_h.then(|| gpu.uninit::<f32>(rows * cols)).transpose()?;
    let op = FusedOperand::alloc(gpu, rows, cols, fp8)?;
    // One warp per (row, group), 8 warps a block.
    let warps = op.rows_pad(rows) * cols.div_ceil(GROUP);
    if warps > 0 {
        gpu.launch(
            &QUANTIZE,
            match bf16 {
                true => "swiglu_operand_gu16",
                false => "swiglu_operand",
            },
            (warps.div_ceil(8) as u32, 1, 1),
            (256, 1, 1),
            0,
            &[
                &[
                    gate,
                    up,
                    Arg::I(rows as i32),
                    Arg::I(cols as i32),
                    Arg::P(h.as_ref().map_or(0, |h| gpu.ptr(h))),
                ][..],
                &op.args(gpu, rows, cols),
            ]
            .concat(),
        )?;
    }
    Ok((h, op))
}

/// SwiGLU of `gate`, `up [rows, cols]` with both FP8 groupings of `h` in one pass
/// (`swiglu_dual`): the 1x128 operand (the down projection's forward, the bits of
/// [`swiglu_operand`]'s) and the 128x1 one (its FP8 WGrad, the bits of
/// [`quantize_col128x1`] of that `h`); `h` itself is not written.
pub fn swiglu_dual<'a>(
    gpu: &Gpu,
    gate: impl Into<ActRef<'a>>,
    up: impl Into<ActRef<'a>>,
    (rows, cols): (usize, usize),
) -> Result<DualFp8> {
    let (gate, up, bf16) = gu_args(gpu, gate.into(), up.into(), (rows, cols))?;
    check_dims("swiglu (FP8, both groupings)", rows, cols)?;
    let cp = pad16(cols);
    let q = unwritten_dual(gpu, rows, cols)?;
    if rows > 0 && cols > 0 {
        gpu.launch(
            &QUANTIZE,
            match bf16 {
                true => "swiglu_dual_gu16",
                false => "swiglu_dual",
            },
            (cp.div_ceil(GROUP) as u32, rows.div_ceil(GROUP) as u32, 1),
            (512, 1, 1),
            0,
            &[&gu_dims((gate, up), (rows, cols))[..], &q.args(gpu)].concat(),
        )?;
    }
    Ok(q)
}

/// The arguments the SwiGLU kernels with FP8 outputs share: gate, up, rows, cols,
/// rows_pad, cols_pad.
fn gu_dims((gate, up): (Arg, Arg), (rows, cols): (usize, usize)) -> [Arg; 6] {
    [
        gate,
        up,
        Arg::I(rows as i32),
        Arg::I(cols as i32),
        Arg::I(pad16(rows) as i32),
        Arg::I(pad16(cols) as i32),
    ]
}

/// SwiGLU's gate and up `[rows, cols]`, checked, as kernel arguments, and whether
/// they are BF16 (both must have the same form).
pub(crate) fn gu_args(
    gpu: &Gpu,
    gate: ActRef,
    up: ActRef,
    (rows, cols): (usize, usize),
) -> Result<(Arg, Arg, bool)> {
    ensure(gate.is_bf16() == up.is_bf16(), || {
        "swiglu: gate and up must both be f32 or both BF16".into()
    })?;
    let shape = format!("[{rows}, {cols}]");
    Ok((
        gate.arg(gpu, "swiglu gate", rows * cols, &shape)?,
        up.arg(gpu, "swiglu up", rows * cols, &shape)?,
        gate.is_bf16(),
    ))
}

/// 128x1 groups along the rows (tokens), stored transposed: the WGrad operands
/// `dY [tokens, N]` and `X [tokens, K]` as `[N_pad][tokens_pad]`, `[K_pad][tokens_pad]`.
pub fn quantize_col128x1(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    rows: usize,
    cols: usize,
) -> Result<Fp8Quantized> {
    check_shape("quantize 128x1 input", x, rows, cols)?;
    tiles(gpu, x, rows, cols, None)
}

/// [`quantize_row1x128`] and [`quantize_col128x1`] of one matrix in one pass (the
/// same bits): dY, read by DGrad in 1x128 groups and by WGrad in 128x1.
pub fn quantize_dual(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    rows: usize,
    cols: usize,
) -> Result<(Fp8Quantized, Fp8Quantized)> {
    check_shape("quantize 1x128 + 128x1 input", x, rows, cols)?;
    let row = unwritten_row1x128(gpu, rows, cols)?;
    let col = tiles(
        gpu,
        x,
        rows,
        cols,
        Some((gpu.ptr(&row.codes), gpu.ptr(&row.scales))),
    )?;
    Ok((row, col))
}

/// A gradient's two FP8 operands: 1x128 groups (DGrad's dY) and 128x1 (WGrad's).
pub struct DualFp8 {
    pub row: Fp8Quantized,
    pub col: Fp8Quantized,
}

impl DualFp8 {
    /// The kernel arguments of its buffers, as `quant_dual_f32` takes them: codes,
    /// scales (1x128), codes^T, scales^T (128x1).
    pub(crate) fn args(&self, gpu: &Gpu) -> [Arg; 4] {
        [
            Arg::P(gpu.ptr(&self.row.codes)),
            Arg::P(gpu.ptr(&self.row.scales)),
            Arg::P(gpu.ptr(&self.col.codes)),
            Arg::P(gpu.ptr(&self.col.scales)),
        ]
    }
}

/// The dynamic shared memory of `swiglu_bwd_fp8` (quantize.cu's `SwigluBwdFp8Smem`):
/// dual_tile's `DualShared` (column maxima 8,192 bytes, column scales, reciprocals
/// and flags 1,536, codes^T 16,896) and dup parked as BF16, 8 x 512 x 8 bytes.
const SWIGLU_BWD_FP8_SMEM: u32 = 8192 + 1536 + 16896 + 8 * 512 * 8;

/// SwiGLU's backward (`ops::swiglu_backward`, rounded to BF16 values) with
/// [`quantize_dual`] of each output, in one pass (`swiglu_bwd_fp8`): the gate and
/// up projections' dy operands `(dgate, dup)` for FP8 DGrad and WGrad, with the
/// bits of quantizing the f32 gradients; no f32 gradient written.
pub fn swiglu_backward_fp8<'a>(
    gpu: &Gpu,
    dh: SwigluDh,
    gate: impl Into<ActRef<'a>>,
    up: impl Into<ActRef<'a>>,
    (rows, cols): (usize, usize),
) -> Result<(DualFp8, DualFp8)> {
    let (g, u) = (
        unwritten_dual(gpu, rows, cols)?,
        unwritten_dual(gpu, rows, cols)?,
    );
    let (gc, uc) = (ColDest::own(gpu, &g.col), ColDest::own(gpu, &u.col));
    swiglu_fp8_launch(
        gpu,
        dh,
        (gate.into(), up.into()),
        (rows, cols),
        [
            (RowDest::own(gpu, &g.row), gc),
            (RowDest::own(gpu, &u.row), uc),
        ],
    )?;
    Ok((g, u))
}

/// [`swiglu_backward_fp8`] with the two 128x1 operands side by side in one
/// `[rows, 2 cols]` operand (gate's columns, then up's): the stacked dy of one
/// WGrad GEMM for both projections ([`super::linear::wgrad_fp8_stacked`]); with
/// `stack_rows` the 1x128 operands too (one DGrad GEMM,
/// [`super::linear::linear_dgrad_fp8_stacked`]). The same tiles, so the same codes
/// and scales. Returns the 1x128 operands and the stacked 128x1 one; `cols` must be
/// a multiple of 16 (of 128 with `stack_rows`: whole groups).
pub fn swiglu_backward_fp8_stacked<'a>(
    gpu: &Gpu,
    dh: SwigluDh,
    gate: impl Into<ActRef<'a>>,
    up: impl Into<ActRef<'a>>,
    (rows, cols): (usize, usize),
    stack_rows: bool,
) -> Result<(DualRows, Fp8Quantized)> {
    let col = unwritten_col128x1(gpu, rows, 2 * cols)?;
    let (gc, uc) = (
        ColDest::slice(gpu, &col, rows, 0, cols)?,
        ColDest::slice(gpu, &col, rows, cols, cols)?,
    );
    let out = DualRows::new(gpu, rows, &[cols, cols], stack_rows)?;
    let dests = [(out.dest(gpu, 0)?, gc), (out.dest(gpu, 1)?, uc)];
    swiglu_fp8_launch(gpu, dh, (gate.into(), up.into()), (rows, cols), dests)?;
    Ok((out.rows, col))
}

/// The 1x128 operands a stacked dual quantizer writes: one a matrix, or one
/// `[rows, sum of cols]` operand of all of them side by side (the stacked dy of one
/// DGrad GEMM).
pub enum DualRows {
    Each(Vec<Fp8Quantized>),
    Stacked(Fp8Quantized),
}

/// [`DualRows`] being made: the operands, each matrix's first column and width,
/// and the rows.
struct RowsOut {
    rows: DualRows,
    c0: Vec<(usize, usize)>,
    m: usize,
}

impl DualRows {
    /// Unwritten 1x128 operands of matrices `[m, cols_i]`, stacked or one each.
    #[allow(clippy::new_ret_no_self)]
    fn new(gpu: &Gpu, m: usize, cols: &[usize], stacked: bool) -> Result<RowsOut> {
        let mut c0 = Vec::with_capacity(cols.len());
        let mut at = 0;
        for &c in cols {
            c0.push((at, c));
            at += c;
        }
        let rows = match stacked {
            true => DualRows::Stacked(unwritten_row1x128(gpu, m, at)?),
            false => DualRows::Each(
                cols.iter()
                    .map(|&c| unwritten_row1x128(gpu, m, c))
                    .collect::<Result<_>>()?,
            ),
        };
        Ok(RowsOut { rows, c0, m })
    }
}

impl RowsOut {
    /// Matrix i's 1x128 destination.
    fn dest(&self, gpu: &Gpu, i: usize) -> Result<RowDest> {
        let (c0, cols) = self.c0[i];
        match &self.rows {
            DualRows::Each(v) => Ok(RowDest::own(gpu, &v[i])),
            DualRows::Stacked(st) => RowDest::slice(gpu, st, self.m, c0, cols),
        }
    }
}

/// Where a dual quantizer writes a `[rows, cols]` matrix's 1x128 operand: buffers of
/// its own, or columns `[c0, c0 + cols)` of a wider `[rows, n]` one (codes from
/// column c0 at the wider row stride, scales from group c0 / 128 on).
#[derive(Clone, Copy)]
struct RowDest {
    codes: u64,
    scales: u64,
    ldc: i64,
}

impl RowDest {
    fn own(gpu: &Gpu, q: &Fp8Quantized) -> RowDest {
        RowDest {
            codes: gpu.ptr(&q.codes),
            scales: gpu.ptr(&q.scales),
            ldc: q.cols_pad as i64,
        }
    }

    /// Columns `[c0, c0 + cols)` of the stacked 1x128 operand `st`: whole groups
    /// (`c0` and `cols` multiples of 128).
    fn slice(gpu: &Gpu, st: &Fp8Quantized, rows: usize, c0: usize, cols: usize) -> Result<RowDest> {
        ensure(
            st.grouping == Grouping::Row1x128
                && st.rows == rows
                && c0.is_multiple_of(GROUP)
                && cols.is_multiple_of(GROUP)
                && c0 + cols <= st.cols,
            || {
                format!(
                    "a 1x128 operand's columns [{c0}, {}) of [{rows} rows]: not whole groups of the stacked [{}, {}]",
                    c0 + cols,
                    st.rows,
                    st.cols
                )
            },
        )?;
        Ok(RowDest {
            codes: gpu.ptr(&st.codes) + c0 as u64,
            scales: gpu.ptr(&st.scales) + 4 * ((c0 / GROUP) * st.rows_pad) as u64,
            ldc: st.cols_pad as i64,
        })
    }
}

/// `swiglu_bwd_fp8*` of `[rows, cols]` into gate's and up's 1x128 operands and
/// their 128x1 destinations (one scales' stride for both).
fn swiglu_fp8_launch(
    gpu: &Gpu,
    dh: SwigluDh,
    (gate, up): (ActRef, ActRef),
    (rows, cols): (usize, usize),
    [(gr, gc), (ur, uc)]: [(RowDest, ColDest); 2],
) -> Result<()> {
    let (gate, up, gu16) = gu_args(gpu, gate, up, (rows, cols))?;
    let (head, dh16) = dh.args(gpu, rows, cols)?;
    ensure(dh16 || !gu16, || {
        "swiglu backward (FP8): BF16 gate and up need the BF16 dh".into()
    })?;
    ensure(rows > 0 && cols > 0, || {
        format!("swiglu backward (FP8) of [{rows}, {cols}]: empty")
    })?;
    let (rp, cp) = (pad16(rows), pad16(cols));
    ensure(
        rp.checked_mul(cp).is_some_and(|e| e < i64::MAX as usize) && cp < i32::MAX as usize,
        || format!("swiglu backward (FP8) of [{rows}, {cols}]: too large"),
    )?;
    ensure(gc.ldst == uc.ldst && gr.ldc == ur.ldc, || {
        "swiglu backward (FP8): gate's and up's operands need one row stride each".into()
    })?;
    let row = |q: RowDest| [Arg::P(q.codes), Arg::P(q.scales)];
    gpu.launch(
        &QUANTIZE,
        match (dh16, gu16) {
            (true, true) => "swiglu_bwd_fp8_dh16_gu16",
            (true, false) => "swiglu_bwd_fp8_dh16",
            (false, _) => "swiglu_bwd_fp8",
        },
        (cp.div_ceil(GROUP) as u32, rows.div_ceil(GROUP) as u32, 1),
        (512, 1, 1),
        SWIGLU_BWD_FP8_SMEM,
        &[
            &head[..],
            &gu_dims((gate, up), (rows, cols)),
            &row(gr),
            &gc.args(),
            &row(ur),
            &uc.args(),
            &[Arg::L(gc.ldst), Arg::L(gr.ldc)],
        ]
        .concat(),
    )
}

/// Where a dual quantizer writes a `[rows, cols]` matrix's 128x1 operand: buffers of
/// its own, or columns `[c0, c0 + cols)` of a wider `[rows, n]` operand (a stacked
/// WGrad dy): its codes^T rows from c0 on, its scales^T columns from c0 on, at the
/// wider operand's row stride.
#[derive(Clone, Copy)]
struct ColDest {
    codes_t: u64,
    scales_t: u64,
    ldst: i64,
}

impl ColDest {
    /// The operand's own buffers.
    fn own(gpu: &Gpu, q: &Fp8Quantized) -> ColDest {
        ColDest {
            codes_t: gpu.ptr(&q.codes),
            scales_t: gpu.ptr(&q.scales),
            ldst: q.cols_pad as i64,
        }
    }

    /// Columns `[c0, c0 + cols)` of the stacked 128x1 operand `st` of `rows` rows;
    /// `c0` and `cols` multiples of 16, so no slice has padding columns.
    fn slice(gpu: &Gpu, st: &Fp8Quantized, rows: usize, c0: usize, cols: usize) -> Result<ColDest> {
        ensure(
            st.grouping == Grouping::Col128x1
                && st.rows == rows
                && c0.is_multiple_of(16)
                && cols.is_multiple_of(16)
                && c0 + cols <= st.cols,
            || {
                format!(
                    "a 128x1 operand's columns [{c0}, {}) of [{rows} rows]: not a 16-aligned slice of the stacked [{}, {}]",
                    c0 + cols,
                    st.rows,
                    st.cols
                )
            },
        )?;
        Ok(ColDest {
            codes_t: gpu.ptr(&st.codes) + (c0 * st.rows_pad) as u64,
            scales_t: gpu.ptr(&st.scales) + (c0 * 4) as u64,
            ldst: st.cols_pad as i64,
        })
    }

    /// codes^T and scales^T as kernel arguments.
    fn args(&self) -> [Arg; 2] {
        [Arg::P(self.codes_t), Arg::P(self.scales_t)]
    }
}

/// The values [`quantize_dual_multi`] quantizes, `[rows, cols]`.
#[derive(Clone, Copy)]
pub enum DualIn<'a> {
    /// Stored as f32 or as BF16 values (a gradient its producer rounded to BF16 and
    /// stored so: the codes of its f32 copy, from half the bytes), rows `cols`
    /// values apart (not a padded `[rows][pad16(cols)]` operand).
    Values(ActRef<'a>),
    /// [`rmsnorm_operand`]'s output `y = w * (x * rstd)` of `x [rows, cols]`, its
    /// weight `w [cols]` and the `rstd [rows]` it returned: y's bits, made again
    /// from what a backward keeps anyway, so the forward need not write y.
    Norm {
        x: &'a CudaSlice<f32>,
        w: &'a CudaSlice<f32>,
        rstd: &'a CudaSlice<f32>,
    },
}

impl<'a> From<&'a CudaSlice<f32>> for DualIn<'a> {
    fn from(x: &'a CudaSlice<f32>) -> Self {
        DualIn::Values(ActRef::F32(x))
    }
}

impl<'a> From<&'a CudaSlice<u16>> for DualIn<'a> {
    fn from(x: &'a CudaSlice<u16>) -> Self {
        DualIn::Values(ActRef::Bf16(x))
    }
}

impl<'a> From<ActRef<'a>> for DualIn<'a> {
    fn from(x: ActRef<'a>) -> Self {
        DualIn::Values(x)
    }
}

/// The forms of `quant_dual_multi`'s inputs (quantize.cu's DUAL_F32, DUAL_BF16,
/// DUAL_NORM).
const DUAL_F32: i64 = 0;
const DUAL_BF16: i64 = 1;
const DUAL_NORM: i64 = 2;
/// Added to the form: the 1x128 operand is a slice of a stacked one (its codes' row
/// stride the 128x1 scales' one; quantize.cu's DUAL_ROWS_STACKED).
const DUAL_ROWS_STACKED: i64 = 4;

impl DualIn<'_> {
    /// Check it against `[rows, cols]`; the table's x, form ([`DUAL_F32`],
    /// [`DUAL_BF16`], [`DUAL_NORM`]), w and rstd.
    fn entries(self, gpu: &Gpu, rows: usize, cols: usize) -> Result<[i64; 4]> {
        let (what, shape) = ("quantize 1x128 + 128x1 input", format!("[{rows}, {cols}]"));
        Ok(match self {
            DualIn::Values(x) => {
                x.check(what, rows * cols, &shape)?;
                let form = if x.is_bf16() { DUAL_BF16 } else { DUAL_F32 };
                [x.ptr(gpu) as i64, form, 0, 0]
            }
            DualIn::Norm { x, w, rstd } => {
                check_len(&format!("{what} (the norm's x)"), x, rows * cols, &shape)?;
                check_len(
                    &format!("{what} (the norm's w)"),
                    w,
                    cols,
                    format!("[{cols}]"),
                )?;
                check_len(
                    &format!("{what} (the norm's rstd)"),
                    rstd,
                    rows,
                    format!("[{rows}]"),
                )?;
                [
                    gpu.ptr(x) as i64,
                    DUAL_NORM,
                    gpu.ptr(w) as i64,
                    gpu.ptr(rstd) as i64,
                ]
            }
        })
    }
}

/// Whether [`quantize_dual`] of `[rows, cols]` fills the GPU: a 128 x 128 tile a
/// block of 512 threads, two blocks an SM, so at least two tiles an SM. A smaller
/// one runs its few tiles' long chains on a few SMs; made beside other matrices'
/// groups ([`quantize_dual_multi`]) they share one launch's waves instead.
pub fn dual_fills_gpu(gpu: &Gpu, rows: usize, cols: usize) -> bool {
    rows.div_ceil(GROUP) * pad16(cols).div_ceil(GROUP) >= 2 * gpu.sm_count()
}

/// [`quantize_dual`] (`dual`) or [`quantize_col128x1`] (not) of several matrices
/// `(x, rows, cols, dual)` in one launch (`quant_dual_multi`: the same tiles, so the
/// same bits): `(1x128 operand when dual, 128x1 operand)` each, of the values
/// [`DualIn`] names.
pub fn quantize_dual_multi(
    gpu: &Gpu,
    xs: &[(DualIn, usize, usize, bool)],
) -> Result<Vec<(Option<Fp8Quantized>, Fp8Quantized)>> {
    let mut outs = Vec::with_capacity(xs.len());
    let mut ents = Vec::with_capacity(xs.len());
    for &(_, rows, cols, dual) in xs {
        check_dims("quantize 1x128 + 128x1 input", rows, cols)?;
        let row = match dual {
            true => Some(unwritten_row1x128(gpu, rows, cols)?),
            false => None,
        };
        outs.push((row, unwritten_col128x1(gpu, rows, cols)?));
    }
    for (&(x, rows, cols, _), (row, col)) in xs.iter().zip(&outs) {
        let row = row.as_ref().map(|r| RowDest::own(gpu, r));
        ents.push((x, rows, cols, row, ColDest::own(gpu, col)));
    }
    dual_multi_launch(gpu, &ents)?;
    Ok(outs)
}

/// [`quantize_dual_multi`] (every matrix dual) of matrices `(x, cols)` of `rows`
/// rows each, their 128x1 operands side by side in one `[rows, sum of cols]`
/// operand, in order: the stacked dy of one WGrad GEMM for projections that share
/// their input ([`super::linear::wgrad_fp8_stacked`]); with `stack_rows` their 1x128
/// operands too (one DGrad GEMM, [`super::linear::linear_dgrad_fp8_stacked`]). The
/// same tiles, so each matrix's codes and scales are those of its own operand.
/// Returns the 1x128 operands and the stacked 128x1 one; every `cols` must be a
/// multiple of 16 (of 128 with `stack_rows`: whole groups).
pub fn quantize_dual_stacked(
    gpu: &Gpu,
    xs: &[(DualIn, usize)],
    rows: usize,
    stack_rows: bool,
) -> Result<(DualRows, Fp8Quantized)> {
    let total: usize = xs.iter().map(|x| x.1).sum();
    check_dims("quantize 1x128 + stacked 128x1 input", rows, total)?;
    let col = unwritten_col128x1(gpu, rows, total)?;
    let cols: Vec<usize> = xs.iter().map(|x| x.1).collect();
    let out = DualRows::new(gpu, rows, &cols, stack_rows)?;
    let mut ents = Vec::with_capacity(xs.len());
    let mut c0 = 0;
    for (i, &(x, cols)) in xs.iter().enumerate() {
        check_dims("quantize 1x128 + 128x1 input", rows, cols)?;
        let cd = ColDest::slice(gpu, &col, rows, c0, cols)?;
        ents.push((x, rows, cols, Some(out.dest(gpu, i)?), cd));
        c0 += cols;
    }
    dual_multi_launch(gpu, &ents)?;
    Ok((out.rows, col))
}

/// One `quant_dual_multi*` launch over `(x, rows, cols, 1x128 operand if dual,
/// 128x1 destination)` (quantize.cu's table of DUAL_TAB entries a matrix).
fn dual_multi_launch(
    gpu: &Gpu,
    xs: &[(DualIn, usize, usize, Option<RowDest>, ColDest)],
) -> Result<()> {
    let mut tab: Vec<i64> = Vec::with_capacity(xs.len() * 14);
    let mut first = 0usize;
    // Which forms the launch holds (1: BF16, 2: f32 or a norm's output, 3: both):
    // a launch of one kind takes that kind's kernel (quantize.cu: no spills).
    let mut forms = 0u8;
    for &(x, rows, cols, row, col) in xs {
        let [xp, form, wp, rstdp] = x.entries(gpu, rows, cols)?;
        forms |= if form == DUAL_BF16 { 1 } else { 2 };
        let (rp, cp) = (pad16(rows), pad16(cols));
        // A 1x128 destination at another row stride than its own width is a slice
        // of a stacked operand as wide as the 128x1 one (quantize.cu's
        // DUAL_ROWS_STACKED: the kernel takes ldst for both).
        let stacked = row.is_some_and(|r| r.ldc != cp as i64);
        ensure(!stacked || row.is_some_and(|r| r.ldc == col.ldst), || {
            "quantize 1x128 + 128x1: a stacked 1x128 operand must be as wide as the 128x1 one"
                .into()
        })?;
        let form = form | if stacked { DUAL_ROWS_STACKED } else { 0 };
        tab.extend([
            xp,
            rows as i64,
            cols as i64,
            rp as i64,
            cp as i64,
            row.map_or(0, |r| r.codes as i64),
            row.map_or(0, |r| r.scales as i64),
            col.codes_t as i64,
            col.scales_t as i64,
            first as i64,
            form,
            wp,
            rstdp,
            col.ldst,
        ]);
        first += cp.div_ceil(GROUP) * rows.div_ceil(GROUP);
    }
    let name = match forms {
        1 => "quant_dual_multi_bf16",
        2 => "quant_dual_multi_f32",
        _ => "quant_dual_multi",
    };
    launch_table(gpu, name, &tab, xs.len(), first)
}

/// `quant_dual_f32` over 128 x 128 tiles: the 128x1 operand, and the 1x128 one
/// into `row` (codes, scales; device addresses) when given.
fn tiles(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    rows: usize,
    cols: usize,
    row: Option<(u64, u64)>,
) -> Result<Fp8Quantized> {
    let (rp, cp) = (pad16(rows), pad16(cols));
    let col = unwritten_col128x1(gpu, rows, cols)?;
    let (cd, sc) = row.unwrap_or((0, 0));
    gpu.launch(
        &QUANTIZE,
        "quant_dual_f32",
        (cp.div_ceil(GROUP) as u32, rows.div_ceil(GROUP) as u32, 1),
        (512, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(x)),
            Arg::L(cols as i64),
            Arg::I(rows as i32),
            Arg::I(cols as i32),
            Arg::I(rp as i32),
            Arg::I(cp as i32),
            Arg::P(cd),
            Arg::P(sc),
            Arg::P(gpu.ptr(&col.codes)),
            Arg::P(gpu.ptr(&col.scales)),
        ],
    )?;
    Ok(col)
}

/// The buffers of a `[rows, cols]` source's 1x128 and 128x1 operands, for a kernel
/// to write (`quant_dual_f32`'s outputs).
pub(crate) fn unwritten_dual(gpu: &Gpu, rows: usize, cols: usize) -> Result<DualFp8> {
    let row = unwritten_row1x128(gpu, rows, cols)?;
    let col = unwritten_col128x1(gpu, rows, cols)?;
    Ok(DualFp8 { row, col })
}

/// The buffers of a `[rows, cols]` source's 128x1 operand, for a kernel to write:
/// codes^T `[cols_pad][rows_pad]`, scales `[ceil(rows/128)][cols_pad]`.
fn unwritten_col128x1(gpu: &Gpu, rows: usize, cols: usize) -> Result<Fp8Quantized> {
    let (rp, cp) = (pad16(rows), pad16(cols));
    let codes_t = gpu.uninit::<u8>(cp * rp)?;
    let scales_t = gpu.uninit::<f32>(rows.div_ceil(GROUP) * cp)?;
    Ok(quantized(Grouping::Col128x1, rows, cols, codes_t, scales_t))
}

/// The buffers of a `[rows, cols]` source's 1x128 operand, for a kernel to write:
/// codes `[rows_pad][cols_pad]`, scales `[ceil(cols/128)][rows_pad]`.
fn unwritten_row1x128(gpu: &Gpu, rows: usize, cols: usize) -> Result<Fp8Quantized> {
    let (rp, cp) = (pad16(rows), pad16(cols));
    let codes = gpu.uninit::<u8>(rp * cp)?;
    let scales = gpu.uninit::<f32>(cols.div_ceil(GROUP) * rp)?;
    Ok(quantized(Grouping::Row1x128, rows, cols, codes, scales))
}

/// An activation operand (no block scales) of a `[rows, cols]` source.
fn quantized(
    grouping: Grouping,
    rows: usize,
    cols: usize,
    codes: CudaSlice<u8>,
    scales: CudaSlice<f32>,
) -> Fp8Quantized {
    Fp8Quantized {
        grouping,
        rows,
        cols,
        rows_pad: pad16(rows),
        cols_pad: pad16(cols),
        codes,
        scales,
        lds: 0,
    }
}

/// 128x128 blocks of a weight `w [rows, cols]` (= `[N, K]`), and, when
/// `transposed`, the same blocks of `W^T [cols, rows]` for DGrad (a block
/// transposes exactly: same codes, same scale).
pub fn quantize_block128(
    gpu: &Gpu,
    w: &CudaSlice<f32>,
    rows: usize,
    cols: usize,
    transposed: bool,
) -> Result<(Fp8Quantized, Option<Fp8Quantized>)> {
    check_shape("quantize 128x128 input", w, rows, cols)?;
    let out = Block128Out::new(gpu, rows, cols, transposed)?;
    let t = out.t.as_ref();
    gpu.launch(
        &QUANTIZE,
        "quant_block128_f32",
        (cols.div_ceil(GROUP) as u32, rows.div_ceil(GROUP) as u32, 1),
        (512, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(w)),
            Arg::L(cols as i64),
            Arg::I(rows as i32),
            Arg::I(cols as i32),
            Arg::I(out.fwd.rows_pad as i32),
            Arg::I(out.fwd.cols_pad as i32),
            Arg::P(gpu.ptr(&out.fwd.codes)),
            Arg::P(gpu.ptr(&out.fwd.scales)),
            Arg::I(out.fwd.lds as i32),
            Arg::P(t.map_or(0, |t| gpu.ptr(&t.codes))),
            Arg::P(t.map_or(0, |t| gpu.ptr(&t.scales))),
            Arg::I(t.map_or(0, |t| t.lds as i32)),
        ],
    )?;
    Ok((out.fwd, out.t))
}

/// [`quantize_block128`] of several weights `(w, rows, cols)` in one launch
/// (`quant_block128_multi`: the same blocks, so the same bits), the weights of a
/// model prepared at once: one launch of many blocks in place of a small launch a
/// weight.
pub fn quantize_block128_multi(
    gpu: &Gpu,
    ws: &[(&CudaSlice<f32>, usize, usize)],
    transposed: bool,
) -> Result<Vec<(Fp8Quantized, Option<Fp8Quantized>)>> {
    let t = match transposed {
        true => TOut::Own,
        false => TOut::None,
    };
    let ts = vec![t; ws.len()];
    quantize_block128_multi_to(gpu, ws, &ts)
}

/// Where a 128x128 quantizer writes a weight's `W^T` blocks (DGrad's operand).
#[derive(Clone, Copy)]
pub enum TOut {
    /// None written.
    None,
    /// Buffers of its own (returned).
    Own,
    /// Its columns of a stacked `W^T` ([`TDest::part`]).
    Part(TDest),
}

/// [`quantize_block128_multi`] with each weight's `W^T` blocks written where `ts`
/// says: its own buffers (returned), a column slice of a stacked `W^T` (the DGrad
/// operand of projections that share their input, [`stacked_block128_t`]), or none.
pub fn quantize_block128_multi_to(
    gpu: &Gpu,
    ws: &[(&CudaSlice<f32>, usize, usize)],
    ts: &[TOut],
) -> Result<Vec<(Fp8Quantized, Option<Fp8Quantized>)>> {
    ensure(ws.len() == ts.len(), || {
        format!(
            "quantize 128x128: {} weights, {} W^T destinations",
            ws.len(),
            ts.len()
        )
    })?;
    let mut outs = Vec::with_capacity(ws.len());
    let mut tab: Vec<i64> = Vec::with_capacity(ws.len() * 14);
    let mut first = 0usize;
    for (&(w, rows, cols), &to) in ws.iter().zip(ts) {
        check_shape("quantize 128x128 input", w, rows, cols)?;
        let out = Block128Out::new(gpu, rows, cols, matches!(to, TOut::Own))?;
        let dest = match (to, out.t.as_ref()) {
            (TOut::Part(d), _) => {
                d.check(rows, cols)?;
                Some(d)
            }
            (_, Some(t)) => Some(TDest::own(gpu, t)),
            _ => None,
        };
        let f = &out.fwd;
        tab.extend([
            gpu.ptr(w) as i64,
            rows as i64,
            cols as i64,
            f.rows_pad as i64,
            f.cols_pad as i64,
            gpu.ptr(&f.codes) as i64,
            gpu.ptr(&f.scales) as i64,
            f.lds as i64,
        ]);
        tab.extend(TDest::entries(dest.as_ref(), first));
        first += rows.div_ceil(GROUP) * cols.div_ceil(GROUP);
        outs.push((out.fwd, out.t));
    }
    launch_table(gpu, "quant_block128_multi", &tab, ws.len(), first)?;
    Ok(outs)
}

/// A zeroed stacked `W^T [k, n]` of 128x128 blocks: the DGrad operand of projections
/// that read one input (q, k, v; gate, up), their `W^T`s side by side (each a
/// [`TDest::part`]), so one DGrad GEMM runs over all of them. `n` a multiple of 128;
/// the scales' padding columns stay zero (cuBLASLt reads them).
pub fn stacked_block128_t(gpu: &Gpu, k: usize, n: usize) -> Result<Fp8Quantized> {
    ensure(k > 0 && n > 0 && n.is_multiple_of(GROUP), || {
        format!("stacked W^T [{k}, {n}]: n must be a positive multiple of 128")
    })?;
    let (kp, kb, nb) = (pad16(k), k.div_ceil(GROUP), n / GROUP);
    let lds = nb.div_ceil(4) * 4;
    Ok(Fp8Quantized {
        grouping: Grouping::Block128,
        rows: k,
        cols: n,
        rows_pad: kp,
        cols_pad: n,
        codes: gpu.zeros::<u8>(kp * n)?,
        scales: gpu.zeros::<f32>(kb * lds)?,
        lds,
    })
}

/// Where the blocks of one weight's `W^T` go: codes^T, scales^T and their row
/// strides, the scales^T columns whose padding the writer zeroes (`zlim`: its own
/// padding, or none for a slice of a stacked `W^T`), and the weight's `[n, k]`.
/// Written by `quant_block128_multi` and AdamW's `adamw_block128_multi`.
#[derive(Clone, Copy, Debug)]
pub struct TDest {
    codes: u64,
    scales: u64,
    lds: i64,
    ldct: i64,
    zlim: i64,
    n: usize,
    k: usize,
}

impl TDest {
    /// The weight's own `W^T` blocks.
    pub fn own(gpu: &Gpu, t: &Fp8Quantized) -> TDest {
        TDest {
            codes: gpu.ptr(&t.codes),
            scales: gpu.ptr(&t.scales),
            lds: t.lds as i64,
            ldct: t.cols_pad as i64,
            zlim: t.lds as i64,
            n: t.cols,
            k: t.rows,
        }
    }

    /// Columns `[n0, n0 + n)` of the stacked `W^T [k, N]` `st`
    /// ([`stacked_block128_t`]): the `W^T` of a weight `[n, k]`; `n0` and `n`
    /// multiples of 128, so its blocks are whole blocks of `st`.
    pub fn part(gpu: &Gpu, st: &Fp8Quantized, n0: usize, n: usize, k: usize) -> Result<TDest> {
        ensure(
            st.grouping == Grouping::Block128
                && st.rows == k
                && n0.is_multiple_of(GROUP)
                && n.is_multiple_of(GROUP)
                && n > 0
                && n0 + n <= st.cols,
            || {
                format!(
                    "W^T of a weight [{n}, {k}] at column {n0} of a stacked {:?} [{}, {}]: not whole 128-column blocks inside it",
                    st.grouping, st.rows, st.cols
                )
            },
        )?;
        Ok(TDest {
            codes: gpu.ptr(&st.codes) + n0 as u64,
            scales: gpu.ptr(&st.scales) + 4 * (n0 / GROUP) as u64,
            lds: st.lds as i64,
            ldct: st.cols_pad as i64,
            zlim: (n / GROUP) as i64,
            n,
            k,
        })
    }

    /// That it is the `W^T` of a weight `[n, k]`.
    pub(crate) fn check(&self, n: usize, k: usize) -> Result<()> {
        ensure((self.n, self.k) == (n, k), || {
            format!(
                "W^T blocks of a weight [{}, {}] given for a weight [{n}, {k}]",
                self.n, self.k
            )
        })
    }

    /// quant_block128_multi's codes_t, scales_t, lds_t, first block, ldct, zlim_t
    /// (zeros for none).
    pub(crate) fn entries(d: Option<&TDest>, first: usize) -> [i64; 6] {
        match d {
            Some(d) => [
                d.codes as i64,
                d.scales as i64,
                d.lds,
                first as i64,
                d.ldct,
                d.zlim,
            ],
            None => [0, 0, 0, first as i64, 0, 0],
        }
    }
}

/// A multi-tensor quantizer `name(tab, count)` over `blocks` blocks of 512 threads
/// (its table uploaded, then freed in stream order after the launch).
fn launch_table(
    gpu: &Gpu,
    name: &'static str,
    tab: &[i64],
    count: usize,
    blocks: usize,
) -> Result<()> {
    ensure(blocks <= i32::MAX as usize, || {
        format!("{name}: {blocks} blocks is more than one launch takes")
    })?;
    if blocks == 0 {
        return Ok(());
    }
    let tab = gpu.upload(tab)?;
    gpu.launch(
        &QUANTIZE,
        name,
        (blocks as u32, 1, 1),
        (512, 1, 1),
        0,
        &[Arg::P(gpu.ptr(&tab)), Arg::I(count as i32)],
    )
}

/// The buffers of a weight's 128x128 operand (and its transpose's), for
/// `quant_block128_*` to write whole (codes, scales and the scales' padding).
struct Block128Out {
    fwd: Fp8Quantized,
    t: Option<Fp8Quantized>,
}

impl Block128Out {
    fn new(gpu: &Gpu, rows: usize, cols: usize, transposed: bool) -> Result<Block128Out> {
        let (rp, cp) = (pad16(rows), pad16(cols));
        let (rb, cb) = (rows.div_ceil(GROUP), cols.div_ceil(GROUP));
        let (lds, lds_t) = (cb.div_ceil(4) * 4, rb.div_ceil(4) * 4);
        let block = |rows, cols, rows_pad, cols_pad, codes, scales, lds| Fp8Quantized {
            grouping: Grouping::Block128,
            rows,
            cols,
            rows_pad,
            cols_pad,
            codes,
            scales,
            lds,
        };
        let fwd = block(
            rows,
            cols,
            rp,
            cp,
            gpu.uninit::<u8>(rp * cp)?,
            gpu.uninit::<f32>(rb * lds)?,
            lds,
        );
        let t = if transposed {
            Some(block(
                cols,
                rows,
                cp,
                rp,
                gpu.uninit::<u8>(cp * rp)?,
                gpu.uninit::<f32>(cb * lds_t)?,
                lds_t,
            ))
        } else {
            None
        };
        Ok(Block128Out { fwd, t })
    }
}

/// `x [rows, cols]` f32 -> BF16 bits `[rows_pad][cols_pad]` (round to nearest even,
/// zero padding): the BF16 GEMM operands.
pub fn to_bf16_padded(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    rows: usize,
    cols: usize,
    rows_pad: usize,
    cols_pad: usize,
) -> Result<CudaSlice<u16>> {
    check_shape("BF16 conversion input", x, rows, cols)?;
    ensure(rows_pad >= rows && cols_pad >= cols, || {
        format!("BF16 padding [{rows_pad}, {cols_pad}] is smaller than [{rows}, {cols}]")
    })?;
    let y = gpu.uninit::<u16>(rows_pad * cols_pad)?;
    pad_bf16(gpu, x, (rows, cols), (rows_pad, cols_pad), gpu.ptr(&y))?;
    Ok(y)
}

/// [`to_bf16_padded`] without padding into `y` (`rows cols` values: a weight's
/// rows of a stacked BF16 weight): the same bits.
pub fn to_bf16_into(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    rows: usize,
    cols: usize,
    y: Bf16View,
) -> Result<()> {
    check_shape("BF16 conversion input", x, rows, cols)?;
    ensure(y.len() == rows * cols, || {
        format!(
            "BF16 conversion of [{rows}, {cols}] into {} values",
            y.len()
        )
    })?;
    pad_bf16(gpu, x, (rows, cols), (rows, cols), y.ptr(gpu))
}

/// `pad_bf16_f32(_x4)`: x `[rows, cols]` as BF16 `[rows_pad][cols_pad]` at `y`.
fn pad_bf16(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    (rows, cols): (usize, usize),
    (rows_pad, cols_pad): (usize, usize),
    y: u64,
) -> Result<()> {
    let n = rows_pad * cols_pad;
    // Four columns a thread where rows stay 16-byte aligned (every model shape).
    let x4 = cols_pad.is_multiple_of(4) && cols.is_multiple_of(4);
    let (name, threads) = match x4 {
        true => ("pad_bf16_f32_x4", n / 4),
        false => ("pad_bf16_f32", n),
    };
    if n == 0 {
        return Ok(());
    }
    gpu.launch(
        &QUANTIZE,
        name,
        (threads.div_ceil(256) as u32, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(x)),
            Arg::L(cols as i64),
            Arg::I(rows as i32),
            Arg::I(cols as i32),
            Arg::I(rows_pad as i32),
            Arg::I(cols_pad as i32),
            Arg::P(y),
        ],
    )
}

/// Fill `y` with deterministic pseudo-random values in `[-amp, amp)` on the device.
pub fn fill_random(gpu: &Gpu, y: &mut CudaSlice<f32>, seed: u32, amp: f32) -> Result<()> {
    let n = y.len();
    gpu.launch(
        &QUANTIZE,
        "fill_random_f32",
        (n.div_ceil(256) as u32, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(y)),
            Arg::L(n as i64),
            Arg::I(seed as i32),
            Arg::F(amp),
        ],
    )
}
