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

mod fused;
mod group;
mod stacked_bf16;
pub use super::gemv::set_gate_up_fused;
pub use fused::{gate_up_swiglu, linear_residual_norm, qkv_partials, QkvPartials, ResidualNorm};
pub use group::{linear_forward_group, linear_forward_group_act};
pub use stacked_bf16::{
    linear_dgrad_bf16_part, linear_dgrad_bf16_stacked, stacked_dy_bf16, wgrad_bf16_stacked,
};

use super::act::{Act, ActRef};
use super::adamw::{BlockTargets, TTarget};
use super::context::{Arg, OPS};
use super::gemm::{dense_gemm, dense_gemm_to, fp8_gemm_nt, fp8_gemm_nt_bf16, Dense, LtType};
use super::gemv::{
    gemm_fp8_rows_fused, gemv_fp8_partial, split_k_pays, Epi, Partial, GEMV_MAX_TOKENS,
};
use super::gemv_bf16::{gemm_bf16_rows_fused, gemv_bf16_partial, Bf16Rows};
use super::grad::GradAcc;
use super::ops::{rmsnorm_forward, swiglu_forward};
use super::part::Bf16View;
use super::quantize::{
    quantize_block128, quantize_block128_multi, quantize_block128_multi_to, quantize_col128x1,
    quantize_dual, quantize_row1x128, rmsnorm_operand, rmsnorm_operand_opt, stacked_block128_t,
    swiglu_dual, swiglu_operand, swiglu_operand_opt, to_bf16_into, to_bf16_padded, DualFp8,
    Fp8Quantized, FusedOperand, TDest, TOut, NORM_OPERAND_MAX_DIM,
};
use super::{check_len, ensure, pad16, Ctx, Gpu, Result};
use crate::fp8::{Grouping, GROUP};
use crate::{Flow, GemmPrecision, GemmRole};
use std::sync::Arc;

/// A weight `[N, K]` prepared for one step: the copies the flow's GEMM roles read.
/// In the `fp8` flow the 128x128 blocks are quantized once and read by rollout,
/// training forward and (transposed) DGrad alike.
pub struct GpuWeight {
    pub n: usize,
    pub k: usize,
    f32: Option<CudaSlice<f32>>,
    /// BF16 bits `[pad16(N)][pad16(K)]` ...
    bf16: Option<CudaSlice<u16>>,
    /// ... or, instead, its rows of a stacked BF16 weight that the layer holds for
    /// the projections that read the same input (the buffer and the element its
    /// `n k` values start at; [`GpuWeight::prepare_stacked`]): their BF16 DGrad is
    /// one GEMM ([`linear_dgrad_bf16_stacked`]).
    bf16_part: Option<Bf16Part>,
    fp8: Option<Fp8Quantized>,
    /// Blocks of `W^T [K, N]`, when the flow's DGrad is FP8 ...
    fp8_t: Option<Fp8Quantized>,
    /// ... or, instead, its columns of a stacked `W^T` that the layer holds for the
    /// projections that read the same input ([`GpuWeight::prepare_stacked`]): their
    /// DGrad is one GEMM ([`linear_dgrad_fp8_stacked`]).
    t_part: Option<TDest>,
    /// FP8 and BF16 forward GEMMs add each row's products in one order whatever
    /// the number of rows (the split-K decode kernels and `gemm_*_rows`), so
    /// rollout and training logprobs agree bit for bit; off, FP8 batches of more
    /// than 64 rows use cuBLASLt's block-scaled GEMM and BF16 forwards cuBLASLt's
    /// BF16 GEMM (faster, an accumulation order that depends on the batch).
    pub batch_invariant: bool,
}

impl GpuWeight {
    /// The device addresses of its copies and what picks its kernels (a
    /// captured graph reads these: one kept across rollouts is valid while
    /// they are the same, `GpuModel::fingerprint`).
    pub fn fingerprint(&self, gpu: &Gpu, out: &mut Vec<u64>) {
        out.extend([self.n as u64, self.k as u64, self.batch_invariant as u64]);
        out.push(self.f32.as_ref().map_or(0, |b| gpu.ptr(b)));
        out.push(self.bf16_view().map_or(0, |b| b.ptr(gpu)));
        for q in [&self.fp8, &self.fp8_t] {
            match q {
                Some(q) => out.extend([gpu.ptr(&q.codes), gpu.ptr(&q.scales)]),
                None => out.extend([0, 0]),
            }
        }
        out.push(self.t_part.is_some() as u64);
    }

    /// Prepare the device master weight `w [n, k]` for every GEMM role of `flow`.
    pub fn prepare(
        gpu: &Gpu,
        w: &CudaSlice<f32>,
        n: usize,
        k: usize,
        flow: Flow,
    ) -> Result<GpuWeight> {
        check_len("weight", w, n * k, format!("[{n}, {k}]"))?;
        let blocks = fp8_blocks(flow)
            .map(|t| quantize_block128(gpu, w, n, k, t))
            .transpose()?;
        Self::with_blocks(gpu, w, n, k, flow, blocks)
    }

    /// [`GpuWeight::prepare`] of several weights `(w, n, k)` (a model's): the
    /// 128x128 FP8 blocks of all of them in one launch (the same bits).
    pub fn prepare_many(
        gpu: &Gpu,
        ws: &[(&CudaSlice<f32>, usize, usize)],
        flow: Flow,
    ) -> Result<Vec<GpuWeight>> {
        let blocks: Vec<_> = match fp8_blocks(flow) {
            Some(t) => quantize_block128_multi(gpu, ws, t)?
                .into_iter()
                .map(Some)
                .collect(),
            None => ws.iter().map(|_| None).collect(),
        };
        ws.iter()
            .zip(blocks)
            .map(|(&(w, n, k), b)| Self::with_blocks(gpu, w, n, k, flow, b))
            .collect()
    }

