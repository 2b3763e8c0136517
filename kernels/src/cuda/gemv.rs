//! The batch-invariant forward GEMMs `Y = X W^T`: the split-K decode kernels (a few
//! tokens, K split over blocks, the slices added in order) and the rows kernels
//! (any number of tokens, the same sums in the same order), FP8 and BF16.
//!
//! Two kernel families compute them; a device uses one, so rollout and training
//! agree bit for bit:
//! - wgmma (`gemm_wg.cu`, Hopper, the default there): E4M3 at twice the BF16 rate;
//!   a group's E4M3 sum keeps fewer bits than f32 (as cuBLASLt's on this hardware);
//! - mma.sync (`gemv_fp8.cu`, `gemm_rows.cu`; other GPUs, or `JET_WGMMA=0`): E4M3
//!   through f16 HMMA on sm_90, exact group sums.
//!
//! At decode sizes cuBLASLt's block-scaled GEMM is slower than BF16 (DEVICE.md:
//! 22.5 us vs 14.8 us at 64x4096x4096), so rollout speed has to come from moving
//! half the weight bytes: the decode kernels stream `N*K` bytes of W once and
//! compute the numbers of `fp8::fp8_gemm` (sums per 128-group, scaled per group).
//!
//! Operands are the quantizer's: X 1x128 (`[M_pad][K_pad]`, VEC128 scales
//! `[L][M_pad]`), W 128x128 blocks (`[N_pad][K_pad]`, scales `[ceil(N/128)][lds]`).

use std::sync::atomic::{AtomicU8, Ordering};

use cudarc::driver::CudaSlice;

use super::context::{Arg, Source, GEMV, ROWS, WG};
use super::quantize::Fp8Quantized;
use super::{check_len, ensure, Gpu, Result};
use crate::fp8::{Grouping, GROUP};

/// Tokens a block of the decode kernels covers (8 token tiles of 8).
pub const GEMV_MAX_TOKENS: usize = 64;

/// The linear layer's epilogue done by the rows kernel itself (`linear_epilogue`'s
/// ops: the total, then the bias, then the BF16 rounding when `round`, then the
/// residual `res [m][ldy]` added when not 0): `y [m][ldy]` at device address `y`
/// (0: no fused epilogue, write `d`). The split-K kernels leave it to `linear_epilogue`.
/// `bf16` (rounded, no residual): y holds the rounded values' BF16 bits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Epi {
    pub y: u64,
    pub ldy: usize,
    pub bias: u64,
    pub round: bool,
    pub res: u64,
    pub bf16: bool,
}

impl Epi {
    pub(crate) const NONE: Epi = Epi {
        y: 0,
        ldy: 0,
        bias: 0,
        round: false,
        res: 0,
        bf16: false,
    };

    /// The kernels' `round` argument: 0, 1, or EPI_BF16 (2, `common.cuh`).
    fn round_arg(&self) -> Arg {
        Arg::I(if self.bf16 { 2 } else { self.round as i32 })
    }
}

/// A kernel of `gemv_fp8.cu`: token tiles of 8, warps per block, m16 tiles per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvVariant {
    pub name: &'static str,
    pub warps: usize,
    pub m_tiles: usize,
}

const fn v(name: &'static str, warps: usize, m_tiles: usize) -> GemvVariant {
    GemvVariant {
        name,
        warps,
        m_tiles,
    }
}

/// Variants for 8, 16, 32 and 64 tokens; 64 tokens also as [`GEMV_T8_M1`].
pub const GEMV_VARIANTS: [GemvVariant; 4] = [
    v("gemv_fp8_t1_w8_m2", 8, 2),
    v("gemv_fp8_t2_w8_m2", 8, 2),
    v("gemv_fp8_t4_w8_m2", 8, 2),
    v("gemv_fp8_t8_w4_m2", 4, 2),
];
/// 64 tokens with 16 weight rows a block (more blocks, more reads of X).
pub const GEMV_T8_M1: GemvVariant = v("gemv_fp8_t8_w8_m1", 8, 1);

/// The kernel variant for `m` tokens.
fn variant(m: usize) -> GemvVariant {
    GEMV_VARIANTS[match m {
        0..=8 => 0,
        9..=16 => 1,
        17..=32 => 2,
        _ => 3,
    }]
}

/// Which decode kernel runs (the default is [`GemvKernel::SplitK`]; the others are
/// kept for the timings in NOTES.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvKernel {
    /// 128 weight rows a block, tokens staged in shared memory, K split over blocks.
    SplitK,
    /// The first version: 32 rows a block, K split over its warps, tokens from L2.
    Tiled(Option<GemvVariant>),
}

/// Partial sums of a split-K launch: `p[s][token][n]`, row stride `ldp`, slices
/// `sstride` apart, to be added in `s` order.
pub(crate) struct Partial {
    pub p: CudaSlice<f32>,
    pub ldp: usize,
    pub sstride: usize,
    pub splits: usize,
}

