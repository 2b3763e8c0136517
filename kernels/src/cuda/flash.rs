//! Causal GQA attention on tensor cores (`flash.cu`, FlashAttention-2 style) for
//! the BF16 and FP8 flows: the training forward over packed sequences, its
//! backward, and the decode step against a KV cache. The f32 flow keeps the
//! exact per-row kernels of [`super::attention`].
//!
//! Same function as `ops::attention` (the CPU reference), with q, k, v, dout and
//! the probabilities rounded to BF16 at the tensor-core products (f32
//! accumulation, f32 softmax): parity with the reference is that of BF16 operands.
//! A decode row equals the training forward's row at the same position bit for
//! bit (see the header of `flash.cu`), so rollout and training agree exactly when
//! their q, k, v do. No atomics: results are identical run to run.
//!
//! Packed batch: sequence s occupies rows `start_s .. start_s + len_s` of q, out
//! `[rows, nh*hd]` and k, v `[rows, nkv*hd]`; `lse [rows, nh]` is each row's
//! log2-sum-exp of the scaled scores, kept for the backward with the BF16
//! operand copies of q, k, v ([`FlashSaved`]).
//!
//! The backward runs on warpgroup MMA (`flash_wg.cu`) where the GPU has it
//! ([`BwdKernel`]), on mma.sync elsewhere: the same sums in the same order.
//!
//! The training kernels read BF16 copies (one conversion pass each, then 16-byte
//! asynchronous copies into double-buffered shared-memory tiles); decode stages
//! the f32 cache rows itself with the same rounding.

use cudarc::driver::CudaSlice;

use super::act::ActRef;
use super::context::{Arg, FLASH, FLASH_WG};
use super::gemv::CStruct;
use super::linear::QkvPartials;
use super::quantize::FusedOperand;
use super::{check_len, ensure, pad16, Gpu, Result};
use crate::ops::attention::AttnShape;

/// Query rows of a forward tile and keys of a key tile (`FA_BR`, `FA_BC`).
const TILE: usize = 64;
/// Query rows of one step of the dK/dV kernel (`FA_BQ`).
const BWD_Q_STEP: usize = 32;

/// Whether the tensor-core kernels take this shape: head_dim 64 or 128, and at
/// most 16 query heads per kv head (decode puts a group's heads in one warp tile).
pub fn flash_supported(shape: AttnShape) -> bool {
    matches!(shape.head_dim, 64 | 128)
        && shape.n_kv_heads > 0
        && shape.n_heads.is_multiple_of(shape.n_kv_heads)
        && shape.n_heads / shape.n_kv_heads <= 16
}

/// The 64-row tiles of a packed batch on the device, built once per batch and
/// shared by every layer's forward and backward.
pub struct FlashPlan {
    /// `[tiles, 3]` (first row of the sequence, first position of the tile,
    /// length), most work first for the kernels' one-dimensional grids of (tile,
    /// head) pairs: under causal masking a tile's work ranges from 1 to L / 64 key
    /// tiles, and the largest started last would set the end of a launch. `tiles_q`
    /// (query tiles: the forward, dQ) by position, last first; `tiles_kv` (key tiles:
    /// dK, dV) by keys to the sequence's end, most first. Ties keep sequence order.
    tiles_q: CudaSlice<i32>,
    tiles_kv: CudaSlice<i32>,
    n_tiles: usize,
    rows: usize,
}

/// The 64-row tiles of sequences packed in `seq_lens` order, `[tiles, 3]` each
/// (first row of the sequence, first position of the tile, length) in the two
/// most-work-first orders of [`FlashPlan`]: `(tiles_q, tiles_kv, rows)`.
fn tile_orders(seq_lens: &[usize]) -> Result<(Vec<i32>, Vec<i32>, usize)> {
    let mut t = Vec::new();
    let mut start = 0usize;
    for &len in seq_lens {
        ensure(len <= i32::MAX as usize / 2, || {
            format!("attention: a sequence of {len} rows is too long")
        })?;
        for p0 in (0..len).step_by(TILE) {
            t.push([start as i32, p0 as i32, len as i32]);
        }
        start += len;
        ensure(start <= i32::MAX as usize, || {
            format!("attention: a packed batch of {start} rows is too long")
        })?;
    }
    // Stable sorts: ties keep sequence order.
    let by = |key: fn(&[i32; 3]) -> i32| -> Vec<i32> {
        let mut v = t.clone();
        v.sort_by_key(|c| std::cmp::Reverse(key(c)));
        v.concat()
    };
    Ok((by(|c| c[1]), by(|c| c[2] - c[1]), start))
}

impl FlashPlan {
    pub fn new(gpu: &Gpu, seq_lens: &[usize]) -> Result<FlashPlan> {
        let (q, kv, rows) = tile_orders(seq_lens)?;
        Ok(FlashPlan {
            n_tiles: q.len() / 3,
            rows,
            tiles_kv: gpu.upload(&kv)?,
            tiles_q: gpu.upload(&q)?,
        })
    }

    /// The one-dimensional grid of (tile, head) pairs over `heads` heads.
    fn grid(&self, heads: usize) -> Result<(u32, u32, u32)> {
        let n = u32::try_from(self.n_tiles * heads).map_err(|_| {
            super::CudaError::Invalid(format!(
                "attention: {} tiles x {heads} heads is too many blocks",
                self.n_tiles
            ))
        })?;
        Ok((n, 1, 1))
    }

    /// Rows of the packed batch.
    pub fn rows(&self) -> usize {
        self.rows
    }
}

/// What the backward needs from the forward besides its output.
pub struct FlashSaved {
    /// `[rows, nh]`, log2 domain of the scaled scores.
    pub lse: CudaSlice<f32>,
    /// BF16 copies of q, k, v (the forward's tensor-core operands).
    pub q16: CudaSlice<u16>,
    pub k16: CudaSlice<u16>,
    pub v16: CudaSlice<u16>,
}

/// Which build of the forward kernel: all registers it wants (2 CTAs an SM at
/// head_dim 128), or capped for 3 CTAs an SM (a few spills). `jetd bench` times both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FwdKernel {
    Regs,
    Occupancy3,
}

/// Which build of the backward: mma.sync (`flash.cu`, every GPU) or warpgroup MMA
/// (`flash_wg.cu`, sm_90a: the default where [`Gpu::wgmma`] holds). Same
/// algorithm and order of sums; the gradients agree to f32 rounding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BwdKernel {
    MmaSync,
    Wgmma,
}

impl BwdKernel {
    /// The build `flash_backward` uses on `gpu`.
    pub fn default_for(gpu: &Gpu) -> BwdKernel {
        match gpu.wgmma() {
            true => BwdKernel::Wgmma,
            false => BwdKernel::MmaSync,
        }
    }
}

/// Dynamic shared memory of the wgmma backward kernels (`flash_wg.cu`): six
/// swizzled 64-row tiles, the lse and delta of two steps, 1024 for the alignment.
fn wg_smem_bytes(hd: usize) -> u32 {
    (6 * TILE * 2 * hd + 4 * TILE * 4 + 1024) as u32
}

