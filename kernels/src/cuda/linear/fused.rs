//! A decode step's GEMM epilogues fused with the kernel that reads their output
//! (`ops.cu`: `qkv_sk_norm_rope` beside `qk_norm_rope`; `quantize.cu`:
//! `rmsnorm_sk_operand` beside `rmsnorm_operand`, `swiglu_sk_operand` beside
//! `swiglu_operand`; their epilogue loads `sk_epi4` / `sk_epi1` in
//! `common.cuh`, beside `linear_epilogue_at`'s `epi_value`). Where a projection takes the
//! split-K path, its `linear_epilogue` (slices added in order, the BF16
//! rounding, the residual add) runs inside the next kernel: the same adds in the
//! same order, so every output holds the bits of the unfused launches, and a
//! layer runs three launches fewer (q, k, v + Qwen3's q/k norms and RoPE; o +
//! post-attention norm; gate, up + SwiGLU) plus one more between layers (down +
//! the next layer's input norm). The o projection's operand comes from the
//! decode attention itself (`flash_append_decode_operand_dev`).

use cudarc::driver::CudaSlice;

use super::super::context::{Arg, OPS, QUANTIZE};
use super::super::gemv::{gate_up_swiglu_fits, gate_up_swiglu_fp8, CStruct, Partial};
use super::super::ops::{qk_norm_rope_fits, GpuRope};
use super::super::quantize::{FusedOperand, NORM_OPERAND_MAX_DIM};
use super::group::group_partials;
use super::{split_k_partial, takes_split_k, GpuWeight, XIn, XOperand};
use crate::cuda::{check_len, ensure, Gpu, Result};
use crate::fp8::GROUP;
use crate::GemmPrecision;

/// `RN_SK_G` in `quantize.cu`: the 128-column groups a warp of
/// `rmsnorm_sk_operand` holds (the kernel traps on a wider row).
const RN_SK_G: usize = 2;
/// Widest row `rmsnorm_sk_operand` takes (32 warps of `RN_SK_G` groups);
/// `rmsnorm_operand`'s sum order is the same up to its own widest.
const NORM_SK_MAX_DIM: usize = 32 * RN_SK_G * GROUP;

/// `SkIn` (`common.cuh`) of a partial: its slices, `res [rows, cols]` added
/// after the rounding, the epilogue's output stored into `out` (both optional).
fn sk_in(
    gpu: &Gpu,
    p: &Partial,
    res: Option<&CudaSlice<f32>>,
    out: Option<&CudaSlice<f32>>,
) -> Result<Arg> {
    let mut s = CStruct::default();
    s.u64(gpu.ptr(&p.p))
        .i64(p.ldp as i64)
        .i64(p.sstride as i64)
        .i32(p.splits as i32)
        .i32(0)
        .u64(res.map_or(0, |r| gpu.ptr(r)))
        .u64(out.map_or(0, |o| gpu.ptr(o)));
    s.arg()
}

/// `(y [m, n], normed [m, n], rstd [m], normed's operand)`.
pub type ResidualNorm = (CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>, XOperand);

/// The o (or down) projection of `x [m, k]` plus the residual `res [m, n]`, then
/// RMSNorm of that sum with `norm_w [n]` and the next GEMM's operand, in the
/// two launches of the split-K GEMM and `rmsnorm_sk_operand`: `(y [m, n],
/// normed [m, n], rstd [m], operand)`, the bits of `linear_forward_residual`
/// then `rmsnorm_with_operand`. `None` (nothing launched) where those would not
/// take the split-K and fused-norm paths.
#[allow(clippy::too_many_arguments)]
pub fn linear_residual_norm<'a>(
    gpu: &Gpu,
    x: impl Into<XIn<'a>>,
    xo: &mut XOperand,
    m: usize,
    w: &GpuWeight,
    prec: GemmPrecision,
    res: &CudaSlice<f32>,
    (norm_w, eps): (&CudaSlice<f32>, f64),
) -> Result<Option<ResidualNorm>> {
    let (n, k) = (w.n, w.k);
    let fits = n > 0 && n <= NORM_SK_MAX_DIM.min(NORM_OPERAND_MAX_DIM);
    if m == 0 || !fits || !takes_split_k(gpu, m, w, prec) {
        return Ok(None);
    }
    let x = x.into();
    x.check(m, k)?;
    check_len("linear residual", res, m * n, format!("[{m}, {n}]"))?;
    check_len("rmsnorm w", norm_w, n, format!("[{n}]"))?;
    let p = split_k_partial(gpu, x, xo.of(m, k)?, m, w, prec)?;
    let y = gpu.uninit::<f32>(m * n)?;
    let normed = gpu.uninit::<f32>(m * n)?;
    let rstd = gpu.uninit::<f32>(m)?;
    let op = FusedOperand::alloc(gpu, m, n, prec == GemmPrecision::Fp8)?;
    // One block a row (padding rows too), 32 threads a 128-column group (at most
    // 32 warps): rmsnorm_operand's layout, so its sum order.
    gpu.launch(
        &QUANTIZE,
        "rmsnorm_sk_operand",
        (op.rows_pad(m) as u32, 1, 1),
        ((32 * n.div_ceil(GROUP).min(32)) as u32, 1, 1),
        0,
        &[
            &[
                sk_in(gpu, &p, Some(res), Some(&y))?,
                Arg::P(gpu.ptr(norm_w)),
                Arg::I(m as i32),
                Arg::I(n as i32),
                Arg::F(eps as f32),
                Arg::P(gpu.ptr(&normed)),
                Arg::P(gpu.ptr(&rstd)),
            ][..],
            &op.args(gpu, m, n),
        ]
        .concat(),
    )?;
    Ok(Some((y, normed, rstd, XOperand::fused(m, n, op))))
}