fn check(x: &Fp8Quantized, w: &Fp8Quantized) -> Result<()> {
    ensure(
        x.grouping == Grouping::Row1x128 && w.grouping == Grouping::Block128,
        || {
            format!(
                "decode GEMM wants X 1x128 and W 128x128, not {:?} and {:?}",
                x.grouping, w.grouping
            )
        },
    )?;
    ensure(x.cols == w.cols && x.cols_pad == w.cols_pad, || {
        format!("decode GEMM: X has K = {}, W has K = {}", x.cols, w.cols)
    })?;
    ensure(w.cols > 0, || "FP8 GEMM with K = 0".into())
}

/// An output of `len` values holds `[x.rows, w.rows]` with row stride `ld`.
fn check_out(x: &Fp8Quantized, w: &Fp8Quantized, len: usize, ld: usize) -> Result<()> {
    let (m, n) = (x.rows, w.rows);
    ensure(ld >= n && len >= m.saturating_sub(1) * ld + n, || {
        format!("FP8 GEMM output holds {len} values, fewer than [{m}, {n}] with stride {ld}")
    })
}

/// Weight rows a split-K block covers (4 warps of 16; the rows kernels take 128).
const SK_ROWS: usize = 64;

/// Fewest 128-value groups a K split takes (where K has that many).
///
/// Every split writes `[tokens, n]` f32 partial sums that the next kernel reads
/// back: at 64 tokens and two groups a split (the old rule), as many bytes as the
/// FP8 weights. Four groups halve them and the blocks, and cost little
/// parallelism (H100, 0.6B decode step: 2% faster
/// at batch 64, 9% at 256, all flows; 8B shapes 1.5-2.5%; three was slower at 64,
/// five and eight slower at 64 and faster at 256: `kernels/src/cuda/NOTES.md`,
/// thirtieth session).
const SK_MIN_GROUPS: usize = 4;

/// K splits and groups per split: about two split-K blocks per SM, each split at
/// least [`SK_MIN_GROUPS`] groups (streamed through the kernel's stages, several
/// groups' weight bytes in flight at once). It depends on the shape and
/// the GPU only, never on the number of tokens: the splits fix the order in which
/// a row's group sums are added, and [`gemm_fp8_rows`] repeats that order for any
/// batch (rollout and training agree bit for bit).
pub(crate) fn splits(gpu: &Gpu, n: usize, k_pad: usize) -> (usize, usize) {
    let l = k_pad.div_ceil(GROUP);
    let blocks_n = n.div_ceil(SK_ROWS);
    let ks = (2 * gpu.sm_count())
        .div_ceil(blocks_n)
        .clamp(1, (l / SK_MIN_GROUPS).max(1));
    let gps = l.div_ceil(ks);
    (l.div_ceil(gps), gps)
}

/// The element type of a batch-invariant forward GEMM's operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Elem {
    /// E4M3 codes with 1x128 (X) and 128x128 (W) scales.
    Fp8,
    /// BF16 values.
    Bf16,
}

impl Elem {
    /// Bytes of a row's 128-value group, and the stages of the wgmma split-K and
    /// rows kernels (`Fp8W` / `Bf16W` in `gemm_wg.cu`).
    fn wg_geometry(self) -> (u32, u32, u32) {
        match self {
            Elem::Fp8 => (128, 4, 5),
            Elem::Bf16 => (256, 3, 3),
        }
    }

    /// The split-K kernel for token tile `i` (8, 16, 32, 64 tokens): its module,
    /// name, and dynamic shared memory (`WgSkSmem::BYTES`: stages of a 64-row W tile
    /// and an X tile, the token scales, 1 KiB to align the tiles).
    fn sk(self, wgmma: bool, i: usize) -> (&'static Source, &'static str, u32) {
        if !wgmma {
            let names = match self {
                Elem::Fp8 => [
                    "gemv_fp8_sk_t1",
                    "gemv_fp8_sk_t2",
                    "gemv_fp8_sk_t4",
                    "gemv_fp8_sk_t8",
                ],
                Elem::Bf16 => [
                    "gemv_bf16_sk_t1",
                    "gemv_bf16_sk_t2",
                    "gemv_bf16_sk_t4",
                    "gemv_bf16_sk_t8",
                ],
            };
            return (&GEMV, names[i], 0);
        }
        let names = match self {
            Elem::Fp8 => [
                "wg_fp8_sk_n8",
                "wg_fp8_sk_n16",
                "wg_fp8_sk_n32",
                "wg_fp8_sk_n64",
            ],
            Elem::Bf16 => [
                "wg_bf16_sk_n8",
                "wg_bf16_sk_n16",
                "wg_bf16_sk_n32",
                "wg_bf16_sk_n64",
            ],
        };
        let (gb, s, _) = self.wg_geometry();
        let nt = 8u32 << i;
        (&WG, names[i], s * (64 + nt) * gb + s * nt * 4 + 1024)
    }