fn kernel(kind: &str, hd: usize) -> Result<&'static str> {
    Ok(match (kind, hd) {
        ("fwd", 64) => "fa_fwd_64",
        ("fwd", 128) => "fa_fwd_128",
        ("fwd3", 64) => "fa_fwd_occ3_64",
        ("fwd3", 128) => "fa_fwd_occ3_128",
        ("dec2", 64) => "fa_dec2_64",
        ("dec2", 128) => "fa_dec2_128",
        ("dec2_qkv", 64) => "fa_dec2_qkv_64",
        ("dec2_qkv", 128) => "fa_dec2_qkv_128",
        ("kv", 64) => "fa_bwd_kv_64",
        ("kv", 128) => "fa_bwd_kv_128",
        ("q", 64) => "fa_bwd_q_64",
        ("q", 128) => "fa_bwd_q_128",
        ("kv_wg", 64) => "fa_bwd_kv_wg_64",
        ("kv_wg", 128) => "fa_bwd_kv_wg_128",
        ("q_wg", 64) => "fa_bwd_q_wg_64",
        ("q_wg", 128) => "fa_bwd_q_wg_128",
        _ => {
            return Err(super::CudaError::Invalid(format!(
                "tensor-core attention: head_dim {hd} (only 64 and 128)"
            )))
        }
    })
}

fn check(shape: AttnShape) -> Result<()> {
    ensure(flash_supported(shape), || {
        format!(
            "tensor-core attention: {} query heads over {} kv heads of {} (needs head_dim 64 or 128, at most 16 heads a group)",
            shape.n_heads, shape.n_kv_heads, shape.head_dim
        )
    })
}

/// Staged tiles in shared memory: `n` tiles of 64 rows of head_dim + 8 BF16 values.
fn tile_bytes(hd: usize, rows: usize) -> u32 {
    (rows * (hd + 8) * 2) as u32
}

/// Scale of the scores and the same in the log2 domain.
fn scales(hd: usize) -> (f32, f32) {
    let s = 1.0 / (hd as f64).sqrt();
    (s as f32, (s * std::f64::consts::LOG2_E) as f32)
}

fn check_rows(what: &str, b: &CudaSlice<f32>, rows: usize, width: usize) -> Result<()> {
    check_len(
        &format!("attention {what}"),
        b,
        rows * width,
        format!("[{rows}, {width}]"),
    )
}

/// BF16 (RNE) copies of the first `n` values of each `x` (`n` multiples of 4): q,
/// k and v in one launch (`fa_to_bf16_x3`).
fn to_bf16_x3(gpu: &Gpu, xs: [(&CudaSlice<f32>, usize); 3]) -> Result<[CudaSlice<u16>; 3]> {
    let [a, b, c]: [_; 3] = to_bf16_n(gpu, &xs)?
        .try_into()
        .map_err(|_| super::CudaError::Invalid("q, k, v: three copies expected".into()))?;
    Ok([a, b, c])
}

/// `fa_to_bf16_x3` over one to three tensors (blockIdx.y picks one; the table's
/// unused entries are never read).
fn to_bf16_n(gpu: &Gpu, xs: &[(&CudaSlice<f32>, usize)]) -> Result<Vec<CudaSlice<u16>>> {
    ensure((1..=3).contains(&xs.len()), || {
        format!("{} tensors for one BF16 copy launch (1 to 3)", xs.len())
    })?;
    let ys = xs
        .iter()
        .map(|&(_, n)| gpu.uninit::<u16>(n))
        .collect::<Result<Vec<_>>>()?;
    let mut t = CStruct::default();
    for i in 0..3 {
        t.u64(xs.get(i).map_or(0, |(x, _)| gpu.ptr(*x)));
    }
    for i in 0..3 {
        t.u64(ys.get(i).map_or(0, |y| gpu.ptr(y)));
    }
    for i in 0..3 {
        t.i64(xs.get(i).map_or(0, |&(_, n)| n as i64));
    }
    // A thread converts 16 values an iteration (four float4 loads in flight).
    let most = xs.iter().map(|x| x.1).max().unwrap_or(0);
    let blocks = most.div_ceil(16 * 256).clamp(1, 65_535) as u32;
    gpu.launch(
        &FLASH,
        "fa_to_bf16_x3",
        (blocks, xs.len() as u32, 1),
        (256, 1, 1),
        0,
        &[t.arg()?],
    )?;
    Ok(ys)
}

/// The BF16 (RNE) copy of the first `n` values of `x` (`n` a multiple of 4): the
/// tensor-core attention's operand of an f32 q, k or v, the bits
/// [`flash_forward`] makes.
pub fn attention_operand_bf16(gpu: &Gpu, x: &CudaSlice<f32>, n: usize) -> Result<CudaSlice<u16>> {
    check_len("attention operand input", x, n, format!("[{n}]"))?;
    ensure(n.is_multiple_of(4), || {
        format!("attention operand of {n} values: not a multiple of 4")
    })?;
    Ok(to_bf16_n(gpu, &[(x, n)])?.remove(0))
}

/// Forward: `out [rows, nh*hd]` and what the backward needs.
pub fn flash_forward(
    gpu: &Gpu,
    plan: &FlashPlan,
    q: &CudaSlice<f32>,
    k: &CudaSlice<f32>,
    v: &CudaSlice<f32>,
    shape: AttnShape,
) -> Result<(CudaSlice<f32>, FlashSaved)> {
    flash_forward_with(gpu, plan, q, k, v, shape, FwdKernel::Regs)
}

/// [`flash_forward`] with a chosen build of the kernel.
#[allow(clippy::too_many_arguments)]
pub fn flash_forward_with(
    gpu: &Gpu,
    plan: &FlashPlan,
    q: &CudaSlice<f32>,
    k: &CudaSlice<f32>,
    v: &CudaSlice<f32>,
    shape: AttnShape,
    which: FwdKernel,
) -> Result<(CudaSlice<f32>, FlashSaved)> {
    flash_forward_opts(gpu, plan, (q, k, v), shape, (which, None))
}