    /// [`GpuWeight::prepare_many`] where each group of `groups` (`(first, count)`:
    /// consecutive weights of `ws` that read one input, q/k/v or gate/up) has its
    /// members' DGrad operands side by side in one stacked operand (returned for the
    /// group, None where it is not stacked), for one DGrad GEMM over the group:
    /// - FP8 DGrad: their `W^T` blocks in one stacked `W^T` (every N a multiple of
    ///   128);
    /// - BF16 DGrad: their BF16 copies as the row blocks of one `[sum of n, k]`
    ///   (every N a multiple of 16).
    ///
    /// One K, a multiple of 16. The same values, so the same bits as each member's
    /// own. `JET_DGRAD_STACK=0`: none stacked.
    pub fn prepare_stacked(
        gpu: &Gpu,
        ws: &[(&CudaSlice<f32>, usize, usize)],
        flow: Flow,
        groups: &[(usize, usize)],
    ) -> Result<(Vec<GpuWeight>, Vec<Option<Stacked>>)> {
        let fp8 = fp8_blocks(flow);
        let bf16_dgrad = flow.precision(GemmRole::DGrad) == GemmPrecision::Bf16;
        let own = match fp8 {
            Some(true) => TOut::Own,
            _ => TOut::None,
        };
        let mut ts = vec![own; ws.len()];
        let mut parts16: Vec<Option<Bf16Part>> = vec![None; ws.len()];
        let mut stacks = Vec::with_capacity(groups.len());
        for &(first, count) in groups {
            let members = ws.get(first..first + count).ok_or_else(|| {
                super::CudaError::Invalid(format!(
                    "stacked weights {first}..{} of {}",
                    first + count,
                    ws.len()
                ))
            })?;
            let k = members.first().map_or(0, |m| m.2);
            let one_k = dgrad_stack_on()
                && count > 1
                && k.is_multiple_of(16)
                && members.iter().all(|&(_, _, kk)| kk == k);
            let all_n = |q: usize| members.iter().all(|&(_, n, _)| n.is_multiple_of(q));
            let total: usize = members.iter().map(|m| m.1).sum();
            if one_k && fp8 == Some(true) && all_n(GROUP) {
                let st = stacked_block128_t(gpu, k, total)?;
                let mut n0 = 0;
                for (i, &(_, n, _)) in members.iter().enumerate() {
                    ts[first + i] = TOut::Part(TDest::part(gpu, &st, n0, n, k)?);
                    n0 += n;
                }
                stacks.push(Some(Stacked::Fp8T(st)));
            } else if one_k && bf16_dgrad && all_n(16) {
                let st = Arc::new(gpu.uninit::<u16>(total * k)?);
                let mut n0 = 0;
                for (i, &(_, n, _)) in members.iter().enumerate() {
                    parts16[first + i] = Some((st.clone(), n0 * k));
                    n0 += n;
                }
                stacks.push(Some(Stacked::Bf16(st)));
            } else {
                stacks.push(None);
            }
        }
        let blocks: Vec<_> = match fp8 {
            Some(_) => quantize_block128_multi_to(gpu, ws, &ts)?
                .into_iter()
                .map(Some)
                .collect(),
            None => ws.iter().map(|_| None).collect(),
        };
        let weights = ws
            .iter()
            .zip(blocks)
            .zip(ts.into_iter().zip(parts16))
            .map(|((&(w, n, k), b), (t, part16))| {
                let mut p = Self::with_blocks_at(gpu, (w, n, k), flow, b, part16)?;
                if let TOut::Part(d) = t {
                    p.t_part = Some(d);
                }
                Ok(p)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((weights, stacks))
    }

    /// The weight with its FP8 blocks (and their transposes) made already, and the
    /// f32 or BF16 copies its flow's other roles read.
    fn with_blocks(
        gpu: &Gpu,
        w: &CudaSlice<f32>,
        n: usize,
        k: usize,
        flow: Flow,
        blocks: Option<(Fp8Quantized, Option<Fp8Quantized>)>,
    ) -> Result<GpuWeight> {
        Self::with_blocks_at(gpu, (w, n, k), flow, blocks, None)
    }

    /// [`GpuWeight::with_blocks`] with its BF16 copy written as the rows of a
    /// stacked one from element `off` (`part16`) in place of a buffer of its own.
    fn with_blocks_at(
        gpu: &Gpu,
        (w, n, k): (&CudaSlice<f32>, usize, usize),
        flow: Flow,
        blocks: Option<(Fp8Quantized, Option<Fp8Quantized>)>,
        part16: Option<Bf16Part>,
    ) -> Result<GpuWeight> {
        check_len("weight", w, n * k, format!("[{n}, {k}]"))?;
        let (fp8, fp8_t) = blocks.map_or((None, None), |(q, qt)| (Some(q), qt));
        let mut p = GpuWeight {
            n,
            k,
            f32: None,
            bf16: None,
            bf16_part: None,
            fp8,
            fp8_t,
            t_part: None,
            batch_invariant: true,
        };
        for role in WEIGHT_ROLES {
            match flow.precision(role) {
                GemmPrecision::F32 if p.f32.is_none() => {
                    p.f32 = Some(
                        gpu.stream()
                            .clone_dtod(&w.slice(..n * k))
                            .ctx("copying a weight")?,
                    )
                }
                GemmPrecision::Bf16 if p.bf16_view().is_none() => match &part16 {
                    Some((st, off)) => {
                        let at = Bf16View::part("a stacked BF16 weight", st, *off, n * k)?;
                        to_bf16_into(gpu, w, n, k, at)?;
                        p.bf16_part = part16.clone();
                    }
                    None => p.bf16 = Some(to_bf16_padded(gpu, w, n, k, pad16(n), pad16(k))?),
                },
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

    /// The 128x128 blocks of `W^T`, when the flow's DGrad is FP8.
    pub fn fp8_t(&self) -> Option<&Fp8Quantized> {
        self.fp8_t.as_ref()
    }

    /// The prepared copies an optimizer step can rewrite from the new master
    /// values, when they are all the weight has (no f32 copy): the BF16 copy if its
    /// rows have no padding (k a multiple of 16: its first n k values are the
    /// weight's, row by row; the padding rows after them stay zero;
    /// `adamw::AdamTensor::p_bf16`), and the 128x128 FP8 blocks with their
    /// transposes (`adamw::AdamTensor::blocks`). None when some copy cannot be
    /// rewritten; the weight then has to be prepared again after a step.
    pub fn rewritable_mut(&mut self) -> Option<(Option<Bf16View<'_>>, Option<BlockTargets<'_>>)> {
        let rows_whole = self.k.is_multiple_of(16);
        let has_bf16 = self.bf16.is_some() || self.bf16_part.is_some();
        if self.f32.is_some() || (has_bf16 && !rows_whole) {
            return None;
        }
        if !has_bf16 && self.fp8.is_none() {
            return None;
        }
        let t = match (self.fp8_t.as_mut(), self.t_part) {
            (Some(t), _) => Some(TTarget::Own(t)),
            (None, Some(d)) => Some(TTarget::Part(d)),
            (None, None) => None,
        };
        let blocks = self.fp8.as_mut().map(|w| BlockTargets { w, t });
        let bf16 = bf16_of((&self.bf16, &self.bf16_part), self.n * self.k);
        Some((bf16, blocks))
    }

    /// The BF16 copy `[pad16(n)][pad16(k)]`, when the flow has one: its own, or its
    /// rows of the layer's stacked one (checked when they were made).
    pub fn bf16_view(&self) -> Option<Bf16View<'_>> {
        bf16_of((&self.bf16, &self.bf16_part), self.n * self.k)
    }

    fn missing(&self, prec: GemmPrecision) -> super::CudaError {
        super::CudaError::Invalid(format!(
            "weight [{}, {}] was not prepared for {prec:?}",
            self.n, self.k
        ))
    }
}

/// A weight's rows of a stacked BF16 weight: the buffer and the element its `n k`
/// values start at.
type Bf16Part = (Arc<CudaSlice<u16>>, usize);

/// A weight's BF16 copy from its fields (so [`GpuWeight::rewritable_mut`] can
/// borrow it beside the FP8 blocks): its own buffer, or its `len` values of the
/// stacked one (checked when they were made).
fn bf16_of<'a>(
    (own, part): (&'a Option<CudaSlice<u16>>, &'a Option<Bf16Part>),
    len: usize,
) -> Option<Bf16View<'a>> {
    match (own, part) {
        (Some(b), _) => Some(b.into()),
        (None, Some((st, off))) => Bf16View::part("a stacked BF16 weight", st, *off, len).ok(),
        (None, None) => None,
    }
}

/// One DGrad operand over the projections that read the same input
/// ([`GpuWeight::prepare_stacked`]); the members hold their parts of it.
pub enum Stacked {
    /// Their `W^T` blocks side by side, `[k, sum of n]` (FP8 DGrad).
    Fp8T(Fp8Quantized),
    /// Their BF16 copies as row blocks, `[sum of n][k]` (BF16 DGrad).
    Bf16(Arc<CudaSlice<u16>>),
}

impl Stacked {
    /// The stacked `W^T` blocks, where FP8.
    pub fn fp8_t(&self) -> Option<&Fp8Quantized> {
        match self {
            Stacked::Fp8T(t) => Some(t),
            Stacked::Bf16(_) => None,
        }
    }

    /// The stacked BF16 weights, where BF16.
    pub fn bf16(&self) -> Option<&CudaSlice<u16>> {
        match self {
            Stacked::Bf16(w) => Some(w),
            Stacked::Fp8T(_) => None,
        }
    }
}

/// The GEMM roles that read a prepared weight.
const WEIGHT_ROLES: [GemmRole; 3] = [
    GemmRole::RolloutForward,
    GemmRole::TrainForward,
    GemmRole::DGrad,
];

/// Whether `flow` reads 128x128 FP8 weight blocks in some role, and if so whether
/// their transposes too (FP8 DGrad).
fn fp8_blocks(flow: Flow) -> Option<bool> {
    let fp8 = |r: GemmRole| flow.precision(r) == GemmPrecision::Fp8;
    WEIGHT_ROLES
        .into_iter()
        .any(fp8)
        .then(|| fp8(GemmRole::DGrad))
}

/// Whether FP8 DGrad runs one GEMM over projections that share their input (their
/// `W^T` stacked at preparation, [`GpuWeight::prepare_stacked`]); on unless
/// `JET_DGRAD_STACK=0` (one GEMM a projection, for comparison).
fn dgrad_stack_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::cuda::switch_on("JET_DGRAD_STACK"))
}