    /// The grouped twin of the wgmma split-K kernel for token tile `i` (`WG_SKG`:
    /// the same shared memory as [`Elem::sk`]'s).
    fn skg(self, i: usize) -> &'static str {
        let names = match self {
            Elem::Fp8 => [
                "wg_fp8_skg_n8",
                "wg_fp8_skg_n16",
                "wg_fp8_skg_n32",
                "wg_fp8_skg_n64",
            ],
            Elem::Bf16 => [
                "wg_bf16_skg_n8",
                "wg_bf16_skg_n16",
                "wg_bf16_skg_n32",
                "wg_bf16_skg_n64",
            ],
        };
        names[i]
    }

    /// The mma.sync rows kernel (GPUs without wgmma; `launch_rows_tma` has
    /// Hopper's): module, name, dynamic shared memory (`RowsSmem::BYTES`: S stages
    /// of a 128-row W tile, a 128-token X tile and 128 token scales, plus (FP8) two
    /// f16 token tiles of 128 rows x 272 bytes).
    fn rows(self) -> (&'static Source, &'static str, u32) {
        let stage = |gb: u32| 128 * gb + 128 * gb + 128 * 4;
        match self {
            Elem::Fp8 => (&ROWS, "gemm_fp8_rows", 4 * stage(128) + 2 * 128 * 272),
            Elem::Bf16 => (&ROWS, "gemm_bf16_rows", 3 * stage(256)),
        }
    }
}

/// What the split-K and rows kernels read (`gemm_sk` in `gemv_fp8.cu`, `wg_sk` in
/// `gemm_wg.cu`): W and X from token `m0` on, with their FP8 scales (none for BF16),
/// and the shapes.
pub(crate) struct SkOps {
    pub elem: Elem,
    /// W values, W scales (0 for BF16), the scales' stride.
    pub w: (u64, u64, i32),
    /// X values from token `m0` on, their scales (0 for BF16), the scales' stride.
    pub x: (u64, u64, i32),
    /// X rows from `m0`.
    pub m: usize,
    pub n: usize,
    pub n_pad: usize,
    pub k_pad: usize,
}

impl SkOps {
    fn fp8(gpu: &Gpu, x: &Fp8Quantized, w: &Fp8Quantized, m0: usize) -> SkOps {
        SkOps {
            elem: Elem::Fp8,
            w: (gpu.ptr(&w.codes), gpu.ptr(&w.scales), w.lds as i32),
            x: (
                gpu.ptr(&x.codes) + (m0 * x.cols_pad) as u64,
                gpu.ptr(&x.scales) + (m0 * 4) as u64,
                x.rows_pad as i32,
            ),
            m: x.rows - m0,
            n: w.rows,
            n_pad: w.rows_pad,
            k_pad: w.cols_pad,
        }
    }

    /// The operand arguments every kernel of `gemv_fp8.cu` starts with: W codes,
    /// scales and their stride, then X, its scales and their stride.
    fn args(&self) -> [Arg; 6] {
        [
            Arg::P(self.w.0),
            Arg::P(self.w.1),
            Arg::I(self.w.2),
            Arg::P(self.x.0),
            Arg::P(self.x.1),
            Arg::I(self.x.2),
        ]
    }

    /// The first `m` tokens only.
    pub(crate) fn first(mut self, m: usize) -> SkOps {
        self.m = self.m.min(m);
        self
    }

    /// The arguments of `gemv_*_sk_*`: `mc` tokens into the partials at `p` (row
    /// stride `ldp`, slices `sstride` apart), `gps` groups a split.
    fn sk_args(&self, mc: usize, (p, ldp, sstride): (u64, usize, usize), gps: usize) -> Vec<Arg> {
        let mut a = self.args().to_vec();
        a.extend([Arg::P(p), Arg::L(ldp as i64), Arg::L(sstride as i64)]);
        a.extend(self.shape(mc, gps));
        a
    }

    /// The arguments of `gemm_*_rows`: all tokens into `d` (row stride `ldd`), or
    /// through `epi` into its `y`.
    fn rows_args(&self, (d, ldd): (u64, usize), gps: usize, epi: Epi) -> Vec<Arg> {
        let mut a = self.args().to_vec();
        a.extend([Arg::P(d), Arg::L(ldd as i64)]);
        a.extend(self.shape(self.m, gps));
        a.extend([
            Arg::P(epi.y),
            Arg::L(epi.ldy as i64),
            Arg::P(epi.bias),
            epi.round_arg(),
            Arg::P(epi.res),
        ]);
        a
    }

    /// M, N, N_pad, K_pad and the groups a split.
    fn shape(&self, m: usize, gps: usize) -> [Arg; 5] {
        [
            Arg::I(m as i32),
            Arg::I(self.n as i32),
            Arg::I(self.n_pad as i32),
            Arg::I(self.k_pad as i32),
            Arg::I(gps as i32),
        ]
    }
}