/// [`flash_forward`] that also returns the output's BF16 GEMM operand `[rows][nh *
/// hd]` (the o projection's: the bits of `to_bf16_padded` of the output), written
/// by the kernel that writes the output.
pub fn flash_forward_operand(
    gpu: &Gpu,
    plan: &FlashPlan,
    (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    shape: AttnShape,
) -> Result<(CudaSlice<f32>, FlashSaved, CudaSlice<u16>)> {
    let o16 = gpu.uninit::<u16>(plan.rows * shape.n_heads * shape.head_dim)?;
    let (out, saved) =
        flash_forward_opts(gpu, plan, (q, k, v), shape, (FwdKernel::Regs, Some(&o16)))?;
    Ok((out, saved, o16))
}

/// The forward with a chosen build, and the output's BF16 copy into `o16` when given
/// (`[rows][nh * hd]`).
fn flash_forward_opts(
    gpu: &Gpu,
    plan: &FlashPlan,
    (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    shape: AttnShape,
    (which, o16): (FwdKernel, Option<&CudaSlice<u16>>),
) -> Result<(CudaSlice<f32>, FlashSaved)> {
    check(shape)?;
    let (hd, nh, nkv, n) = (shape.head_dim, shape.n_heads, shape.n_kv_heads, plan.rows);
    check_rows("q", q, n, nh * hd)?;
    check_rows("k", k, n, nkv * hd)?;
    check_rows("v", v, n, nkv * hd)?;
    let qkv16 = to_bf16_x3(
        gpu,
        [(q, n * nh * hd), (k, n * nkv * hd), (v, n * nkv * hd)],
    )?;
    let (out, saved) = flash_forward_from(gpu, plan, qkv16, shape, (which, o16), true)?;
    let out =
        out.ok_or_else(|| super::CudaError::Invalid("attention forward: no f32 output".into()))?;
    Ok((out, saved))
}

/// What the training forward writes of the attention's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FwdOut {
    /// The f32 output alone.
    F32,
    /// The f32 output and its BF16 copy (the o projection's BF16 operand).
    F32Bf16,
    /// The BF16 values alone: where the o projection reads only its BF16 operand
    /// and the backward's `delta` takes the output in that form (a BF16 flow's
    /// training: the f32 output was written and read for `delta` alone).
    Bf16,
}

/// [`flash_forward_operand`] from q, k and v already BF16 (`[rows][heads * hd]`,
/// the bits `to_bf16_x3` would make of their f32 values: q and k from
/// `ops::qk_norm_rope_bf16`, v from its projection's rows GEMM), which the
/// backward keeps: the f32 output (none with [`FwdOut::Bf16`]), the saved state
/// and the output's BF16 operand (with [`FwdOut::F32Bf16`] and [`FwdOut::Bf16`]).
#[allow(clippy::type_complexity)]
pub fn flash_forward_operand_bf16(
    gpu: &Gpu,
    plan: &FlashPlan,
    [q16, k16, v16]: [CudaSlice<u16>; 3],
    shape: AttnShape,
    form: FwdOut,
) -> Result<(Option<CudaSlice<f32>>, FlashSaved, Option<CudaSlice<u16>>)> {
    check(shape)?;
    let (hd, nh, nkv, n) = (shape.head_dim, shape.n_heads, shape.n_kv_heads, plan.rows);
    for (what, b, w) in [("q", &q16, nh), ("k", &k16, nkv), ("v", &v16, nkv)] {
        check_len(
            &format!("attention {what} (BF16)"),
            b,
            n * w * hd,
            format!("[{n}, {w} * {hd}]"),
        )?;
    }
    let o16 = match form {
        FwdOut::F32 => None,
        FwdOut::F32Bf16 | FwdOut::Bf16 => Some(gpu.uninit::<u16>(n * nh * hd)?),
    };
    let (out, saved) = flash_forward_from(
        gpu,
        plan,
        [q16, k16, v16],
        shape,
        (FwdKernel::Regs, o16.as_ref()),
        form != FwdOut::Bf16,
    )?;
    Ok((out, saved, o16))
}

/// The forward kernel over BF16 q, k, v (checked by the callers), kept in the
/// returned [`FlashSaved`]; the f32 output where `f32_out` (else `o16` must be
/// given: the kernel writes that alone).
fn flash_forward_from(
    gpu: &Gpu,
    plan: &FlashPlan,
    [q16, k16, v16]: [CudaSlice<u16>; 3],
    shape: AttnShape,
    (which, o16): (FwdKernel, Option<&CudaSlice<u16>>),
    f32_out: bool,
) -> Result<(Option<CudaSlice<f32>>, FlashSaved)> {
    let (hd, nh, nkv, n) = (shape.head_dim, shape.n_heads, shape.n_kv_heads, plan.rows);
    let saved = FlashSaved {
        lse: gpu.uninit::<f32>(n * nh)?,
        q16,
        k16,
        v16,
    };
    ensure(f32_out || o16.is_some(), || {
        "attention forward: neither an f32 output nor a BF16 one asked for".to_string()
    })?;
    let out = match f32_out {
        true => Some(gpu.uninit::<f32>(n * nh * hd)?),
        false => None,
    };
    let name = match which {
        FwdKernel::Regs => kernel("fwd", hd)?,
        FwdKernel::Occupancy3 => kernel("fwd3", hd)?,
    };
    gpu.launch(
        &FLASH,
        name,
        plan.grid(nh)?,
        (128, 1, 1),
        4 * tile_bytes(hd, TILE),
        &[
            Arg::P(gpu.ptr(&saved.q16)),
            Arg::P(gpu.ptr(&saved.k16)),
            Arg::P(gpu.ptr(&saved.v16)),
            Arg::P(gpu.ptr(&plan.tiles_q)),
            Arg::I(nh as i32),
            Arg::I(nkv as i32),
            Arg::F(scales(hd).1),
            Arg::P(out.as_ref().map_or(0, |b| gpu.ptr(b))),
            Arg::P(gpu.ptr(&saved.lse)),
            Arg::P(o16.map_or(0, |b| gpu.ptr(b))),
        ],
    )?;
    Ok((out, saved))
}

/// The attention output's gradient `[rows, n_heads * head_dim]` a backward reads:
/// f32 values, or BF16 values (the o projection's DGrad output as cuBLASLt wrote
/// it, row stride n_heads * head_dim), which the kernels read as their BF16 dO
/// directly; its f32 values are those the DGrad epilogue would have written, so
/// the bits of the backward are the same.
#[derive(Clone, Copy)]
pub enum Dout<'a> {
    F32(&'a CudaSlice<f32>),
    Bf16(&'a CudaSlice<u16>),
}

/// Backward: `(dq, dk, dv)` from `dout` and the forward's output and saved state;
/// with `round_dv`, dv rounded to BF16 values by the kernel that writes it (the
/// low-precision flows' rounding of the gradients between ops, fused: the bits of
/// `tensor::round_bf16` of the unrounded dv).
pub fn flash_backward<'a>(
    gpu: &Gpu,
    plan: &FlashPlan,
    dout: Dout<'a>,
    out: impl Into<ActRef<'a>>,
    saved: &FlashSaved,
    shape: AttnShape,
    round_dv: bool,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>)> {
    let which = BwdKernel::default_for(gpu);
    let opts = (which, round_dv, None);
    with_dv(flash_backward_opts(
        gpu,
        plan,
        (dout, out.into()),
        saved,
        shape,
        opts,
    )?)
}

/// [`flash_backward`] with dv as its BF16 GEMM operand `[rows][n_kv_heads *
/// head_dim]` alone (the v projection's dy: the bits of `to_bf16_padded` of dv),
/// written by the kernel in place of f32 dv: `(dq, dk, dv16)`.
pub fn flash_backward_operand(
    gpu: &Gpu,
    plan: &FlashPlan,
    (dout, out): (Dout, ActRef),
    saved: &FlashSaved,
    shape: AttnShape,
    round_dv: bool,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>, CudaSlice<u16>)> {
    let w = shape.n_kv_heads * shape.head_dim;
    let dv16 = gpu.uninit::<u16>(plan.rows * w)?;
    let io = (dout, out);
    let (dq, dk) = flash_backward_operand_at(gpu, plan, io, saved, shape, round_dv, (&dv16, 0, w))?;
    Ok((dq, dk, dv16))
}

/// [`flash_backward_operand`] with dv's BF16 operand written as columns
/// `[col, col + n_kv_heads * head_dim)` of `st` (`[rows][ld]`: q/k/v's stacked dy,
/// for one BF16 WGrad and DGrad of the three): the same bits. `(dq, dk)`.
pub fn flash_backward_operand_at(
    gpu: &Gpu,
    plan: &FlashPlan,
    (dout, out): (Dout, ActRef),
    saved: &FlashSaved,
    shape: AttnShape,
    round_dv: bool,
    (st, col, ld): (&CudaSlice<u16>, usize, usize),
) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    let which = BwdKernel::default_for(gpu);
    let at = Some(Dv16 { buf: st, col, ld });
    let io = (dout, out);
    let (dq, dk, _) = flash_backward_opts(gpu, plan, io, saved, shape, (which, round_dv, at))?;
    Ok((dq, dk))
}