/// The gate and up projections of `x [m, k]` (no bias) and SwiGLU of their
/// outputs with the down projection's operand, in the two launches of the
/// grouped split-K GEMM and `swiglu_sk_operand`, or (FP8, wide enough:
/// `gemv::gate_up_swiglu_fits`) in one: `(h [m, inter], operand)`, the bits of
/// `linear_forward_group` then `swiglu_with_operand` either way. `None` (nothing
/// launched) where the grouped split-K path does not apply.
pub fn gate_up_swiglu(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    xo: &mut XOperand,
    m: usize,
    (gate, up): (&GpuWeight, &GpuWeight),
    prec: GemmPrecision,
) -> Result<Option<(CudaSlice<f32>, XOperand)>> {
    ensure(gate.n == up.n && gate.k == up.k, || {
        format!(
            "gate [{}, {}] and up [{}, {}] differ in shape",
            gate.n, gate.k, up.n, up.k
        )
    })?;
    if let Some(fused) = gate_up_swiglu_one_launch(gpu, x, xo, m, (gate, up), prec)? {
        return Ok(Some(fused));
    }
    let Some(parts) = group_partials(gpu, x.into(), xo, m, &[gate, up], prec)? else {
        return Ok(None);
    };
    let cols = gate.n;
    let h = gpu.uninit::<f32>(m * cols)?;
    let op = FusedOperand::alloc(gpu, m, cols, prec == GemmPrecision::Fp8)?;
    // One warp per (row, 128-column group), 8 warps a block: swiglu_operand's layout.
    let warps = op.rows_pad(m) * cols.div_ceil(GROUP);
    gpu.launch(
        &QUANTIZE,
        "swiglu_sk_operand",
        (warps.div_ceil(8) as u32, 1, 1),
        (256, 1, 1),
        0,
        &[
            &[
                sk_in(gpu, &parts[0], None, None)?,
                sk_in(gpu, &parts[1], None, None)?,
                Arg::I(m as i32),
                Arg::I(cols as i32),
                Arg::P(gpu.ptr(&h)),
            ][..],
            &op.args(gpu, m, cols),
        ]
        .concat(),
    )?;
    Ok(Some((h, XOperand::fused(m, cols, op))))
}

/// [`gate_up_swiglu`] in one launch (`gemv::gate_up_swiglu_fp8`) where the FP8
/// decode path would run the grouped split-K kernel and `swiglu_sk_operand`
/// (the same bits); `None` (nothing launched) elsewhere.
fn gate_up_swiglu_one_launch(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    xo: &mut XOperand,
    m: usize,
    (gate, up): (&GpuWeight, &GpuWeight),
    prec: GemmPrecision,
) -> Result<Option<(CudaSlice<f32>, XOperand)>> {
    let (Some(gq), Some(uq)) = (gate.fp8.as_ref(), up.fp8.as_ref()) else {
        return Ok(None);
    };
    if prec != GemmPrecision::Fp8
        || !(gate.batch_invariant && up.batch_invariant)
        || !gate_up_swiglu_fits(gpu, m, gate.n)
    {
        return Ok(None);
    }
    let (cols, k) = (gate.n, gate.k);
    check_len("linear input", x, m * k, format!("[{m}, {k}]"))?;
    let qx = xo.of(m, k)?.fp8(gpu, x.into(), m, k)?;
    let h = gpu.uninit::<f32>(m * cols)?;
    let op = FusedOperand::alloc(gpu, m, cols, true)?;
    gate_up_swiglu_fp8(gpu, qx, (gq, uq), &h, &op.args(gpu, m, cols))?;
    Ok(Some((h, XOperand::fused(m, cols, op))))
}