/// Launch the split-K kernel for the first `mc` tokens of `ops` (chunks of 64
/// tokens on grid z) into `p`; returns the number of splits.
pub(crate) fn launch_sk(
    gpu: &Gpu,
    ops: &SkOps,
    mc: usize,
    (p, ldp, sstride): (u64, usize, usize),
) -> Result<usize> {
    let n = ops.n;
    let (ks, gps) = splits(gpu, n, ops.k_pad);
    let (src, name, smem) = ops.elem.sk(gpu.wgmma(), sk_tile(mc));
    let chunks = mc.div_ceil(GEMV_MAX_TOKENS);
    gpu.launch(
        src,
        name,
        (n.div_ceil(SK_ROWS) as u32, ks as u32, chunks as u32),
        ((SK_ROWS / 16 * 32) as u32, 1, 1),
        smem,
        &ops.sk_args(mc, (p, ldp, sstride), gps),
    )?;
    Ok(ks)
}

/// A by-value kernel argument in its C layout: fields appended in order, each at
/// its natural alignment (8-byte fields first keeps it packed).
#[derive(Default)]
pub(crate) struct CStruct(pub Vec<u8>);

impl CStruct {
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend(v.to_le_bytes());
        self
    }
    /// Zeros up to `n` bytes (unused trailing entries).
    pub fn pad_to(&mut self, n: usize) -> &mut Self {
        self.0.resize(n.max(self.0.len()), 0);
        self
    }
    pub fn arg(&self) -> Result<Arg> {
        let mut a = [0u8; 256];
        ensure(self.0.len() <= a.len(), || {
            format!("a by-value kernel argument of {} bytes", self.0.len())
        })?;
        a[..self.0.len()].copy_from_slice(&self.0);
        Ok(Arg::S(a))
    }
}

/// Bytes of one `SkProb` (`gemm_wg.cu`); `SkGroup` holds three and a count.
const SK_PROB_BYTES: usize = 64;

/// [`partial`] for up to three problems of one X (same tokens, same K: the q, k, v
/// or gate, up projections) in one launch of `wg_*_skg_*` (`gemm_wg.cu`, wgmma
/// GPUs): each problem's blocks are those of its own split-K launch, so each
/// partial holds the same bits.
pub(crate) fn partial_group(gpu: &Gpu, ops: &[SkOps]) -> Result<Vec<Partial>> {
    ensure(gpu.wgmma() && (1..=3).contains(&ops.len()), || {
        format!("a grouped split-K launch of {} problems", ops.len())
    })?;
    let o0 = &ops[0];
    ensure(
        ops.iter()
            .all(|o| o.elem == o0.elem && o.x == o0.x && o.m == o0.m && o.k_pad == o0.k_pad),
        || "a grouped split-K launch reads one X".into(),
    )?;
    let (m, nz) = (o0.m, o0.m.div_ceil(GEMV_MAX_TOKENS));
    let (mut g, mut parts, mut blocks) = (CStruct::default(), vec![], 0);
    for o in ops {
        let (ks, gps) = splits(gpu, o.n, o.k_pad);
        let nbx = o.n.div_ceil(SK_ROWS);
        let p = gpu.uninit::<f32>(ks * m * o.n)?;
        g.u64(o.w.0).u64(o.w.1).u64(gpu.ptr(&p));
        g.i64(o.n as i64).i64((m * o.n) as i64);
        g.i32(o.w.2).i32(o.n as i32).i32(o.n_pad as i32);
        g.i32(gps as i32)
            .i32(nbx as i32)
            .i32((nbx * ks * nz) as i32);
        blocks += nbx * ks * nz;
        parts.push(Partial {
            p,
            ldp: o.n,
            sstride: m * o.n,
            splits: ks,
        });
    }
    g.pad_to(3 * SK_PROB_BYTES).i32(ops.len() as i32).i32(0);
    let tile = sk_tile(m);
    let (_, _, smem) = o0.elem.sk(true, tile);
    gpu.launch(
        &WG,
        o0.elem.skg(tile),
        (blocks as u32, 1, 1),
        ((SK_ROWS / 16 * 32) as u32, 1, 1),
        smem,
        &[
            g.arg()?,
            Arg::P(o0.x.0),
            Arg::P(o0.x.1),
            Arg::I(o0.x.2),
            Arg::I(m as i32),
            Arg::I(o0.k_pad as i32),
            Arg::I(nz as i32),
        ],
    )?;
    Ok(parts)
}

/// The split-K kernel's token tile for `mc` tokens: 8, 16, 32 or 64 (index 0..4).
fn sk_tile(mc: usize) -> usize {
    match mc {
        0..=8 => 0,
        9..=16 => 1,
        17..=32 => 2,
        _ => 3,
    }
}

/// Partial sums of the split-K kernel for all tokens of `ops` (the caller adds
/// the slices in order).
pub(crate) fn partial(gpu: &Gpu, ops: &SkOps) -> Result<Partial> {
    if gpu.wgmma() && ops.m > GEMV_MAX_TOKENS {
        // One problem of the grouped kernel: the same blocks and sums, with a weight
        // tile's token chunks side by side, so its second read comes from L2 (in
        // grid-z order a weight larger than L2, the 8B down projection's 100 MB,
        // would come from DRAM once per 64 tokens).
        let mut p = partial_group(gpu, std::slice::from_ref(ops))?;
        return p
            .pop()
            .ok_or_else(|| super::CudaError::Invalid("no partial".into()));
    }
    let (m, n) = (ops.m, ops.n);
    let (ks, _) = splits(gpu, n, ops.k_pad);
    let p = gpu.uninit::<f32>(ks * m * n)?;
    let splits = launch_sk(gpu, ops, m, (gpu.ptr(&p), n, m * n))?;
    Ok(Partial {
        p,
        ldp: n,
        sstride: m * n,
        splits,
    })
}