/// Where the dK/dV kernel writes dv's BF16 operand: columns from `col` of `buf`
/// (`[rows][ld]` BF16).
#[derive(Clone, Copy)]
pub struct Dv16<'a> {
    pub buf: &'a CudaSlice<u16>,
    pub col: usize,
    pub ld: usize,
}

/// [`flash_backward`] with a chosen build of the kernels.
#[allow(clippy::too_many_arguments)]
pub fn flash_backward_with(
    gpu: &Gpu,
    plan: &FlashPlan,
    dout: &CudaSlice<f32>,
    out: &CudaSlice<f32>,
    saved: &FlashSaved,
    shape: AttnShape,
    which: BwdKernel,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>)> {
    let opts = (which, false, None);
    with_dv(flash_backward_opts(
        gpu,
        plan,
        (Dout::F32(dout), out.into()),
        saved,
        shape,
        opts,
    )?)
}

/// `(dq, dk, dv)` of the backward's kernels, dv `None` where a [`Dv16`] was given
/// (the kernel then writes dv's BF16 operand alone: nothing read the f32 dv).
pub type BwdGrads = (CudaSlice<f32>, CudaSlice<f32>, Option<CudaSlice<f32>>);

/// The `(dq, dk, dv)` of a backward that was given no [`Dv16`].
pub fn with_dv((dq, dk, dv): BwdGrads) -> Result<(CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>)> {
    let dv = dv.ok_or_else(|| {
        super::CudaError::Invalid("attention backward: dv was written as BF16 alone".into())
    })?;
    Ok((dq, dk, dv))
}

/// The backward with a chosen build, dv rounded to BF16 when `round_dv`, and dv's
/// BF16 operand into `dv16` when given (`[rows][n_kv_heads * head_dim]`), in place
/// of f32 dv.
fn flash_backward_opts(
    gpu: &Gpu,
    plan: &FlashPlan,
    (dout, out): (Dout, ActRef),
    saved: &FlashSaved,
    shape: AttnShape,
    (which, round_dv, dv16): (BwdKernel, bool, Option<Dv16>),
) -> Result<BwdGrads> {
    let prep = flash_backward_prep(gpu, (dout, out), plan.rows, shape)?;
    let dout16 = prep.dout16(dout)?;
    flash_backward_kernels(
        gpu,
        plan,
        (dout16, &prep.delta),
        saved,
        shape,
        (which, round_dv, dv16),
    )
}

/// What the backward's kernels read of dO besides the saved state, from
/// `fa_bwd_prep`: each row's softmax-backward term `delta [rows, nh]`
/// (rowsum(dO o O) per head) and dO's BF16 copy where dO came as f32.
pub struct BwdPrep {
    pub delta: CudaSlice<f32>,
    own16: Option<CudaSlice<u16>>,
}

impl BwdPrep {
    /// dO's BF16 values: the copy made, or the BF16 dO given (the `dout` this
    /// prep was made from).
    pub fn dout16<'a>(&'a self, dout: Dout<'a>) -> Result<&'a CudaSlice<u16>> {
        match (&self.own16, dout) {
            (Some(b), _) => Ok(b),
            (None, Dout::Bf16(d)) => Ok(d),
            (None, Dout::F32(_)) => Err(super::CudaError::Invalid(
                "attention backward: an f32 dO without the BF16 copy its prep makes".into(),
            )),
        }
    }
}

/// `fa_bwd_prep` over `rows` rows of `dout` and the forward's output `out`
/// (`[rows, nh * hd]`: f32, or BF16 where the forward kept only its BF16 values,
/// [`FwdOut::Bf16`]): a row's delta and BF16 dO depend on that row alone.
pub fn flash_backward_prep(
    gpu: &Gpu,
    (dout, out): (Dout, ActRef),
    n: usize,
    shape: AttnShape,
) -> Result<BwdPrep> {
    check(shape)?;
    let (hd, nh) = (shape.head_dim, shape.n_heads);
    let (out_f32, out16) = match out {
        ActRef::F32(o) => {
            check_rows("out", o, n, nh * hd)?;
            (gpu.ptr(o), 0)
        }
        ActRef::Bf16(o) => {
            check_len("out (BF16)", o, n * nh * hd, format!("[{n}, {}]", nh * hd))?;
            (0, gpu.ptr(o))
        }
    };
    match dout {
        Dout::F32(d) => check_rows("dout", d, n, nh * hd)?,
        Dout::Bf16(d) => check_len("dout (BF16)", d, n * nh * hd, format!("[{n}, {}]", nh * hd))?,
    }
    // dO's BF16 copy made by fa_bwd_prep, or the BF16 dO given (read there).
    let (dout_f32, own16) = match dout {
        Dout::F32(d) => (gpu.ptr(d), Some(gpu.uninit::<u16>(n * nh * hd)?)),
        Dout::Bf16(_) => (0, None),
    };
    let prep = BwdPrep {
        delta: gpu.uninit::<f32>(n * nh)?,
        own16,
    };
    let dout16 = prep.dout16(dout)?;
    if n > 0 {
        gpu.launch(
            &FLASH,
            "fa_bwd_prep",
            (n as u32, 1, 1),
            (128, 1, 1),
            0,
            &[
                Arg::P(dout_f32),
                Arg::P(out_f32),
                Arg::P(out16),
                Arg::I(nh as i32),
                Arg::I(hd as i32),
                Arg::P(gpu.ptr(dout16)),
                Arg::P(gpu.ptr(&prep.delta)),
            ],
        )?;
    }
    Ok(prep)
}