/// What an epilogue adds to its result (one f32 add a value, as `tensor::add_into`).
#[derive(Clone, Copy)]
enum Add<'a> {
    Nothing,
    /// `y += result` (WGrad into the step's gradient).
    Into,
    /// `y = res + result` (a residual `[rows, cols]`).
    Res(&'a CudaSlice<f32>),
}

impl Add<'_> {
    /// The epilogue kernels' `add` argument for output `y` (0: nothing).
    fn ptr(self, gpu: &Gpu, y: &CudaSlice<f32>) -> u64 {
        match self {
            Add::Nothing => 0,
            Add::Into => gpu.ptr(y),
            Add::Res(r) => gpu.ptr(r),
        }
    }
}

/// `y [rows, cols] = d (row stride ldd) + bias`, rounded to BF16 unless F32, plus
/// `add`; `d` may hold `splits` slices `sstride` apart (split-K), added in order.
fn epilogue_to(
    gpu: &Gpu,
    d: &CudaSlice<f32>,
    parts: (usize, usize, usize),
    bias: Option<&CudaSlice<f32>>,
    (rows, cols): (usize, usize),
    prec: GemmPrecision,
    (y, add): (&mut CudaSlice<f32>, Add),
) -> Result<()> {
    check_len("linear output", y, rows * cols, format!("[{rows}, {cols}]"))?;
    let out = (gpu.ptr(y), 0, add.ptr(gpu, y));
    epilogue_launch(gpu, d, parts, bias, (rows, cols), prec, out)
}

/// [`epilogue_to`] with no `add`, `y` written as its BF16 values (exact: the low-
/// precision flows round it), where a forward keeps its output in that form.
fn epilogue_to_bf16(
    gpu: &Gpu,
    d: &CudaSlice<f32>,
    parts: (usize, usize, usize),
    bias: Option<&CudaSlice<f32>>,
    (rows, cols): (usize, usize),
    prec: GemmPrecision,
    y16: &CudaSlice<u16>,
) -> Result<()> {
    ensure(prec != GemmPrecision::F32, || {
        "linear epilogue: BF16 output of an f32 GEMM".into()
    })?;
    check_len(
        "linear output (BF16)",
        y16,
        rows * cols,
        format!("[{rows}, {cols}]"),
    )?;
    epilogue_launch(
        gpu,
        d,
        parts,
        bias,
        (rows, cols),
        prec,
        (0, gpu.ptr(y16), 0),
    )
}

/// `linear_epilogue` into f32 `y` or BF16 `y16` (device addresses, the other 0),
/// `add` (0: none).
fn epilogue_launch(
    gpu: &Gpu,
    d: &CudaSlice<f32>,
    (ldd, splits, sstride): (usize, usize, usize),
    bias: Option<&CudaSlice<f32>>,
    (rows, cols): (usize, usize),
    prec: GemmPrecision,
    (y, y16, add): (u64, u64, u64),
) -> Result<()> {
    let n = rows * cols;
    gpu.launch(
        &OPS,
        "linear_epilogue",
        (n.div_ceil(1024) as u32, 1, 1),
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
            Arg::P(add),
            Arg::P(y),
            Arg::P(y16),
        ],
    )
}

fn dense(
    gpu: &Gpu,
    s: &CudaSlice<impl Sized>,
    ty: LtType,
    rows: usize,
    cols: usize,
    ld: usize,
) -> Dense {
    dense_at(gpu.ptr(s), ty, rows, cols, ld)
}

/// A `[rows, cols]` operand at device address `ptr`, row stride `ld`.
fn dense_at(ptr: u64, ty: LtType, rows: usize, cols: usize, ld: usize) -> Dense {
    Dense {
        ptr,
        ty,
        rows,
        cols,
        ld,
    }
}

/// The low-precision copy of one linear input `x [m, k]`, made by the first
/// layer that reads it and reused by the others (q, k and v read one x, gate
/// and up another): a BF16 copy `[m][pad16(k)]` (forward and WGrad), its 1x128
/// E4M3 groups (forward) or its 128x1 groups (WGrad).
#[derive(Default)]
pub struct XOperand {
    shape: Option<(usize, usize)>,
    bf16: Option<CudaSlice<u16>>,
    fp8: Option<Fp8Quantized>,
    fp8_t: Option<Fp8Quantized>,
}

/// A linear layer's input `x [m, k]` as the GEMMs may read it: its f32 values,
/// or none where its operand in the [`XOperand`] is all they read (a BF16-trained
/// forward writes the norms' and SwiGLU's outputs only as their BF16 operands).
#[derive(Clone, Copy)]
pub struct XIn<'a>(Option<&'a CudaSlice<f32>>);

impl<'a> From<&'a CudaSlice<f32>> for XIn<'a> {
    fn from(x: &'a CudaSlice<f32>) -> Self {
        XIn(Some(x))
    }
}

impl<'a> From<Option<&'a CudaSlice<f32>>> for XIn<'a> {
    fn from(x: Option<&'a CudaSlice<f32>>) -> Self {
        XIn(x)
    }
}

impl<'a> XIn<'a> {
    /// The f32 values, which `what` needs.
    fn f32(self, what: &str) -> Result<&'a CudaSlice<f32>> {
        self.0.ok_or_else(|| {
            super::CudaError::Invalid(format!(
                "linear input: {what} needs its f32 values, and only its operand was kept"
            ))
        })
    }

    /// Check the f32 values, where there are some, against `[m, k]`.
    fn check(self, m: usize, k: usize) -> Result<()> {
        match self.0 {
            Some(x) => check_len("linear input", x, m * k, format!("[{m}, {k}]")),
            None => Ok(()),
        }
    }
}

impl XOperand {
    /// Check that this operand belongs to an input of `[m, k]`.
    fn of(&mut self, m: usize, k: usize) -> Result<&mut Self> {
        let had = *self.shape.get_or_insert((m, k));
        ensure(had == (m, k), || {
            format!(
                "a linear input operand of [{}, {}] reused for [{m}, {k}]",
                had.0, had.1
            )
        })?;
        Ok(self)
    }

    fn bf16(&mut self, gpu: &Gpu, x: XIn, m: usize, k: usize) -> Result<&CudaSlice<u16>> {
        match self.bf16 {
            Some(ref b) => Ok(b),
            None => {
                let x = x.f32("its BF16 copy")?;
                Ok(self.bf16.insert(to_bf16_padded(gpu, x, m, k, m, pad16(k))?))
            }
        }
    }

    fn fp8(&mut self, gpu: &Gpu, x: XIn, m: usize, k: usize) -> Result<&Fp8Quantized> {
        match self.fp8 {
            Some(ref q) => Ok(q),
            None => Ok(self
                .fp8
                .insert(quantize_row1x128(gpu, x.f32("its 1x128 groups")?, m, k)?)),
        }
    }

    /// The 128x1 groups (tokens), the WGrad operand.
    fn fp8_t(&mut self, gpu: &Gpu, x: XIn, m: usize, k: usize) -> Result<&Fp8Quantized> {
        match self.fp8_t {
            Some(ref q) => Ok(q),
            None => {
                Ok(self
                    .fp8_t
                    .insert(quantize_col128x1(gpu, x.f32("its 128x1 groups")?, m, k)?))
            }
        }
    }
}

impl XOperand {
    /// Give the operand of an input `[m, k]` its 128x1 groups (WGrad's FP8
    /// operand), made with other inputs' (`quantize_dual_multi`).
    pub fn set_fp8_t(&mut self, m: usize, k: usize, q: Fp8Quantized) -> Result<()> {
        ensure(
            (q.grouping, q.rows, q.cols) == (Grouping::Col128x1, m, k),
            || {
                format!(
                    "a [{}, {}] {:?} operand given as the 128x1 groups of [{m}, {k}]",
                    q.rows, q.cols, q.grouping
                )
            },
        )?;
        self.of(m, k)?.fp8_t = Some(q);
        Ok(())
    }

    /// What the backward can reuse of a forward operand: the BF16 copy (WGrad's
    /// operand in the BF16 flows, the same bits as making it again from the
    /// BF16-valued input) and the 128x1 groups where the producer made them
    /// ([`swiglu_with_dual`]). The 1x128 codes go: WGrad reads 128x1 groups.
    pub fn for_backward(self) -> XOperand {
        XOperand {
            shape: self.shape,
            bf16: self.bf16,
            fp8_t: self.fp8_t,
            ..XOperand::default()
        }
    }