/// The rows kernel over all tokens of `ops` into `d` (row stride `ldd`), or
/// through `epi`.
pub(crate) fn launch_rows(gpu: &Gpu, ops: &SkOps, (d, ldd): (u64, usize), epi: Epi) -> Result<()> {
    if ops.m == 0 {
        return Ok(());
    }
    let (_, gps) = splits(gpu, ops.n, ops.k_pad);
    if gpu.wgmma() {
        return launch_rows_tma(gpu, ops, (d, ldd), gps, epi);
    }
    let (src, name, smem) = ops.elem.rows();
    gpu.launch(
        src,
        name,
        (
            ops.m.div_ceil(ROWS_TOKENS) as u32,
            ops.n.div_ceil(128) as u32,
            1,
        ),
        (256, 1, 1),
        smem,
        &ops.rows_args((d, ldd), gps, epi),
    )
}

/// `wg_rows_tma` (`gemm_wg.cu`): the wgmma rows kernel's sums, its operands read
/// through tensor maps, one persistent block an SM walking the 128 x 128 tiles.
/// Dynamic shared memory: `WgTmaSmem::BYTES` (S stages of both tiles, the token
/// scales, a full and an empty barrier a stage, 8 epilogue tiles, 1 KiB to align).
fn launch_rows_tma(
    gpu: &Gpu,
    ops: &SkOps,
    (d, ldd): (u64, usize),
    gps: usize,
    epi: Epi,
) -> Result<()> {
    use super::tma::{tensor_map_2d, TmaElem};
    let (gb, _, s) = ops.elem.wg_geometry();
    let (name, elem, epp) = match ops.elem {
        Elem::Fp8 => ("wg_fp8_rows_tma", TmaElem::U8, 128),
        Elem::Bf16 => ("wg_bf16_rows_tma", TmaElem::Bf16, 64),
    };
    let kp = ops.k_pad;
    let tw = tensor_map_2d(elem, ops.w.0, (ops.n_pad, kp, kp), (epp, 128), 128)?;
    let tx = tensor_map_2d(elem, ops.x.0, (ops.m, kp, kp), (epp, 128), 128)?;
    // The token scales `[L][ldxs]` (FP8); BF16 has none and never reads the map.
    let txs = match ops.elem {
        Elem::Fp8 => tensor_map_2d(
            TmaElem::F32,
            ops.x.1,
            (kp.div_ceil(GROUP), ops.m, ops.x.2 as usize),
            (128, 1),
            0,
        )?,
        Elem::Bf16 => tw,
    };
    // The BF16 output `[m][ldy]` as the boxes the warps' epilogue tiles are
    // (gemm_wg.cu's tma_store_2d): FP8 64 columns x 16 tokens in the 128-byte
    // swizzle, BF16 16 columns x 64 tokens in the 32-byte one. Unaligned outputs
    // (or none) keep the warps' own stores (ty_ok 0, the map unread).
    let (ybox, yswizzle) = match ops.elem {
        Elem::Fp8 => ((64, 16), 128),
        Elem::Bf16 => ((16, 64), 32),
    };
    let aligned = epi.bf16 && epi.y.is_multiple_of(16) && epi.ldy.is_multiple_of(8);
    let ty = aligned
        .then(|| {
            tensor_map_2d(
                TmaElem::Bf16,
                epi.y,
                (ops.m, ops.n, epi.ldy),
                ybox,
                yswizzle,
            )
        })
        .transpose()?;
    let tiles = ops.m.div_ceil(ROWS_TOKENS) * ops.n.div_ceil(128);
    gpu.launch(
        &WG,
        name,
        (tiles.min(gpu.sm_count()) as u32, 1, 1),
        (384, 1, 1),
        // WgTmaSmem::BYTES: the stages, scales and barriers (to 1 KiB), 8 warps' two
        // epilogue tiles of EPI_STAGE (2 KiB), 1 KiB to align (FP8 200,704 bytes,
        // BF16 232,448: 227 KiB, the most a block may have).
        (s * 256 * gb + s * 128 * 4 + 2 * s * 8).next_multiple_of(1024) + 2 * 8 * 2048 + 1024,
        &[
            Arg::T(tw),
            Arg::T(tx),
            Arg::T(txs),
            Arg::P(ops.w.1),
            Arg::I(ops.w.2),
            Arg::P(d),
            Arg::L(ldd as i64),
            Arg::I(ops.m as i32),
            Arg::I(ops.n as i32),
            Arg::I(kp as i32),
            Arg::I(gps as i32),
            Arg::P(epi.y),
            Arg::L(epi.ldy as i64),
            Arg::P(epi.bias),
            epi.round_arg(),
            Arg::P(epi.res),
            Arg::T(ty.unwrap_or(tw)),
            Arg::I(ty.is_some() as i32),
        ],
    )
}