/// The backward's dK/dV and dQ kernels over `plan` from dO's BF16 values and the
/// rows' delta ([`flash_backward_prep`]'s, or copied from it), with
/// [`flash_backward_opts`]'s options: [`BwdGrads`].
pub fn flash_backward_kernels(
    gpu: &Gpu,
    plan: &FlashPlan,
    (dout16, delta): (&CudaSlice<u16>, &CudaSlice<f32>),
    saved: &FlashSaved,
    shape: AttnShape,
    (which, round_dv, dv16): (BwdKernel, bool, Option<Dv16>),
) -> Result<BwdGrads> {
    check(shape)?;
    ensure(which == BwdKernel::MmaSync || gpu.wgmma(), || {
        "attention backward: the wgmma kernels need an sm_90 GPU (and JET_WGMMA not 0)".into()
    })?;
    let (hd, nh, nkv, n) = (shape.head_dim, shape.n_heads, shape.n_kv_heads, plan.rows);
    check_rows("lse", &saved.lse, n, nh)?;
    check_rows("delta", delta, n, nh)?;
    check_len(
        "dout (BF16)",
        dout16,
        n * nh * hd,
        format!("[{n}, {}]", nh * hd),
    )?;
    for (what, b, w) in [
        ("q", &saved.q16, nh * hd),
        ("k", &saved.k16, nkv * hd),
        ("v", &saved.v16, nkv * hd),
    ] {
        check_len(
            &format!("attention saved {what}"),
            b,
            n * w,
            format!("[{n}, {w}]"),
        )?;
    }
    if let Some(Dv16 { buf, col, ld }) = dv16 {
        let w = nkv * hd;
        ensure(ld >= col + w && (col | ld).is_multiple_of(2), || {
            format!("dv (BF16): columns {col}..{} at row stride {ld}", col + w)
        })?;
        let want = n.saturating_sub(1) * ld + col + w;
        check_len("dv (BF16)", buf, want, format!("[{n}][{ld}]"))?;
    }
    let dq = gpu.uninit::<f32>(n * nh * hd)?;
    let dk = gpu.uninit::<f32>(n * nkv * hd)?;
    let dv = match dv16 {
        None => Some(gpu.uninit::<f32>(n * nkv * hd)?),
        Some(_) => None,
    };
    let (scale, sl2) = scales(hd);
    let common = |tiles: &CudaSlice<i32>| {
        vec![
            Arg::P(gpu.ptr(dout16)),
            Arg::P(gpu.ptr(&saved.q16)),
            Arg::P(gpu.ptr(&saved.k16)),
            Arg::P(gpu.ptr(&saved.v16)),
            Arg::P(gpu.ptr(&saved.lse)),
            Arg::P(gpu.ptr(delta)),
            Arg::P(gpu.ptr(tiles)),
            Arg::I(nh as i32),
            Arg::I(nkv as i32),
            Arg::F(sl2),
            Arg::F(scale),
        ]
    };
    // dK, dV: a CTA per (64-key tile, kv head); dQ: a CTA per (64-row tile, head).
    let (src, kv, q, kv_smem, q_smem) = match which {
        BwdKernel::MmaSync => (
            &FLASH,
            kernel("kv", hd)?,
            kernel("q", hd)?,
            2 * tile_bytes(hd, TILE) + 4 * tile_bytes(hd, BWD_Q_STEP) + (4 * BWD_Q_STEP * 4) as u32,
            6 * tile_bytes(hd, TILE),
        ),
        BwdKernel::Wgmma => (
            &FLASH_WG,
            kernel("kv_wg", hd)?,
            kernel("q_wg", hd)?,
            wg_smem_bytes(hd),
            wg_smem_bytes(hd),
        ),
    };
    let mut args = common(&plan.tiles_kv);
    args.extend([
        Arg::P(gpu.ptr(&dk)),
        Arg::P(dv.as_ref().map_or(0, |d| gpu.ptr(d))),
        Arg::I(round_dv as i32),
        Arg::P(dv16.map_or(0, |d| gpu.ptr(d.buf) + 2 * d.col as u64)),
        Arg::L(dv16.map_or(0, |d| d.ld as i64)),
    ]);
    gpu.launch(src, kv, plan.grid(nkv)?, (128, 1, 1), kv_smem, &args)?;
    let mut args = common(&plan.tiles_q);
    args.push(Arg::P(gpu.ptr(&dq)));
    gpu.launch(src, q, plan.grid(nh)?, (128, 1, 1), q_smem, &args)?;
    Ok((dq, dk, dv))
}

/// Write f32 rows `src [rows.len(), cols]` into rows `rows` of a BF16 cache
/// `dst [*, cols]`, rounded as the training forward rounds its k, v.
pub fn flash_scatter_rows(
    gpu: &Gpu,
    dst: &mut CudaSlice<u16>,
    cols: usize,
    rows: &[usize],
    src: &CudaSlice<f32>,
) -> Result<()> {
    ensure(cols > 0 && cols.is_multiple_of(2), || {
        format!("cache rows of {cols} values (needs an even count)")
    })?;
    let rows = CacheRows::new(gpu, rows, dst.len() / cols)?;
    flash_scatter_rows_dev(gpu, dst, cols, &rows, src)
}

/// The cache rows a prefill writes, `[n]` i64 on the device, and where each one's
/// values come from: row j of the source (`CacheRows::new`), or source row
/// `src[j]` (`CacheRows::gathered`: a shared prompt's last, partly filled page
/// copied into each of its samples' own pages). Checked once (in a cache of
/// `have` rows, each written at most once) and uploaded once for every layer.
pub struct CacheRows {
    idx: CudaSlice<i64>,
    src: Option<CudaSlice<i64>>,
    n: usize,
    /// Source rows read: n, or one past the largest of `src`.
    nsrc: usize,
    have: usize,
}

impl CacheRows {
    pub fn new(gpu: &Gpu, rows: &[usize], have: usize) -> Result<CacheRows> {
        Self::check(rows, have)?;
        Ok(CacheRows {
            idx: Self::upload(gpu, rows)?,
            src: None,
            n: rows.len(),
            nsrc: rows.len(),
            have,
        })
    }

    /// Cache rows `rows[j]` taking source row `src[j]` (a source row may go to
    /// several cache rows).
    pub fn gathered(gpu: &Gpu, rows: &[usize], src: &[usize], have: usize) -> Result<CacheRows> {
        ensure(rows.len() == src.len(), || {
            format!(
                "cache scatter: {} cache rows for {} source rows",
                rows.len(),
                src.len()
            )
        })?;
        Self::check(rows, have)?;
        Ok(CacheRows {
            idx: Self::upload(gpu, rows)?,
            src: Some(Self::upload(gpu, src)?),
            n: rows.len(),
            nsrc: src.iter().map(|&r| r + 1).max().unwrap_or(0),
            have,
        })
    }

    /// Row indices as the kernels take them (i64).
    fn upload(gpu: &Gpu, rows: &[usize]) -> Result<CudaSlice<i64>> {
        gpu.upload(&rows.iter().map(|&r| r as i64).collect::<Vec<_>>())
    }

    fn check(rows: &[usize], have: usize) -> Result<()> {
        if let Some(&r) = rows.iter().find(|&&r| r >= have) {
            return Err(super::CudaError::Invalid(format!(
                "cache scatter: row {r} outside a cache of {have} rows"
            )));
        }
        let mut seen = std::collections::HashSet::with_capacity(rows.len());
        if let Some(&r) = rows.iter().find(|&&r| !seen.insert(r)) {
            return Err(super::CudaError::Invalid(format!(
                "cache scatter: row {r} appears more than once"
            )));
        }
        Ok(())
    }

    /// Whether a cache `c` of rows of `cols` values holds every row these were
    /// checked against (an error naming the cache where not).
    pub fn fits<T>(&self, what: &str, c: &CudaSlice<T>, cols: usize) -> Result<()> {
        ensure(cols > 0 && c.len() / cols >= self.have, || {
            format!(
                "cache scatter: the {what} cache holds {} rows of {cols}, the rows were checked against {}",
                c.len() / cols.max(1),
                self.have
            )
        })
    }

    /// Whether a source `src` of rows of `cols` values holds the rows read
    /// (exactly `len()` of them without a source map).
    pub fn source_fits<T>(&self, what: &str, src: &CudaSlice<T>, cols: usize) -> Result<()> {
        let ok = match self.src {
            None => src.len() == self.n * cols,
            Some(_) => src.len() >= self.nsrc * cols,
        };
        ensure(ok, || {
            format!(
                "{what}: {} values for {} source rows of {cols}",
                src.len(),
                self.nsrc
            )
        })
    }