    /// Make both FP8 groupings of `x [m, k]` in one pass (`quantize_dual`: the
    /// same bits as the 1x128 and 128x1 quantizers), where neither is made yet:
    /// a training forward's input that FP8 WGrad reads again (the attention's
    /// output), so the backward does not read its f32 values once more.
    pub fn make_dual(&mut self, gpu: &Gpu, x: &CudaSlice<f32>, m: usize, k: usize) -> Result<()> {
        let xo = self.of(m, k)?;
        if xo.fp8.is_none() && xo.fp8_t.is_none() {
            let (row, col) = quantize_dual(gpu, x, m, k)?;
            (xo.fp8, xo.fp8_t) = (Some(row), Some(col));
        }
        Ok(())
    }

    /// Whether the 128x1 groups (FP8 WGrad's operand) are made already.
    pub fn has_fp8_t(&self) -> bool {
        self.fp8_t.is_some()
    }

    /// The BF16 copy of an input `[m, k]` as `[m, k]` values, where it was made and
    /// has no padding columns (k a multiple of 16): the values the BF16 GEMMs read.
    pub fn bf16_values(&self, m: usize, k: usize) -> Option<&CudaSlice<u16>> {
        match (&self.bf16, self.shape) {
            (Some(b), Some(s)) if s == (m, k) && pad16(k) == k => Some(b),
            _ => None,
        }
    }

    /// The operand of an input `[m, k]` that its producer made (`rmsnorm_operand`,
    /// `swiglu_operand`, the decode attention).
    pub fn fused(m: usize, k: usize, op: FusedOperand) -> XOperand {
        let mut xo = XOperand {
            shape: Some((m, k)),
            ..XOperand::default()
        };
        match op {
            FusedOperand::Fp8(q) => xo.fp8 = Some(q),
            FusedOperand::Bf16(b) => xo.bf16 = Some(b),
        }
        xo
    }
}

/// RMSNorm of `x [m, k]` (weight `w [k]`) and, for GEMMs in `prec`, the operand
/// of its output made by the same kernel (`quantize::rmsnorm_operand`; F32 and
/// rows wider than it takes: `ops::rmsnorm_forward`, no operand yet):
/// `(y [m, k], rstd [m], y's operand)`.
pub fn rmsnorm_with_operand(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    (m, k): (usize, usize),
    eps: f64,
    prec: GemmPrecision,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>, XOperand)> {
    if prec == GemmPrecision::F32 || k > NORM_OPERAND_MAX_DIM {
        let (y, rstd) = rmsnorm_forward(gpu, x, w, m, k, eps)?;
        return Ok((y, rstd, XOperand::default()));
    }
    let (y, rstd, op) = rmsnorm_operand(gpu, x, w, (m, k), eps, prec == GemmPrecision::Fp8)?;
    Ok((y, rstd, XOperand::fused(m, k, op)))
}

/// [`rmsnorm_with_operand`] with the f32 output written only where `keep_f32` or
/// the GEMMs' operand is f32: a pass that reads the output only through its BF16
/// or FP8 operand gets None. BF16's WGrad reads the BF16 copy; FP8's quantizes
/// the output in 128x1 groups, made again from x, w and rstd (`DualIn::Norm`,
/// the same bits), so a caller whose FP8 WGrad cannot do that keeps f32.
#[allow(clippy::type_complexity)]
pub fn rmsnorm_with_operand_opt(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    (m, k): (usize, usize),
    eps: f64,
    prec: GemmPrecision,
    keep_f32: bool,
) -> Result<(Option<CudaSlice<f32>>, CudaSlice<f32>, XOperand)> {
    if keep_f32 || prec == GemmPrecision::F32 || k > NORM_OPERAND_MAX_DIM {
        let (y, rstd, op) = rmsnorm_with_operand(gpu, x, w, (m, k), eps, prec)?;
        return Ok((Some(y), rstd, op));
    }
    let fp8 = prec == GemmPrecision::Fp8;
    let (y, rstd, op) = rmsnorm_operand_opt(gpu, x, w, (m, k), eps, fp8, false)?;
    Ok((y, rstd, XOperand::fused(m, k, op)))
}

/// SwiGLU of `gate`, `up [m, k]` and, for GEMMs in `prec`, the operand of its
/// output made by the same kernel (`quantize::swiglu_operand`; F32:
/// `ops::swiglu_forward`, no operand yet): `(h [m, k], h's operand)`.
/// gate and up may be the BF16 values of [`linear_forward_group_act`] (low
/// precision only).
pub fn swiglu_with_operand<'a>(
    gpu: &Gpu,
    gate: impl Into<ActRef<'a>>,
    up: impl Into<ActRef<'a>>,
    (m, k): (usize, usize),
    prec: GemmPrecision,
) -> Result<(CudaSlice<f32>, XOperand)> {
    let (gate, up) = (gate.into(), up.into());
    if prec == GemmPrecision::F32 {
        let (ActRef::F32(gate), ActRef::F32(up)) = (gate, up) else {
            return Err(super::CudaError::Invalid(
                "swiglu in f32: gate and up must be f32".into(),
            ));
        };
        return Ok((swiglu_forward(gpu, gate, up, m * k)?, XOperand::default()));
    }
    let (h, op) = swiglu_operand(gpu, gate, up, (m, k), prec == GemmPrecision::Fp8)?;
    Ok((h, XOperand::fused(m, k, op)))
}

/// [`swiglu_with_operand`] with `h` written only where `keep_f32` or the down
/// projection's operand is not BF16 (else None), as [`rmsnorm_with_operand_opt`].
pub fn swiglu_with_operand_opt<'a>(
    gpu: &Gpu,
    gate: impl Into<ActRef<'a>>,
    up: impl Into<ActRef<'a>>,
    (m, k): (usize, usize),
    prec: GemmPrecision,
    keep_f32: bool,
) -> Result<(Option<CudaSlice<f32>>, XOperand)> {
    if keep_f32 || prec != GemmPrecision::Bf16 {
        let (h, op) = swiglu_with_operand(gpu, gate, up, (m, k), prec)?;
        return Ok((Some(h), op));
    }
    let (h, op) = swiglu_operand_opt(gpu, gate, up, (m, k), false, false)?;
    Ok((h, XOperand::fused(m, k, op)))
}

/// SwiGLU of `gate`, `up [m, k]` for a training forward whose GEMMs, forward and
/// WGrad, are FP8: both groupings of `h` from one pass (`quantize::swiglu_dual`),
/// the 1x128 operand for the down projection and the 128x1 one for its WGrad (the
/// bits of quantizing [`swiglu_with_operand`]'s `h`), and no f32 `h`.
pub fn swiglu_with_dual<'a>(
    gpu: &Gpu,
    gate: impl Into<ActRef<'a>>,
    up: impl Into<ActRef<'a>>,
    (m, k): (usize, usize),
) -> Result<XOperand> {
    let q = swiglu_dual(gpu, gate, up, (m, k))?;
    Ok(XOperand {
        shape: Some((m, k)),
        fp8: Some(q.row),
        fp8_t: Some(q.col),
        ..XOperand::default()
    })
}