/// `y [m][ldy]` (at `yc`) = the in-order sum of `splits` slices of `ws`
/// (`[m][n]` each).
pub(crate) fn splitk_sum(
    gpu: &Gpu,
    ws: u64,
    splits: usize,
    (m, n): (usize, usize),
    yc: u64,
    ldy: usize,
) -> Result<()> {
    gpu.launch(
        &GEMV,
        "splitk_sum",
        ((m * n).div_ceil(256) as u32, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::P(ws),
            Arg::L(n as i64),
            Arg::L((m * n) as i64),
            Arg::I(splits as i32),
            Arg::I(m as i32),
            Arg::I(n as i32),
            Arg::P(yc),
            Arg::L(ldy as i64),
        ],
    )
}

/// Partial sums of the split-K kernel for all of `x`'s tokens, 64 a block on grid z
/// (the linear layer adds the slices in its epilogue).
pub(crate) fn gemv_fp8_partial(gpu: &Gpu, x: &Fp8Quantized, w: &Fp8Quantized) -> Result<Partial> {
    check(x, w)?;
    partial(gpu, &SkOps::fp8(gpu, x, w, 0))
}

/// [`gemv_fp8_partial`] for up to three weights in one launch ([`partial_group`]).
pub(crate) fn gemv_fp8_partial_group(
    gpu: &Gpu,
    x: &Fp8Quantized,
    ws: &[&Fp8Quantized],
) -> Result<Vec<Partial>> {
    let mut ops = vec![];
    for w in ws {
        check(x, w)?;
        ops.push(SkOps::fp8(gpu, x, w, 0));
    }
    partial_group(gpu, &ops)
}

/// Dynamic shared memory of `wg_fp8_gate_up_swiglu` (`GuSmem::BYTES` in
/// `gate_up_swiglu.cu`): five stages of gate's and up's 128-row boxes and a
/// 64-token X box, the stages' token scales and barriers, the alignment slack.
const GU_SMEM: u32 = 5 * (2 * 128 * 128 + 64 * 128) + 5 * 64 * 4 + 5 * 8 + 1024;

/// When [`gate_up_swiglu_fp8`] runs in place of the grouped split-K kernel and
/// `swiglu_sk_operand` (the same bits either way): 0 never, 1 always (where it
/// fits), 2 where its grid (one block a 128-row group of gate) covers at least half
/// the SMs. From `JET_GU_FUSED` (0 or 1; else 2) until [`set_gate_up_fused`].
/// H200, fp8 batch 64: at Qwen3-8B's widths (96 blocks) the rollout drew 3.7-3.8%
/// more tokens/s; at 0.6B's (24 blocks) its decode graphs took 3.3% longer
/// (BENCHMARKS, thirty-fifth session).
static GU_FUSED: AtomicU8 = AtomicU8::new(u8::MAX);

/// Overrides `JET_GU_FUSED` for the process: `Some(true)` takes the one-launch
/// gate/up/SwiGLU kernel wherever it fits, `Some(false)` never, `None` by its grid
/// (tests run it at widths the automatic choice leaves to the split path).
pub fn set_gate_up_fused(on: Option<bool>) {
    GU_FUSED.store(on.map_or(2, u8::from), Ordering::Relaxed);
}

/// Whether [`gate_up_swiglu_fp8`] takes `m` tokens through gate and up `[n, k]`:
/// a wgmma GPU, a decode batch (at most [`GEMV_MAX_TOKENS`] rows), whole 128-row
/// groups, and [`GU_FUSED`]'s choice.
pub(crate) fn gate_up_swiglu_fits(gpu: &Gpu, m: usize, n: usize) -> bool {
    let mut mode = GU_FUSED.load(Ordering::Relaxed);
    if mode == u8::MAX {
        mode = match std::env::var("JET_GU_FUSED").as_deref().map(str::trim) {
            Ok("0") => 0,
            Ok("1") => 1,
            _ => 2,
        };
        GU_FUSED.store(mode, Ordering::Relaxed);
    }
    gpu.wgmma()
        && (1..=GEMV_MAX_TOKENS).contains(&m)
        && n > 0
        && n.is_multiple_of(GROUP)
        && (mode == 1 || (mode == 2 && 2 * (n / GROUP) >= gpu.sm_count()))
}