    /// The cache rows on the device, for [`flash_scatter_rows_dev`] and
    /// [`super::tensor::scatter_rows_dev`].
    pub fn idx(&self) -> &CudaSlice<i64> {
        &self.idx
    }

    /// The source map's device pointer (0: row j from source row j).
    pub fn src_ptr(&self, gpu: &Gpu) -> u64 {
        self.src.as_ref().map_or(0, |s| gpu.ptr(s))
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// Write k, v (BF16 values: the bits [`flash_scatter_rows`] makes of their f32
/// values; `[n, cols]`, or the rows `rows`' source map reads) into cache rows
/// `rows` of `k_cache` and `v_cache`, one launch for both (`fa_scatter_kv16`);
/// `cols` a multiple of 8 (heads of 64 or 128).
pub fn flash_scatter_kv16(
    gpu: &Gpu,
    (k_cache, v_cache): (&mut CudaSlice<u16>, &mut CudaSlice<u16>),
    cols: usize,
    rows: &CacheRows,
    (k, v): (&CudaSlice<u16>, &CudaSlice<u16>),
) -> Result<()> {
    let n = rows.n;
    ensure(cols > 0 && cols.is_multiple_of(8), || {
        format!("BF16 cache rows of {cols} values (needs a multiple of 8)")
    })?;
    rows.fits("k", k_cache, cols)?;
    rows.fits("v", v_cache, cols)?;
    rows.source_fits("cache scatter k (BF16)", k, cols)?;
    rows.source_fits("cache scatter v (BF16)", v, cols)?;
    if n == 0 {
        return Ok(());
    }
    gpu.launch(
        &FLASH,
        "fa_scatter_kv16",
        (n as u32, 2, 1),
        (128, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(k_cache)),
            Arg::P(gpu.ptr(v_cache)),
            Arg::P(gpu.ptr(&rows.idx)),
            Arg::P(rows.src_ptr(gpu)),
            Arg::L(cols as i64),
            Arg::P(gpu.ptr(k)),
            Arg::P(gpu.ptr(v)),
        ],
    )
}

/// [`flash_scatter_rows`] into cache rows checked and uploaded once
/// ([`CacheRows`], their sources too): a prefill writes the same rows into every
/// layer's k and v caches.
pub fn flash_scatter_rows_dev(
    gpu: &Gpu,
    dst: &mut CudaSlice<u16>,
    cols: usize,
    rows: &CacheRows,
    src: &CudaSlice<f32>,
) -> Result<()> {
    ensure(cols > 0 && cols.is_multiple_of(2), || {
        format!("cache rows of {cols} values (needs an even count)")
    })?;
    rows.fits("BF16", dst, cols)?;
    rows.source_fits("cache scatter src", src, cols)?;
    let n = rows.n;
    if n == 0 {
        return Ok(());
    }
    let pairs = (n * cols / 2) as u32;
    gpu.launch(
        &FLASH,
        "fa_scatter_bf16",
        (pairs.div_ceil(256), 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(dst)),
            Arg::P(gpu.ptr(&rows.idx)),
            Arg::P(rows.src_ptr(gpu)),
            Arg::L(n as i64),
            Arg::L(cols as i64),
            Arg::P(gpu.ptr(src)),
        ],
    )
}

/// Rows of a key tile, and of a page of a paged KV cache (`FA_BC` in flash.cu):
/// each decode tile is one page, so paging changes where a tile is read from, not
/// what is read or in which order.
pub const PAGE_ROWS: usize = 64;
const _: () = assert!(PAGE_ROWS == TILE, "a page is one decode key tile (FA_BC)");

/// Where each decode row's keys and values lie in the caches, on the device:
/// `kv0 [b]` and `len [b]` (i32). Without `pages`, key j of row b is cache row
/// `kv0[b] + j`; with `pages` (a paged cache's table), cache row
/// `pages[kv0[b] + j / PAGE_ROWS] * PAGE_ROWS + j % PAGE_ROWS`. The caller checks
/// both against the caches (the grid does not depend on them).
#[derive(Clone, Copy)]
pub struct KvAt<'a> {
    pub kv0: &'a CudaSlice<i32>,
    pub len: &'a CudaSlice<i32>,
    pub pages: Option<&'a CudaSlice<i32>>,
}

impl<'a> From<(&'a CudaSlice<i32>, &'a CudaSlice<i32>)> for KvAt<'a> {
    /// Contiguous rows from each row's `kv0`.
    fn from((kv0, len): (&'a CudaSlice<i32>, &'a CudaSlice<i32>)) -> Self {
        KvAt {
            kv0,
            len,
            pages: None,
        }
    }
}

/// Check a paged decode's rows against its table and caches (`k`, `v` values,
/// rows of `kvw`; lengths at most `limit`) and return each row's table offset.
pub(crate) fn paged_rows(
    (k, v, kvw): (usize, usize, usize),
    (pages, stride): (&CudaSlice<i32>, usize),
    slots: &[usize],
    lens: &[usize],
    limit: usize,
) -> Result<Vec<i32>> {
    let b = lens.len();
    ensure(slots.len() == b, || {
        format!("decode: {} slots for {b} rows", slots.len())
    })?;
    ensure(lens.iter().all(|&l| l >= 1 && l <= limit), || {
        format!("decode: lengths {lens:?} must lie in 1..={limit}")
    })?;
    let n_slots = slots.iter().map(|&s| s + 1).max().unwrap_or(0);
    ensure(pages.len() >= n_slots * stride, || {
        format!(
            "decode: a page table of {} entries for slot {} of {stride} pages each",
            pages.len(),
            n_slots.saturating_sub(1)
        )
    })?;
    ensure(k == v && k > 0 && k.is_multiple_of(PAGE_ROWS * kvw), || {
        format!(
            "decode: k, v caches of {k} and {v} values are not whole pages of {PAGE_ROWS} x {kvw}"
        )
    })?;
    Ok(slots.iter().map(|&s| (s * stride) as i32).collect())
}

/// Decode: query row b `q [B, nh*hd]` at position `lens[b] - 1` against rows
/// `0..lens[b]` of cache slot `slots[b]` of the BF16 caches
/// `k_cache, v_cache [S, capacity, nkv*hd]` (written by [`flash_scatter_rows`] or
/// [`flash_scatter_kv16`])
/// -> `out [B, nh*hd]`, equal bit for bit to [`flash_forward`]'s row at that position.
#[allow(clippy::too_many_arguments)]
pub fn flash_decode_at(
    gpu: &Gpu,
    q: &CudaSlice<f32>,
    k_cache: &CudaSlice<u16>,
    v_cache: &CudaSlice<u16>,
    capacity: usize,
    slots: &[usize],
    lens: &[usize],
    shape: AttnShape,
) -> Result<CudaSlice<f32>> {
    check(shape)?;
    let (hd, nkv, b) = (shape.head_dim, shape.n_kv_heads, lens.len());
    ensure(slots.len() == b, || {
        format!("decode: {} slots for {b} rows", slots.len())
    })?;
    ensure(lens.iter().all(|&l| l >= 1 && l <= capacity), || {
        format!("decode: lengths {lens:?} must lie in 1..={capacity}")
    })?;
    let n_slots = slots.iter().map(|&s| s + 1).max().unwrap_or(0);
    for (what, c) in [("k cache", k_cache), ("v cache", v_cache)] {
        let (r, w) = (n_slots * capacity, nkv * hd);
        check_len(what, c, r * w, format!("[{r}, {w}]"))?;
    }
    ensure(n_slots * capacity <= i32::MAX as usize, || {
        format!("decode: a cache of {n_slots} x {capacity} rows is too large")
    })?;
    let kv0: Vec<i32> = slots.iter().map(|&s| (s * capacity) as i32).collect();
    let len: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
    let (kv0, len) = (gpu.upload(&kv0)?, gpu.upload(&len)?);
    flash_decode_dev(gpu, q, (k_cache, v_cache), (&kv0, &len), b, shape)
}