/// A decode step's q, k and v projections as split-K partials, with what their
/// epilogue needs (Qwen3's q/k norm weights, eps, the rows' RoPE positions and
/// tables): the input of `qkv_sk_norm_rope` ([`QkvPartials::norm_rope`]) or of
/// the decode attention that runs that epilogue itself
/// (`flash::flash_qkv_append_decode_operand_dev`).
pub struct QkvPartials<'a> {
    parts: Vec<Partial>,
    /// Rows, q heads, KV heads, head_dim.
    pub m: usize,
    pub nh: usize,
    pub nkv: usize,
    pub hd: usize,
    norms: (&'a CudaSlice<f32>, &'a CudaSlice<f32>, f64),
    positions: &'a CudaSlice<i32>,
    rope: &'a GpuRope,
}

impl QkvPartials<'_> {
    /// The epilogue's arguments: the three partials (`SkIn`), qw, kw, then (`dec`
    /// false, `qkv_sk_norm_rope`) rows, nh, nkv, hd, then eps, positions, cos, sin
    /// (`dec` true, `fa_dec2_qkv`: no shape).
    pub(crate) fn args(&self, gpu: &Gpu, dec: bool) -> Result<Vec<Arg>> {
        let (qw, kw, eps) = self.norms;
        let mut a = vec![
            sk_in(gpu, &self.parts[0], None, None)?,
            sk_in(gpu, &self.parts[1], None, None)?,
            sk_in(gpu, &self.parts[2], None, None)?,
            Arg::P(gpu.ptr(qw)),
            Arg::P(gpu.ptr(kw)),
        ];
        if !dec {
            a.extend([
                Arg::I(self.m as i32),
                Arg::I(self.nh as i32),
                Arg::I(self.nkv as i32),
                Arg::I(self.hd as i32),
            ]);
        }
        a.extend([
            Arg::F(eps as f32),
            Arg::P(gpu.ptr(self.positions)),
            Arg::P(gpu.ptr(&self.rope.cos)),
            Arg::P(gpu.ptr(&self.rope.sin)),
        ]);
        Ok(a)
    }

    /// The epilogue with the q/k norms and RoPE (`qkv_sk_norm_rope`): `(q [m, nh *
    /// hd], k, v [m, nkv * hd])`, the bits of `linear_forward_group` then
    /// `ops::qk_norm_rope` (whose rstd a decode step does not keep).
    pub fn norm_rope(&self, gpu: &Gpu) -> Result<[CudaSlice<f32>; 3]> {
        let (m, nh, nkv, hd) = (self.m, self.nh, self.nkv, self.hd);
        let q = gpu.uninit::<f32>(m * nh * hd)?;
        let (k, v) = (
            gpu.uninit::<f32>(m * nkv * hd)?,
            gpu.uninit::<f32>(m * nkv * hd)?,
        );
        let out = [
            Arg::P(gpu.ptr(&q)),
            Arg::P(gpu.ptr(&k)),
            Arg::P(gpu.ptr(&v)),
        ];
        gpu.launch(
            &OPS,
            "qkv_sk_norm_rope",
            (m as u32, (nh + 2 * nkv).div_ceil(8) as u32, 1),
            (256, 1, 1),
            0,
            &[&self.args(gpu, false)?[..], &out].concat(),
        )?;
        Ok([q, k, v])
    }
}

/// Qwen3's q, k and v projections of `x [m, k]` (no biases) in the grouped
/// split-K GEMM's one launch, kept as partials for the epilogue with the per-head
/// q/k norms and RoPE at `positions` ([`QkvPartials`]). `None` (nothing launched)
/// where the grouped split-K path does not apply or the heads do not fit
/// `qk_norm_rope`.
#[allow(clippy::too_many_arguments)]
pub fn qkv_partials<'a>(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    xo: &mut XOperand,
    m: usize,
    (wq, wk, wv): (&GpuWeight, &GpuWeight, &GpuWeight),
    norms: (&'a CudaSlice<f32>, &'a CudaSlice<f32>, f64),
    (positions, rope): (&'a CudaSlice<i32>, &'a GpuRope),
    prec: GemmPrecision,
) -> Result<Option<QkvPartials<'a>>> {
    let hd = rope.head_dim;
    if hd == 0 || !qk_norm_rope_fits(hd) || wk.n != wv.n || wq.n % hd != 0 || wk.n % hd != 0 {
        return Ok(None);
    }
    let (nh, nkv) = (wq.n / hd, wk.n / hd);
    check_len("q_norm weight", norms.0, hd, format!("[{hd}]"))?;
    check_len("k_norm weight", norms.1, hd, format!("[{hd}]"))?;
    check_len("rope positions", positions, m, format!("[{m}]"))?;
    let Some(parts) = group_partials(gpu, x.into(), xo, m, &[wq, wk, wv], prec)? else {
        return Ok(None);
    };
    Ok(Some(QkvPartials {
        parts,
        m,
        nh,
        nkv,
        hd,
        norms,
        positions,
        rope,
    }))
}