/// Gate and up of `x` (at most [`GEMV_MAX_TOKENS`] tokens), SwiGLU and the down
/// projection's operand in one launch of `wg_fp8_gate_up_swiglu`
/// (`gate_up_swiglu.cu`): one block a 1x128 group of h, its gate and up rows
/// unsplit, with [`partial_group`]'s sums in [`splits`]' slice order, so the bits
/// of that launch and `swiglu_sk_operand`. `h [m, n]` (`n` = gate's rows);
/// `op`: the operand's arguments after h (`FusedOperand::args`).
pub(crate) fn gate_up_swiglu_fp8(
    gpu: &Gpu,
    x: &Fp8Quantized,
    (gate, up): (&Fp8Quantized, &Fp8Quantized),
    h: &CudaSlice<f32>,
    op: &[Arg],
) -> Result<()> {
    use super::tma::{tensor_map_2d, TmaElem};
    check(x, gate)?;
    check(x, up)?;
    let (m, n) = (x.rows, gate.rows);
    ensure(
        up.rows == n && up.rows_pad == gate.rows_pad && up.lds == gate.lds,
        || {
            format!(
                "gate [{n}, {}] and up [{}, {}] differ",
                gate.cols, up.rows, up.cols
            )
        },
    )?;
    ensure(gate_up_swiglu_fits(gpu, m, n), || {
        format!(
            "the fused gate/up/SwiGLU kernel does not take {m} tokens of [{n}, {}]",
            gate.cols
        )
    })?;
    check_len("swiglu h", h, m * n, format!("[{m}, {n}]"))?;
    let (g, u) = (SkOps::fp8(gpu, x, gate, 0), SkOps::fp8(gpu, x, up, 0));
    let (kp, l) = (g.k_pad, g.k_pad.div_ceil(GROUP));
    let (_, gps) = splits(gpu, n, kp);
    let tg = tensor_map_2d(TmaElem::U8, g.w.0, (g.n_pad, kp, kp), (128, 128), 128)?;
    let tu = tensor_map_2d(TmaElem::U8, u.w.0, (u.n_pad, kp, kp), (128, 128), 128)?;
    let tx = tensor_map_2d(TmaElem::U8, g.x.0, (m, kp, kp), (128, 64), 128)?;
    let txs = tensor_map_2d(TmaElem::F32, g.x.1, (l, m, g.x.2 as usize), (64, 1), 0)?;
    gpu.launch(
        &WG,
        "wg_fp8_gate_up_swiglu",
        ((n / GROUP) as u32, 1, 1),
        (512, 1, 1),
        GU_SMEM,
        &[
            &[
                Arg::T(tg),
                Arg::T(tu),
                Arg::T(tx),
                Arg::T(txs),
                Arg::P(g.w.1),
                Arg::P(u.w.1),
                Arg::I(g.w.2),
                Arg::I(m as i32),
                Arg::I(kp as i32),
                Arg::I(gps as i32),
                Arg::I(n as i32),
                Arg::P(gpu.ptr(h)),
            ][..],
            op,
        ]
        .concat(),
    )
}

/// `d [M][ldd] = x [M, K] w [N, K]^T` for any number of tokens in one launch, each
/// row's group sums added in the order of the split-K kernel ([`splits`]): a row's
/// bits equal the decode kernel's whatever the batch. No workspace.
pub fn gemm_fp8_rows(
    gpu: &Gpu,
    x: &Fp8Quantized,
    w: &Fp8Quantized,
    d: &CudaSlice<f32>,
    ldd: usize,
) -> Result<()> {
    check(x, w)?;
    check_out(x, w, d.len(), ldd)?;
    let ops = SkOps::fp8(gpu, x, w, 0);
    launch_rows(gpu, &ops, (gpu.ptr(d), ldd), Epi::NONE)
}

/// [`gemm_fp8_rows`] with BF16 outputs (the rounded sums' bits, `y [m][ldy]`), as
/// a training pass writes the projections without a residual.
pub fn gemm_fp8_rows_bf16(
    gpu: &Gpu,
    x: &Fp8Quantized,
    w: &Fp8Quantized,
    y: &CudaSlice<u16>,
    ldy: usize,
) -> Result<()> {
    check(x, w)?;
    check_out(x, w, y.len(), ldy)?;
    let epi = Epi {
        y: gpu.ptr(y),
        ldy,
        round: true,
        bf16: true,
        ..Epi::NONE
    };
    gemm_fp8_rows_fused(gpu, x, w, epi)
}

/// [`gemm_fp8_rows`] with the linear layer's epilogue fused (`epi.y`).
pub(crate) fn gemm_fp8_rows_fused(
    gpu: &Gpu,
    x: &Fp8Quantized,
    w: &Fp8Quantized,
    epi: Epi,
) -> Result<()> {
    check(x, w)?;
    check_out(x, w, usize::MAX, epi.ldy)?;
    let ops = SkOps::fp8(gpu, x, w, 0);
    launch_rows(gpu, &ops, (0, 0), epi)
}

/// Tokens a rows-kernel block covers.
const ROWS_TOKENS: usize = 128;