/// [`flash_decode_at`] against a paged cache: key j of row b lies in cache row
/// `pages[slots[b] * stride + j / PAGE_ROWS] * PAGE_ROWS + j % PAGE_ROWS` of
/// `k_cache, v_cache [*, nkv*hd]` (whole pages). The same bits as the contiguous
/// cache holding the same rows: only where each tile is read from moves.
#[allow(clippy::too_many_arguments)]
pub fn flash_decode_paged(
    gpu: &Gpu,
    q: &CudaSlice<f32>,
    (k_cache, v_cache): (&CudaSlice<u16>, &CudaSlice<u16>),
    (pages, stride): (&CudaSlice<i32>, usize),
    slots: &[usize],
    lens: &[usize],
    shape: AttnShape,
) -> Result<CudaSlice<f32>> {
    check(shape)?;
    let kvw = shape.n_kv_heads * shape.head_dim;
    let kv0 = paged_rows(
        (k_cache.len(), v_cache.len(), kvw),
        (pages, stride),
        slots,
        lens,
        stride * PAGE_ROWS,
    )?;
    let b = lens.len();
    let len: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
    let (kv0, len) = (gpu.upload(&kv0)?, gpu.upload(&len)?);
    let at = KvAt {
        kv0: &kv0,
        len: &len,
        pages: Some(pages),
    };
    flash_decode_dev(gpu, q, (k_cache, v_cache), at, b, shape)
}

/// [`flash_decode_at`] with each row's keys `at` (first cache row, or page-table
/// offset with a paged cache, and length) already on the device, as a CUDA graph
/// replays it. The caller checks them against the caches (the grid does not
/// depend on them: one block per row and KV head).
pub fn flash_decode_dev<'a>(
    gpu: &Gpu,
    q: &CudaSlice<f32>,
    (k_cache, v_cache): (&CudaSlice<u16>, &CudaSlice<u16>),
    at: impl Into<KvAt<'a>>,
    b: usize,
    shape: AttnShape,
) -> Result<CudaSlice<f32>> {
    let caches = (gpu.ptr(k_cache), gpu.ptr(v_cache));
    decode_launch(
        gpu,
        DecIn::Rows(q, (0, 0)),
        caches,
        at.into(),
        b,
        shape,
        None,
    )
}

/// [`flash_decode_dev`] for rows whose own key and value, `k_new, v_new [b,
/// nkv*hd]` (f32), are not in the caches yet: the kernel writes them to the cache
/// row of key `len[b] - 1` (as [`flash_scatter_rows_dev`] would, the same bits) and
/// attends to them, in one launch instead of three.
pub fn flash_append_decode_dev<'a>(
    gpu: &Gpu,
    q: &CudaSlice<f32>,
    (k_new, v_new): (&CudaSlice<f32>, &CudaSlice<f32>),
    (k_cache, v_cache): (&mut CudaSlice<u16>, &mut CudaSlice<u16>),
    at: impl Into<KvAt<'a>>,
    b: usize,
    shape: AttnShape,
) -> Result<CudaSlice<f32>> {
    let caches = (gpu.ptr(k_cache), gpu.ptr(v_cache));
    let new = append_rows(gpu, (k_new, v_new), b, shape)?;
    decode_launch(gpu, DecIn::Rows(q, new), caches, at.into(), b, shape, None)
}

/// [`flash_append_decode_dev`] also making the o projection's operand of its
/// output `[b, nh*hd]` in the same launch (`fp8`: its 1x128 groups, as
/// `quantize_row1x128`; else its BF16 copy, as `to_bf16_padded`; the same
/// bits). FP8 needs heads of a multiple of 128 values ([`decode_operand_fits`]).
#[allow(clippy::too_many_arguments)]
pub fn flash_append_decode_operand_dev<'a>(
    gpu: &Gpu,
    q: &CudaSlice<f32>,
    (k_new, v_new): (&CudaSlice<f32>, &CudaSlice<f32>),
    (k_cache, v_cache): (&mut CudaSlice<u16>, &mut CudaSlice<u16>),
    at: impl Into<KvAt<'a>>,
    b: usize,
    shape: AttnShape,
    fp8: bool,
) -> Result<(CudaSlice<f32>, FusedOperand)> {
    let caches = (gpu.ptr(k_cache), gpu.ptr(v_cache));
    let new = append_rows(gpu, (k_new, v_new), b, shape)?;
    decode_operand_launch(gpu, DecIn::Rows(q, new), caches, at.into(), b, shape, fp8)
}

/// [`decode_launch`] making the o projection's operand of its output too.
fn decode_operand_launch(
    gpu: &Gpu,
    input: DecIn,
    caches: (u64, u64),
    at: KvAt,
    b: usize,
    shape: AttnShape,
    fp8: bool,
) -> Result<(CudaSlice<f32>, FusedOperand)> {
    ensure(decode_operand_fits(shape, fp8), || {
        format!(
            "decode attention with its output's operand: head_dim {} (FP8 needs a multiple of 128)",
            shape.head_dim
        )
    })?;
    let op = FusedOperand::alloc(gpu, b, shape.n_heads * shape.head_dim, fp8)?;
    let out = decode_launch(gpu, input, caches, at, b, shape, Some(&op))?;
    Ok((out, op))
}

/// [`flash_append_decode_operand_dev`] of the q, k and v that `qkv`'s epilogue
/// (`QkvPartials::norm_rope`: the projections' split-K slices added, Qwen3's q/k
/// norms, RoPE) would make, made inside the attention's launch (`fa_dec2_qkv`:
/// each block its own q heads and k, v row, the same bits) in place of a launch
/// of their own; with `JET_DEC_QKV=0`, the two launches (for A/B runs).
#[allow(clippy::too_many_arguments)]
pub fn flash_qkv_append_decode_operand_dev<'a>(
    gpu: &Gpu,
    qkv: &QkvPartials,
    (k_cache, v_cache): (&mut CudaSlice<u16>, &mut CudaSlice<u16>),
    at: impl Into<KvAt<'a>>,
    b: usize,
    shape: AttnShape,
    fp8: bool,
) -> Result<(CudaSlice<f32>, FusedOperand)> {
    if std::env::var("JET_DEC_QKV").is_ok_and(|v| v == "0") {
        let [q, k, v] = qkv.norm_rope(gpu)?;
        return flash_append_decode_operand_dev(
            gpu,
            &q,
            (&k, &v),
            (k_cache, v_cache),
            at,
            b,
            shape,
            fp8,
        );
    }
    ensure(
        (qkv.m, qkv.nh, qkv.nkv, qkv.hd) == (b, shape.n_heads, shape.n_kv_heads, shape.head_dim),
        || {
            format!(
                "decode attention: q, k, v partials of {} rows, {}/{} heads of {} for {b} rows of {}/{} heads of {}",
                qkv.m, qkv.nh, qkv.nkv, qkv.hd, shape.n_heads, shape.n_kv_heads, shape.head_dim
            )
        },
    )?;
    let caches = (gpu.ptr(k_cache), gpu.ptr(v_cache));
    decode_operand_launch(gpu, DecIn::Qkv(qkv), caches, at.into(), b, shape, fp8)
}