/// The epilogue the FP8 / BF16 rows kernels fuse: `y [m][n]` at device address `y`
/// (BF16 when `bf16`, which needs the rounding and no residual), `bias`, rounding,
/// the residual.
fn fused_epi(
    gpu: &Gpu,
    (y, bf16): (u64, bool),
    n: usize,
    bias: Option<&CudaSlice<f32>>,
    prec: GemmPrecision,
    res: Option<&CudaSlice<f32>>,
) -> Epi {
    Epi {
        y,
        ldy: n,
        bias: bias.map_or(0, |b| gpu.ptr(b)),
        round: prec != GemmPrecision::F32,
        res: res.map_or(0, |r| gpu.ptr(r)),
        bf16,
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
    forward(
        gpu,
        x.into(),
        &mut XOperand::default(),
        m,
        w,
        bias,
        prec,
        None,
    )
}

/// [`linear_forward`] into `y [m, n]` (a buffer that outlives a captured graph:
/// the decode step's logits): the GEMM's epilogue writes `y` itself.
pub fn linear_forward_into(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    m: usize,
    w: &GpuWeight,
    prec: GemmPrecision,
    y: &mut CudaSlice<f32>,
) -> Result<()> {
    let (n, k) = (w.n, w.k);
    check_len("linear input", x, m * k, format!("[{m}, {k}]"))?;
    check_len("linear output", y, m * n, format!("[{m}, {n}]"))?;
    if m == 0 {
        return Ok(());
    }
    forward_into(
        gpu,
        x.into(),
        &mut XOperand::default(),
        m,
        w,
        (None, None),
        prec,
        y,
    )
}

/// [`linear_forward`] with the output kept as its BF16 values where the rows GEMM
/// writes it ([`Act`]; the LM head's logits of a training forward), else f32.
pub fn linear_forward_act(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    m: usize,
    w: &GpuWeight,
    bias: Option<&CudaSlice<f32>>,
    prec: GemmPrecision,
) -> Result<Act> {
    forward_act(gpu, x.into(), &mut XOperand::default(), m, w, bias, prec)
}

/// [`linear_forward`] plus the residual `res [m, n]`, added after the rounding (one
/// f32 add a value, as `tensor::add_into`; fused into the GEMM's epilogue); x's
/// low-precision copy taken from (or left in) `xo` as in [`linear_forward_shared`].
pub fn linear_forward_residual<'a>(
    gpu: &Gpu,
    x: impl Into<XIn<'a>>,
    xo: &mut XOperand,
    m: usize,
    w: &GpuWeight,
    prec: GemmPrecision,
    res: &CudaSlice<f32>,
) -> Result<CudaSlice<f32>> {
    check_len("linear residual", res, m * w.n, format!("[{m}, {}]", w.n))?;
    forward(gpu, x.into(), xo, m, w, None, prec, Some(res))
}

/// [`linear_forward`] taking (or leaving) x's low-precision copy in `xo`, for
/// the other layers that read the same `x`.
pub fn linear_forward_shared<'a>(
    gpu: &Gpu,
    x: impl Into<XIn<'a>>,
    xo: &mut XOperand,
    m: usize,
    w: &GpuWeight,
    bias: Option<&CudaSlice<f32>>,
    prec: GemmPrecision,
) -> Result<CudaSlice<f32>> {
    forward(gpu, x.into(), xo, m, w, bias, prec, None)
}

/// [`forward`] without a residual, its output kept as BF16 values where the rows
/// GEMM or the split-K epilogue writes it (a low-precision batch-invariant weight,
/// [`forward_writes_bf16`]): the same numbers in half the bytes. Elsewhere f32.
fn forward_act(
    gpu: &Gpu,
    x: XIn,
    xo: &mut XOperand,
    m: usize,
    w: &GpuWeight,
    bias: Option<&CudaSlice<f32>>,
    prec: GemmPrecision,
) -> Result<Act> {
    forward_to(gpu, x, xo, m, w, bias, prec, None, true)
}

/// Whether a forward of `m > 0` rows through `w` in `prec` that may write BF16
/// (`forward_act`, no residual) does: the batch-invariant rows kernel writes its
/// BF16 output itself, and so does the split-K path's epilogue (a GRPO
/// micro-batch's k and v at 256 rows, `gemv::split_k_pays`; until the fifty-fifth
/// session it wrote f32, which kept a micro-batch's q and k before their norms in
/// f32); cuBLASLt writes f32. Lets a caller ask for one form for several
/// projections before running them.
/// The grouped split-K launches of `linear_forward_group_act` (a decode step's)
/// still write f32.
pub fn forward_writes_bf16(gpu: &Gpu, m: usize, w: &GpuWeight, prec: GemmPrecision) -> bool {
    prec != GemmPrecision::F32
        && w.batch_invariant
        && (!takes_split_k(gpu, m, w, prec) || split_k_bf16())
}

/// Whether the split-K path of [`forward_act`] writes BF16: on unless
/// `JET_SPLITK_BF16=0` (a measurement switch; the same values either way).
fn split_k_bf16() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::cuda::switch_on("JET_SPLITK_BF16"))
}

/// Whether [`forward`] of `m > 0` rows through `w` takes the split-K path (a
/// decode step's few rows): its output is then `linear_epilogue` of
/// [`split_k_partial`]'s slices, which the fused kernels of `linear::fused`
/// reproduce bit for bit.
fn takes_split_k(gpu: &Gpu, m: usize, w: &GpuWeight, prec: GemmPrecision) -> bool {
    let few = m <= GEMV_MAX_TOKENS;
    match prec {
        GemmPrecision::F32 => false,
        GemmPrecision::Bf16 => w.batch_invariant && (few || split_k_pays(gpu, m, w.n)),
        GemmPrecision::Fp8 => few || (w.batch_invariant && split_k_pays(gpu, m, w.n)),
    }
}

/// The split-K partial sums of `x [m, k]` through `w` in `prec` (BF16 or FP8),
/// x's operand taken from (or left in) `xo`.
fn split_k_partial(
    gpu: &Gpu,
    x: XIn,
    xo: &mut XOperand,
    m: usize,
    w: &GpuWeight,
    prec: GemmPrecision,
) -> Result<Partial> {
    let (n, k) = (w.n, w.k);
    match prec {
        GemmPrecision::Bf16 => {
            let wb = w.bf16_view().ok_or_else(|| w.missing(prec))?;
            let xb = xo.bf16(gpu, x, m, k)?;
            gemv_bf16_partial(gpu, x_rows(xb.into(), m, k), w_rows(wb, n, k))
        }
        GemmPrecision::Fp8 => {
            let wq = w.fp8.as_ref().ok_or_else(|| w.missing(prec))?;
            gemv_fp8_partial(gpu, xo.fp8(gpu, x, m, k)?, wq)
        }
        GemmPrecision::F32 => Err(super::CudaError::Invalid(
            "an f32 linear layer has no split-K path".into(),
        )),
    }
}