/// Whether the split-K kernel is faster than [`gemm_fp8_rows`] for `m` tokens: the
/// rows kernel has one block per 128 tokens x 128 outputs, and split-K pays where
/// those blocks would fill under a quarter of the SMs ([`split_k_div`]). Either
/// path gives the same bits (the splits' order is the rows kernel's), so the rule
/// is speed alone. Measured (H100, `cuda_timing split_k_rule_timing`, fifty-sixth
/// session): at 0.6B and 8B widths, 128-2,048 tokens, both precisions, with and
/// without the residual, this rule's picks sum to within 0.4% of the faster path
/// at every point; the old rule (under all the SMs) sent up to 128 tiles to
/// split-K, 2-4x slower than the rows kernel there (a GRPO micro-batch's k, v, o
/// and down at 1,152 rows).
pub(crate) fn split_k_pays(gpu: &Gpu, m: usize, n: usize) -> bool {
    let tiles = m.div_ceil(ROWS_TOKENS) * n.div_ceil(128);
    tiles.saturating_mul(split_k_div()) < gpu.sm_count()
}

/// 0: not read yet.
static SPLIT_K_DIV: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// [`split_k_pays`]'s divisor: `JET_SPLITK_DIV` (a measurement switch; 1 was the
/// rule until the fifty-sixth session), else 4.
fn split_k_div() -> usize {
    use std::sync::atomic::Ordering::Relaxed;
    match SPLIT_K_DIV.load(Relaxed) {
        0 => {
            let d = std::env::var("JET_SPLITK_DIV")
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&d| d > 0)
                .unwrap_or(4);
            SPLIT_K_DIV.store(d, Relaxed);
            d
        }
        d => d,
    }
}

/// Set [`split_k_pays`]'s divisor for this process (timings that compare the two
/// paths at one shape; 0 reads `JET_SPLITK_DIV` again).
#[doc(hidden)]
pub fn set_split_k_div(d: usize) {
    SPLIT_K_DIV.store(d, std::sync::atomic::Ordering::Relaxed);
}

/// `y [M][ldy] = x [M, K] w [N, K]^T` for quantized `x` (1x128) and `w` (blocks);
/// writes columns `0..N` of rows `0..M`, [`GEMV_MAX_TOKENS`] tokens a launch.
pub fn gemv_fp8_into(
    gpu: &Gpu,
    x: &Fp8Quantized,
    w: &Fp8Quantized,
    y: &mut CudaSlice<f32>,
    ldy: usize,
) -> Result<()> {
    gemv_fp8_with(gpu, x, w, y, ldy, GEMV_MAX_TOKENS, GemvKernel::SplitK)
}

/// [`gemv_fp8_into`] with a chosen kernel and tokens per launch (timings).
#[doc(hidden)]
pub fn gemv_fp8_with(
    gpu: &Gpu,
    x: &Fp8Quantized,
    w: &Fp8Quantized,
    y: &mut CudaSlice<f32>,
    ldy: usize,
    chunk: usize,
    kernel: GemvKernel,
) -> Result<()> {
    check(x, w)?;
    check_out(x, w, y.len(), ldy)?;
    let (m, n) = (x.rows, w.rows);
    let chunk = chunk.clamp(1, GEMV_MAX_TOKENS);
    let yp = gpu.ptr(y);
    // One workspace for every chunk (the splits do not depend on the chunk).
    let ks = splits(gpu, n, w.cols_pad).0;
    let ws = match kernel {
        GemvKernel::Tiled(_) => None,
        GemvKernel::SplitK => (ks > 1)
            .then(|| gpu.uninit::<f32>(ks * chunk * n))
            .transpose()?,
    };
    let mut m0 = 0;
    while m0 < m {
        let mc = chunk.min(m - m0);
        let yc = yp + (m0 * ldy * 4) as u64;
        match kernel {
            GemvKernel::Tiled(full) => tiled(gpu, x, w, m0, mc, yc, ldy, full)?,
            GemvKernel::SplitK => {
                let ops = SkOps::fp8(gpu, x, w, m0);
                match &ws {
                    Some(ws) => {
                        launch_sk(gpu, &ops, mc, (gpu.ptr(ws), n, mc * n))?;
                        splitk_sum(gpu, gpu.ptr(ws), ks, (mc, n), yc, ldy)?;
                    }
                    None => {
                        launch_sk(gpu, &ops, mc, (yc, ldy, 0))?;
                    }
                }
            }
        }
        m0 += mc;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn tiled(
    gpu: &Gpu,
    x: &Fp8Quantized,
    w: &Fp8Quantized,
    m0: usize,
    mc: usize,
    yc: u64,
    ldy: usize,
    full: Option<GemvVariant>,
) -> Result<()> {
    let n = w.rows;
    let var = match full {
        Some(f) if mc > 32 => f,
        _ => variant(mc),
    };
    gpu.launch(
        &GEMV,
        var.name,
        (n.div_ceil(16 * var.m_tiles) as u32, 1, 1),
        ((var.warps * 32) as u32, 1, 1),
        0,
        &[
            &SkOps::fp8(gpu, x, w, m0).args()[..],
            &[
                Arg::P(yc),
                Arg::L(ldy as i64),
                Arg::I(mc as i32),
                Arg::I(n as i32),
                Arg::I(w.rows_pad as i32),
                Arg::I(w.cols_pad as i32),
            ],
        ]
        .concat(),
    )
}