/// Whether the decode attention can make its output's operand: the BF16 copy
/// always, the 1x128 groups where each head holds whole groups.
pub fn decode_operand_fits(shape: AttnShape, fp8: bool) -> bool {
    !fp8 || shape.head_dim.is_multiple_of(128)
}

/// The appended rows' device pointers, checked against `[b, nkv*hd]`.
fn append_rows(
    gpu: &Gpu,
    (k_new, v_new): (&CudaSlice<f32>, &CudaSlice<f32>),
    b: usize,
    shape: AttnShape,
) -> Result<(u64, u64)> {
    let kvw = shape.n_kv_heads * shape.head_dim;
    check_rows("decode new keys", k_new, b, kvw)?;
    check_rows("decode new values", v_new, b, kvw)?;
    Ok((gpu.ptr(k_new), gpu.ptr(v_new)))
}

/// `fa_dec2_{hd}` (two warps a (row, KV head)) of `input`'s q and appended rows,
/// or `fa_dec2_qkv_{hd}` of its partials; `op` the output's operand to make
/// (`DecOperand`: FP8 adds the blocks of its padding rows).
#[allow(clippy::too_many_arguments)]
fn decode_launch(
    gpu: &Gpu,
    input: DecIn,
    (k_cache, v_cache): (u64, u64),
    at: KvAt,
    b: usize,
    shape: AttnShape,
    op: Option<&FusedOperand>,
) -> Result<CudaSlice<f32>> {
    check(shape)?;
    let (hd, nh, nkv) = (shape.head_dim, shape.n_heads, shape.n_kv_heads);
    if let DecIn::Rows(q, _) = input {
        check_rows("decode q", q, b, nh * hd)?;
    }
    check_len("decode kv0", at.kv0, b, format!("[{b}]"))?;
    check_len("decode lengths", at.len, b, format!("[{b}]"))?;
    let out = gpu.uninit::<f32>(b * nh * hd)?;
    // DecOperand (flash.cu): rows, rows_pad, cols_pad, a pad, codes, scales, yb.
    let mut d = CStruct::default();
    let rows_pad = match op {
        Some(FusedOperand::Fp8(q8)) => {
            d.i32(b as i32)
                .i32(q8.rows_pad as i32)
                .i32(q8.cols_pad as i32)
                .i32(0);
            d.u64(gpu.ptr(&q8.codes)).u64(gpu.ptr(&q8.scales)).u64(0);
            q8.rows_pad
        }
        Some(FusedOperand::Bf16(yb)) => {
            d.i32(b as i32)
                .i32(b as i32)
                .i32(pad16(nh * hd) as i32)
                .i32(0);
            d.u64(0).u64(0).u64(gpu.ptr(yb));
            b
        }
        None => {
            d.i32(b as i32).i32(b as i32).i32(0).i32(0);
            d.u64(0).u64(0).u64(0);
            b
        }
    };
    // fa_dec2: K's and V's tiles, then its exchange buffers (DecX, 2,624 bytes).
    // fa_dec2_qkv: the block's q heads and k, v rows ((group + 2) x head_dim BF16
    // values) in DecX's P fragments (2,048 bytes) where they fit (groups of up to
    // 6 heads of 128: Qwen3's), else after DecX (at most 4.5 KiB: groups of at
    // most 16 heads).
    // The kernel, its extra shared bytes, and its arguments before and after the
    // shared ones.
    let (name, extra, head, new) = match input {
        DecIn::Rows(q, (k_new, v_new)) => (
            kernel("dec2", hd)?,
            0,
            vec![Arg::P(gpu.ptr(q))],
            vec![Arg::P(k_new), Arg::P(v_new)],
        ),
        DecIn::Qkv(p) => {
            let z = ((nh / nkv + 2) * hd * 2) as u32;
            let extra = if z <= 2048 { 0 } else { z };
            (kernel("dec2_qkv", hd)?, extra, p.args(gpu, true)?, vec![])
        }
    };
    gpu.launch(
        &FLASH,
        name,
        ((rows_pad * nkv) as u32, 1, 1),
        (64, 1, 1),
        2 * tile_bytes(hd, TILE) + 2624 + extra,
        &[
            &head[..],
            &[
                Arg::P(k_cache),
                Arg::P(v_cache),
                Arg::P(gpu.ptr(at.kv0)),
                Arg::P(at.pages.map_or(0, |p| gpu.ptr(p))),
                Arg::P(gpu.ptr(at.len)),
                Arg::I(nh as i32),
                Arg::I(nkv as i32),
                Arg::F(scales(hd).1),
                Arg::P(gpu.ptr(&out)),
            ],
            &new,
            &[d.arg()?],
        ]
        .concat(),
    )?;
    Ok(out)
}

/// The decode attention's query side: q `[b, nh*hd]` (f32) with the appended
/// rows' k and v pointers (0, 0: none), or the q, k, v projections' partials
/// whose epilogue the kernel runs itself (`fa_dec2_qkv`).
#[derive(Clone, Copy)]
enum DecIn<'a, 'b> {
    Rows(&'a CudaSlice<f32>, (u64, u64)),
    Qkv(&'a QkvPartials<'b>),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both orders hold every tile of the packed batch once, most work first:
    /// query tiles by position (last first), key tiles by keys to the end.
    #[test]
    fn tile_orders_are_permutations_most_work_first() {
        let lens = [5, 130, 64, 200, 1, 129];
        let (q, kv, rows) = tile_orders(&lens).unwrap();
        assert_eq!(rows, lens.iter().sum::<usize>());
        let mut plan = vec![];
        let mut start = 0;
        for &len in &lens {
            for p0 in (0..len).step_by(TILE) {
                plan.push([start as i32, p0 as i32, len as i32]);
            }
            start += len;
        }
        for (order, work) in [(&q, 0usize), (&kv, 1)] {
            let tiles: Vec<[i32; 3]> = order.chunks(3).map(|c| [c[0], c[1], c[2]]).collect();
            let w = |t: &[i32; 3]| if work == 0 { t[1] } else { t[2] - t[1] };
            assert!(tiles.windows(2).all(|p| w(&p[0]) >= w(&p[1])), "{tiles:?}");
            // Ties in sequence order (the sort is stable).
            assert!(tiles
                .windows(2)
                .all(|p| w(&p[0]) != w(&p[1]) || p[0][0] < p[1][0]));
            let (mut a, mut b) = (tiles.clone(), plan.clone());
            a.sort();
            b.sort();
            assert_eq!(a, b);
        }
        assert_eq!(&q[..3], &[199, 192, 200]); // the 200-row sequence's last tile
        assert_eq!(&kv[..3], &[199, 0, 200]); // its first
    }
}