/// x's BF16 copy `[m][pad16(k)]` as the BF16 kernels read it.
fn x_rows(v: Bf16View<'_>, m: usize, k: usize) -> Bf16Rows<'_> {
    Bf16Rows {
        v,
        rows: m,
        cols: k,
        rows_pad: m,
        cols_pad: pad16(k),
    }
}

/// A weight's BF16 copy `[pad16(n)][pad16(k)]` as the BF16 kernels read it.
fn w_rows(v: Bf16View<'_>, n: usize, k: usize) -> Bf16Rows<'_> {
    Bf16Rows {
        v,
        rows: n,
        cols: k,
        rows_pad: pad16(n),
        cols_pad: pad16(k),
    }
}

#[allow(clippy::too_many_arguments)]
fn forward(
    gpu: &Gpu,
    x: XIn,
    xo: &mut XOperand,
    m: usize,
    w: &GpuWeight,
    bias: Option<&CudaSlice<f32>>,
    prec: GemmPrecision,
    res: Option<&CudaSlice<f32>>,
) -> Result<CudaSlice<f32>> {
    match forward_to(gpu, x, xo, m, w, bias, prec, res, false)? {
        Act::F32(y) => Ok(y),
        Act::Bf16(_) => Err(super::CudaError::Invalid(
            "linear forward: a BF16 output where f32 was asked for".into(),
        )),
    }
}

/// [`forward`], the output BF16 where `bf16_out` and the rows GEMM or the split-K
/// epilogue writes it without a residual ([`forward_act`]).
#[allow(clippy::too_many_arguments)]
fn forward_to(
    gpu: &Gpu,
    x: XIn,
    xo: &mut XOperand,
    m: usize,
    w: &GpuWeight,
    bias: Option<&CudaSlice<f32>>,
    prec: GemmPrecision,
    res: Option<&CudaSlice<f32>>,
    bf16_out: bool,
) -> Result<Act> {
    let (n, k) = (w.n, w.k);
    x.check(m, k)?;
    let xo = xo.of(m, k)?;
    if let Some(b) = bias {
        check_len("linear bias", b, n, format!("[{n}]"))?;
    }
    if m == 0 {
        return gpu.uninit(0).map(Act::F32);
    }
    if bf16_out && res.is_none() && forward_writes_bf16(gpu, m, w, prec) {
        let rows16 = !takes_split_k(gpu, m, w, prec);
        let y = gpu.uninit::<u16>(m * n)?;
        if rows16 {
            // The rows kernel writes y itself (linear_epilogue fused), as BF16.
            let epi = fused_epi(gpu, (gpu.ptr(&y), true), n, bias, prec, None);
            rows_fused(gpu, x, xo, m, w, prec, epi)?;
        } else {
            // Split-K: its epilogue writes the same values as BF16.
            let p = split_k_partial(gpu, x, xo, m, w, prec)?;
            let parts = (p.ldp, p.splits, p.sstride);
            epilogue_to_bf16(gpu, &p.p, parts, bias, (m, n), prec, &y)?;
        }
        return Ok(Act::Bf16(y));
    }
    let mut y = gpu.uninit::<f32>(m * n)?;
    forward_into(gpu, x, xo, m, w, (bias, res), prec, &mut y)?;
    Ok(Act::F32(y))
}

/// The GEMM of [`forward_to`] for `m > 0` tokens into the f32 `y [m, n]`, chosen by
/// shape and weight: split-K (decode sizes), the batch-invariant rows kernel, or
/// cuBLASLt; each adds the bias and `res` in its epilogue.
#[allow(clippy::too_many_arguments)]
fn forward_into(
    gpu: &Gpu,
    x: XIn,
    xo: &mut XOperand,
    m: usize,
    w: &GpuWeight,
    (bias, res): (Option<&CudaSlice<f32>>, Option<&CudaSlice<f32>>),
    prec: GemmPrecision,
    y: &mut CudaSlice<f32>,
) -> Result<()> {
    let (n, k) = (w.n, w.k);
    let add = res.map_or(Add::Nothing, Add::Res);
    if takes_split_k(gpu, m, w, prec) {
        let p = split_k_partial(gpu, x, xo, m, w, prec)?;
        let parts = (p.ldp, p.splits, p.sstride);
        return epilogue_to(gpu, &p.p, parts, bias, (m, n), prec, (y, add));
    }
    if prec != GemmPrecision::F32 && w.batch_invariant {
        // The rows kernel writes y itself (linear_epilogue fused).
        let epi = fused_epi(gpu, (gpu.ptr(y), false), n, bias, prec, res);
        return rows_fused(gpu, x, xo, m, w, prec, epi);
    }
    let (np, kp) = (pad16(n), pad16(k));
    let (d, ldd) = match prec {
        GemmPrecision::F32 => {
            let wf = w.f32.as_ref().ok_or_else(|| w.missing(prec))?;
            let d = gpu.uninit::<f32>(m * np)?;
            let (a, b) = (
                dense(gpu, x.f32("an f32 GEMM")?, LtType::F32, m, k, k),
                dense(gpu, wf, LtType::F32, n, k, k),
            );
            dense_gemm(gpu, a, false, b, true, gpu.ptr(&d), np)?;
            (d, np)
        }
        GemmPrecision::Bf16 => {
            let wb = w.bf16_view().ok_or_else(|| w.missing(prec))?;
            let xb = xo.bf16(gpu, x, m, k)?;
            let d = gpu.uninit::<f32>(m * np)?;
            let (a, b) = (
                dense(gpu, xb, LtType::Bf16, m, k, kp),
                dense_at(wb.ptr(gpu), LtType::Bf16, n, k, kp),
            );
            dense_gemm(gpu, a, false, b, true, gpu.ptr(&d), np)?;
            (d, np)
        }
        GemmPrecision::Fp8 => {
            let wq = w.fp8.as_ref().ok_or_else(|| w.missing(prec))?;
            fp8_gemm_nt(gpu, xo.fp8(gpu, x, m, k)?, wq)?
        }
    };
    epilogue_to(gpu, &d, (ldd, 1, 0), bias, (m, n), prec, (y, add))
}

/// The batch-invariant rows GEMM of `x [m, k]` through `w` (BF16 or FP8) with the
/// linear epilogue fused (`epi`).
fn rows_fused(
    gpu: &Gpu,
    x: XIn,
    xo: &mut XOperand,
    m: usize,
    w: &GpuWeight,
    prec: GemmPrecision,
    epi: Epi,
) -> Result<()> {
    let (n, k) = (w.n, w.k);
    match prec {
        GemmPrecision::Bf16 => {
            let wb = w.bf16_view().ok_or_else(|| w.missing(prec))?;
            let xb = xo.bf16(gpu, x, m, k)?;
            gemm_bf16_rows_fused(gpu, x_rows(xb.into(), m, k), w_rows(wb, n, k), epi)
        }
        GemmPrecision::Fp8 => {
            let wq = w.fp8.as_ref().ok_or_else(|| w.missing(prec))?;
            gemm_fp8_rows_fused(gpu, xo.fp8(gpu, x, m, k)?, wq, epi)
        }
        GemmPrecision::F32 => Err(super::CudaError::Invalid(
            "an f32 linear layer has no rows GEMM".into(),
        )),
    }
}

/// A linear layer's upstream gradient dy `[m, n]`: f32, or already the operands
/// its GEMMs read, made by the op that produced dy, so no f32 dy is written and
/// copied: (BF16 DGrad and WGrad only) its BF16 operand `[m][pad16(n)]` with
/// `to_bf16_padded`'s bits (`ops::swiglu_backward_bf16`), or (FP8 DGrad and WGrad
/// only) its 1x128 and 128x1 operands with `quantize_dual`'s bits
/// (`quantize::swiglu_backward_fp8`).
#[derive(Clone, Copy)]
pub enum Dy<'a> {
    F32(&'a CudaSlice<f32>),
    Bf16(&'a CudaSlice<u16>),
    Fp8(&'a DualFp8),
}

impl<'a> Dy<'a> {
    /// The f32 gradient, for a GEMM (of precision `prec`) that reads it in f32 or
    /// quantizes it, or for the bias gradient's column sums.
    pub fn f32(self, prec: GemmPrecision) -> Result<&'a CudaSlice<f32>> {
        match self {
            Dy::F32(d) => Ok(d),
            Dy::Bf16(_) => Err(super::CudaError::Invalid(format!(
                "linear backward: a BF16 dy given to a {prec:?} GEMM (BF16 DGrad and WGrad only)"
            ))),
            Dy::Fp8(_) => Err(super::CudaError::Invalid(format!(
                "linear backward: an FP8 dy given to a {prec:?} GEMM (FP8 DGrad and WGrad only)"
            ))),
        }
    }
}

/// dy's BF16 operand `[m][pad16(n)]`: the one given, or the copy in `own`, made
/// on first use.
fn dy_bf16<'b>(
    gpu: &Gpu,
    dy: Dy<'b>,
    own: &'b mut Option<CudaSlice<u16>>,
    (m, n): (usize, usize),
) -> Result<&'b CudaSlice<u16>> {
    match (dy, own) {
        (Dy::Bf16(b), _) => Ok(b),
        (Dy::F32(_), Some(b)) => Ok(b),
        (Dy::F32(d), own @ None) => Ok(own.insert(to_bf16_padded(gpu, d, m, n, m, pad16(n))?)),
        (Dy::Fp8(_), _) => Err(super::CudaError::Invalid(
            "linear backward: an FP8 dy given to a BF16 GEMM (FP8 DGrad and WGrad only)".into(),
        )),
    }
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
    let mut dw = gpu.uninit::<f32>(w.n * w.k)?;
    let mut dx = gpu.uninit::<f32>(m * w.k)?;
    let dxo = Some(&mut dx);
    let xin = &mut XOperand::default();
    backward_to(
        gpu,
        (Dy::F32(dy), x.into(), m),
        w,
        (dgrad, wgrad),
        DwTo::Write(&mut dw),
        dxo,
        xin,
    )?;
    let db = match has_bias {
        true => Some(linear_bias_grad(gpu, dy, m, w.n, wgrad)?),
        false => None,
    };
    Ok(GpuLinearGrads { dx, dw, db })
}

/// [`linear_backward`] adding dW (rounded as there) into the gradient `dw_acc [n, k]`
/// (as `tensor::add_into` would; a BF16 dW without padding columns is held as the
/// gradient's addend, [`GradAcc::add_bf16`]); the bias gradient,
/// if any, is [`linear_bias_grad`]'s. `xin` holds x's WGrad operand for the
/// projections that share x (a fresh one for each x). Returns dx `[m, k]`.
pub fn linear_backward_into(
    gpu: &Gpu,
    (dy, x, m): (Dy, XIn, usize),
    w: &GpuWeight,
    (dgrad, wgrad): (GemmPrecision, GemmPrecision),
    dw_acc: &mut GradAcc,
    xin: &mut XOperand,
) -> Result<CudaSlice<f32>> {
    let mut dx = gpu.uninit::<f32>(m * w.k)?;
    backward_to(
        gpu,
        (dy, x, m),
        w,
        (dgrad, wgrad),
        DwTo::Acc(dw_acc),
        Some(&mut dx),
        xin,
    )?;
    Ok(dx)
}

/// [`linear_backward_into`] with DGrad's output returned as the GEMM wrote it
/// (`[m][ld]`, no epilogue): for a consumer that reads it directly (swiglu's
/// backward reads the down projection's BF16 dx).
pub fn linear_backward_raw(
    gpu: &Gpu,
    (dy, x, m): (Dy, XIn, usize),
    w: &GpuWeight,
    (dgrad, wgrad): (GemmPrecision, GemmPrecision),
    dw_acc: &mut GradAcc,
    xin: &mut XOperand,
) -> Result<GemmOut> {
    let precs = (dgrad, wgrad);
    backward_to(gpu, (dy, x, m), w, precs, DwTo::Acc(dw_acc), None, xin)?
        .ok_or_else(|| super::CudaError::Invalid("linear backward: no DGrad output".into()))
}

/// The bias gradient `[n]` of a linear layer: dy's column sums (rounded to
/// BF16 values unless `wgrad` is F32).
pub fn linear_bias_grad(
    gpu: &Gpu,
    dy: &CudaSlice<f32>,
    m: usize,
    n: usize,
    wgrad: GemmPrecision,
) -> Result<CudaSlice<f32>> {
    super::ops::column_sums(gpu, dy, m, n, wgrad != GemmPrecision::F32)
}

/// [`linear_bias_grad`] added into `db [n]` (`db += ..`, as `tensor::add_into`).
pub fn linear_bias_grad_acc(
    gpu: &Gpu,
    dy: &CudaSlice<f32>,
    (m, n): (usize, usize),
    wgrad: GemmPrecision,
    db: &mut CudaSlice<f32>,
) -> Result<()> {
    super::ops::column_sums_acc(gpu, dy, (m, n), wgrad != GemmPrecision::F32, db)
}

/// Where WGrad's dW goes: written into an f32 buffer, or added into a gradient.
enum DwTo<'a> {
    Write(&'a mut CudaSlice<f32>),
    Acc(&'a mut GradAcc),
}

/// DGrad (written into `dx`, or returned as the GEMM wrote it when `dx` is None)
/// and WGrad (into `dw`).
fn backward_to(
    gpu: &Gpu,
    (dy, x, m): (Dy, XIn, usize),
    w: &GpuWeight,
    (dgrad, wgrad): (GemmPrecision, GemmPrecision),
    dw: DwTo,
    dx: Option<&mut CudaSlice<f32>>,
    xin: &mut XOperand,
) -> Result<Option<GemmOut>> {
    let (n, k) = (w.n, w.k);
    let (np, kp, mp) = (pad16(n), pad16(k), pad16(m));
    match dy {
        Dy::F32(d) => check_len("linear dy", d, m * n, format!("[{m}, {n}]"))?,
        Dy::Bf16(d) => check_len("linear dy (BF16)", d, m * np, format!("[{m}][{np}]"))?,
        Dy::Fp8(q) => {
            for (what, o) in [("1x128", &q.row), ("128x1", &q.col)] {
                ensure((o.rows, o.cols) == (m, n), || {
                    format!(
                        "linear dy ({what} FP8): [{}, {}], expected [{m}, {n}]",
                        o.rows, o.cols
                    )
                })?;
            }
        }
    }
    x.check(m, k)?;
    ensure(m > 0, || "linear backward of 0 rows".into())?;
    // dy's BF16 copy (given, or made with DGrad's operand when WGrad reads it
    // too), or its 128x1 codes, made with DGrad's.
    let mut dyb: Option<CudaSlice<u16>> = None;
    let mut qdy_t: Option<Fp8Quantized> = None;
    let own_row;
    // DGrad: dx [m, k] = dy [m, n] w [n, k]. The low-precision GEMMs write BF16
    // (the gradients' precision, rounded by cuBLASLt), half the bytes of f32.
    let d = match dgrad {
        GemmPrecision::F32 => {
            let wf = w.f32.as_ref().ok_or_else(|| w.missing(dgrad))?;
            let dy = dy.f32(dgrad)?;
            let d = gpu.uninit::<f32>(m * kp)?;
            let (a, b) = (
                dense(gpu, dy, LtType::F32, m, n, n),
                dense(gpu, wf, LtType::F32, n, k, k),
            );
            dense_gemm(gpu, a, false, b, false, gpu.ptr(&d), kp)?;
            GemmOut::F32(d, kp)
        }
        GemmPrecision::Bf16 => {
            let wb = w.bf16_view().ok_or_else(|| w.missing(dgrad))?;
            let dyb = dy_bf16(gpu, dy, &mut dyb, (m, n))?;
            let d = gpu.uninit::<u16>(m * kp)?;
            let (a, b) = (
                dense(gpu, dyb, LtType::Bf16, m, n, np),
                dense_at(wb.ptr(gpu), LtType::Bf16, n, k, kp),
            );
            dense_gemm_to(gpu, (a, false), (b, false), (gpu.ptr(&d), kp, LtType::Bf16))?;
            GemmOut::Bf16(d, kp)
        }
        GemmPrecision::Fp8 => {
            let qdy = match (dy, wgrad) {
                (Dy::Fp8(q), _) => &q.row,
                (dy, GemmPrecision::Fp8) => {
                    let (row, col) = quantize_dual(gpu, dy.f32(dgrad)?, m, n)?;
                    qdy_t = Some(col);
                    own_row = row;
                    &own_row
                }
                (dy, _) => {
                    own_row = quantize_row1x128(gpu, dy.f32(dgrad)?, m, n)?;
                    &own_row
                }
            };
            linear_dgrad_fp8_raw(gpu, qdy, w, m)?
        }
    };
    // DGrad's output into dx, or returned as written.
    let raw = match dx {
        Some(dx) => {
            d.epilogue(gpu, (m, k), dgrad, (dx, Add::Nothing))?;
            None
        }
        None => Some(d),
    };
    // WGrad: dw [n, k] = dy [m, n]^T x [m, k]
    let d = match wgrad {
        GemmPrecision::F32 => {
            let dy = dy.f32(wgrad)?;
            let d = gpu.uninit::<f32>(n * kp)?;
            let (a, b) = (
                dense(gpu, dy, LtType::F32, m, n, n),
                dense(gpu, x.f32("an f32 WGrad")?, LtType::F32, m, k, k),
            );
            dense_gemm(gpu, a, true, b, false, gpu.ptr(&d), kp)?;
            GemmOut::F32(d, kp)
        }
        GemmPrecision::Bf16 => {
            let dyb = dy_bf16(gpu, dy, &mut dyb, (m, n))?;
            let xb = xin.of(m, k)?.bf16(gpu, x, m, k)?;
            let d = gpu.uninit::<u16>(n * kp)?;
            let (a, b) = (
                dense(gpu, dyb, LtType::Bf16, m, n, np),
                dense(gpu, xb, LtType::Bf16, m, k, kp),
            );
            dense_gemm_to(gpu, (a, true), (b, false), (gpu.ptr(&d), kp, LtType::Bf16))?;
            GemmOut::Bf16(d, kp)
        }
        GemmPrecision::Fp8 => {
            let own_t;
            let qdy = match (dy, &qdy_t) {
                (Dy::Fp8(q), _) => &q.col,
                (_, Some(q)) => q,
                (dy, None) => {
                    own_t = quantize_col128x1(gpu, dy.f32(wgrad)?, m, n)?;
                    &own_t
                }
            };
            let qx = xin.of(m, k)?.fp8_t(gpu, x, m, k)?;
            debug_assert_eq!(qdy.rows_pad, mp);
            let (d, ld) = fp8_gemm_nt_bf16(gpu, qdy, qx)?;
            GemmOut::Bf16(d, ld)
        }
    };
    match (dw, d) {
        (DwTo::Write(dw), d) => d.epilogue(gpu, (n, k), wgrad, (dw, Add::Nothing))?,
        // The gradient's readers add it (the epilogue's values, where they load them).
        (DwTo::Acc(g), GemmOut::Bf16(d, ld)) if ld == k => g.add_bf16(gpu, d)?,
        (DwTo::Acc(g), d) => d.epilogue(gpu, (n, k), wgrad, (g.f32_mut(gpu)?, Add::Into))?,
    }
    Ok(raw)
}

/// FP8 DGrad alone, `dx [m, k] = dy [m, n] w [n, k]` from dy's 1x128 operand,
/// returned as the GEMM wrote it (BF16, as [`linear_backward_raw`]'s): for the
/// projections whose WGrad is one GEMM over all of them ([`wgrad_fp8_stacked`]).
pub fn linear_dgrad_fp8_raw(
    gpu: &Gpu,
    dy: &Fp8Quantized,
    w: &GpuWeight,
    m: usize,
) -> Result<GemmOut> {
    ensure(
        dy.grouping == Grouping::Row1x128 && (dy.rows, dy.cols) == (m, w.n),
        || {
            format!(
                "linear dy (1x128 FP8, {:?}): [{}, {}], expected [{m}, {}]",
                dy.grouping, dy.rows, dy.cols, w.n
            )
        },
    )?;
    let wt = w
        .fp8_t
        .as_ref()
        .ok_or_else(|| w.missing(GemmPrecision::Fp8))?;
    let (d, ld) = fp8_gemm_nt_bf16(gpu, dy, wt)?;
    Ok(GemmOut::Bf16(d, ld))
}

/// One FP8 DGrad for the projections that read one `x [m, k]` (q, k, v; gate,
/// up), `dx [m, k] = dy [m, sum of n] W^T_stacked`: dy their stacked 1x128 operand
/// ([`super::quantize::quantize_dual_stacked`],
/// [`super::quantize::swiglu_backward_fp8_stacked`] with `stack_rows`), the
/// weights' stacked `W^T` blocks ([`GpuWeight::prepare_stacked`]). The sum of the
/// projections' dx comes out of the GEMM (no per-projection outputs to add), as the
/// GEMM wrote it (BF16). At 0.6B's 4,096 rows a layer's five FP8 DGrads take 142 us
/// alone and the two stacked ones 122 (`cuda_timing backward_gemm_timing`, H100).
pub fn linear_dgrad_fp8_stacked(
    gpu: &Gpu,
    dy: &Fp8Quantized,
    wt: &Fp8Quantized,
    m: usize,
) -> Result<GemmOut> {
    ensure(
        dy.grouping == Grouping::Row1x128
            && wt.grouping == Grouping::Block128
            && (dy.rows, dy.cols) == (m, wt.cols),
        || {
            format!(
                "stacked DGrad: dy ({:?}) [{}, {}] against W^T ({:?}) [{}, {}] for {m} rows",
                dy.grouping, dy.rows, dy.cols, wt.grouping, wt.rows, wt.cols
            )
        },
    )?;
    let (d, ld) = fp8_gemm_nt_bf16(gpu, dy, wt)?;
    Ok(GemmOut::Bf16(d, ld))
}

/// One FP8 WGrad for the projections that read one `x [m, k]` (q, k, v; gate, up):
/// `dw [sum of n, k] = dy^T x`, dy their stacked 128x1 operand `[m, sum of n]`
/// ([`super::quantize::quantize_dual_stacked`],
/// [`super::quantize::swiglu_backward_fp8_stacked`]). At 0.6B's 4,096 rows a
/// layer's five WGrads take 179 us alone and the two stacked ones 157 (the block
/// tiles of a small N fill the GPU poorly; `cuda_timing backward_gemm_timing`,
/// H100). Returns the BF16 output `[sum of n][k]`: row block i is projection i's
/// dW, for its gradient to hold ([`GradAcc::add_bf16_part`]). `k` must be a
/// multiple of 16 (no padding columns in the output).
pub fn wgrad_fp8_stacked(
    gpu: &Gpu,
    dy: &Fp8Quantized,
    (x, m, k): (XIn, usize, usize),
    xin: &mut XOperand,
) -> Result<Arc<CudaSlice<u16>>> {
    ensure(
        dy.grouping == Grouping::Col128x1 && dy.rows == m && k.is_multiple_of(16) && k > 0,
        || {
            format!(
                "stacked WGrad: dy ({:?}) [{}, {}] and x [{m}, {k}]: need 128x1 dy of {m} rows, k a multiple of 16",
                dy.grouping, dy.rows, dy.cols
            )
        },
    )?;
    x.check(m, k)?;
    let qx = xin.of(m, k)?.fp8_t(gpu, x, m, k)?;
    let (d, ld) = fp8_gemm_nt_bf16(gpu, dy, qx)?;
    ensure(ld == k, || {
        format!("stacked WGrad: output row stride {ld}, expected {k}")
    })?;
    Ok(Arc::new(d))
}

/// A backward GEMM's output as the GEMM wrote it, with its row stride: f32 (the
/// f32 flow) or BF16 (cuBLASLt's rounding of its f32 accumulation: the values
/// the epilogue would write).
pub enum GemmOut {
    F32(CudaSlice<f32>, usize),
    Bf16(CudaSlice<u16>, usize),
}

impl GemmOut {
    /// The `[rows, cols]` result in a new f32 buffer (the epilogue a consumer that
    /// reads the raw output would have fused).
    pub fn finish(
        &self,
        gpu: &Gpu,
        (rows, cols): (usize, usize),
        prec: GemmPrecision,
    ) -> Result<CudaSlice<f32>> {
        let mut y = gpu.uninit::<f32>(rows * cols)?;
        self.epilogue(gpu, (rows, cols), prec, (&mut y, Add::Nothing))?;
        Ok(y)
    }

    /// The outputs' `[rows, cols]` results summed into a new f32 buffer, in order
    /// (the first written, each next one added, as the DGrad epilogues of the
    /// projections that share an input add them).
    pub fn finish_sum(
        outs: &[&GemmOut],
        gpu: &Gpu,
        shape: (usize, usize),
        prec: GemmPrecision,
    ) -> Result<CudaSlice<f32>> {
        let (first, rest) = outs
            .split_first()
            .ok_or_else(|| super::CudaError::Invalid("a sum of no linear outputs".into()))?;
        let mut y = first.finish(gpu, shape, prec)?;
        for o in rest {
            o.epilogue(gpu, shape, prec, (&mut y, Add::Into))?;
        }
        Ok(y)
    }

    /// The BF16 values `[rows][cols]` when this is a BF16 output without padding
    /// columns (row stride `cols`): what a consumer can read in place of the f32
    /// result (each value's f32 is the one the epilogue writes).
    pub fn bf16_rows(&self, cols: usize) -> Option<&CudaSlice<u16>> {
        match self {
            GemmOut::Bf16(d, ld) if *ld == cols => Some(d),
            _ => None,
        }
    }

    /// Write (or add, with `Add::Into`) the `[rows, cols]` result into `y`.
    fn epilogue(
        &self,
        gpu: &Gpu,
        (rows, cols): (usize, usize),
        prec: GemmPrecision,
        (y, add): (&mut CudaSlice<f32>, Add),
    ) -> Result<()> {
        let (d, ldd) = match self {
            GemmOut::F32(d, ldd) => {
                return epilogue_to(gpu, d, (*ldd, 1, 0), None, (rows, cols), prec, (y, add))
            }
            GemmOut::Bf16(d, ldd) => (d, *ldd),
        };
        let n = rows * cols;
        check_len("linear output", y, n, format!("[{rows}, {cols}]"))?;
        let add = add.ptr(gpu, y);
        gpu.launch(
            &OPS,
            "linear_epilogue_bf16",
            (n.div_ceil(1024) as u32, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::P(gpu.ptr(d)),
                Arg::L(ldd as i64),
                Arg::I(rows as i32),
                Arg::I(cols as i32),
                Arg::P(add),
                Arg::P(gpu.ptr(y)),
            ],
        )
    }
}
