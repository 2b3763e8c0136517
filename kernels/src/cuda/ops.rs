//! Embedding, RMSNorm, RoPE and SwiGLU on the GPU, forward and backward, with the
//! signatures of the CPU ops (`crate::ops`) over device buffers. Results equal
//! the CPU's to f32 rounding: gathers, rope and the embedding scatter are
//! bit-exact; reductions (RMSNorm sums, column sums) differ only in summation order.

use cudarc::driver::CudaSlice;

use super::act::ActRef;
use super::context::{Arg, OPS};
use super::grad::ScatterDest;
use super::{check_len, ensure, CudaError, Gpu, Result};
use crate::ops::rope::RopeTable;

fn grid1(n: usize) -> (u32, u32, u32) {
    (n.div_ceil(256) as u32, 1, 1)
}

/// Forward: `table [vocab, dim]`, `tokens [n]` -> `out [n, dim]`. Tokens are
/// checked against the vocabulary here (an error, not a fault on the device).
pub fn embedding_forward(
    gpu: &Gpu,
    table: &CudaSlice<f32>,
    vocab: usize,
    dim: usize,
    tokens: &[u32],
) -> Result<CudaSlice<f32>> {
    let dtok = upload_tokens(gpu, tokens, vocab)?;
    embedding_forward_dev(gpu, table, vocab, dim, &dtok, tokens.len())
}

/// [`embedding_forward`] of `n` tokens already on the device (`tokens [n]`, i32,
/// checked against the vocabulary by whoever wrote them): a CUDA graph replays it
/// with new tokens in the same buffer.
pub fn embedding_forward_dev(
    gpu: &Gpu,
    table: &CudaSlice<f32>,
    vocab: usize,
    dim: usize,
    tokens: &CudaSlice<i32>,
    n: usize,
) -> Result<CudaSlice<f32>> {
    check_len(
        "embedding table",
        table,
        vocab * dim,
        format!("[{vocab}, {dim}]"),
    )?;
    check_len("embedding tokens", tokens, n, format!("[{n}]"))?;
    let out = gpu.uninit::<f32>(n * dim)?;
    gpu.launch(
        &OPS,
        "embedding_fwd",
        grid1(n * dim),
        (256, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(table)),
            Arg::P(gpu.ptr(tokens)),
            Arg::I(n as i32),
            Arg::I(dim as i32),
            Arg::P(gpu.ptr(&out)),
        ],
    )?;
    Ok(out)
}

/// The tokens as the device kernels take them (i32), after checking each
/// against the vocabulary.
pub fn upload_tokens(gpu: &Gpu, tokens: &[u32], vocab: usize) -> Result<CudaSlice<i32>> {
    check_tokens("embedding", tokens, vocab)?;
    gpu.upload(&tokens.iter().map(|&t| t as i32).collect::<Vec<_>>())
}

/// Positions as the RoPE kernel takes them (i32), after checking each against
/// the table.
pub fn upload_positions(gpu: &Gpu, positions: &[usize], t: &GpuRope) -> Result<CudaSlice<i32>> {
    check_positions(positions, t)?;
    gpu.upload(&positions.iter().map(|&p| p as i32).collect::<Vec<_>>())
}

/// Every token below `vocab`, or an error naming the first that is not.
pub fn check_tokens(what: &str, tokens: &[u32], vocab: usize) -> Result<()> {
    match tokens.iter().position(|&t| t as usize >= vocab) {
        Some(i) => Err(super::CudaError::Invalid(format!(
            "{what}: token {} at position {i} is outside the vocabulary of {vocab}",
            tokens[i]
        ))),
        None => Ok(()),
    }
}

/// Backward: accumulates (`+=`) the rows of `dy [n, dim]` into `dtable [vocab, dim]`
/// at `tokens [n]`, each table row in token order (deterministic, bit-exact).
pub fn embedding_backward(
    gpu: &Gpu,
    dtable: &mut CudaSlice<f32>,
    vocab: usize,
    dim: usize,
    tokens: &[u32],
    dy: &CudaSlice<f32>,
) -> Result<()> {
    embedding_backward_marked(gpu, (dtable, None), vocab, dim, tokens, dy)
}

/// [`embedding_backward`] into a gradient with a chunk mask
/// (`grad::GradAcc::f32_marked_mut`): the chunks it writes (`grad::MASK_CHUNK`
/// values each) are marked in `mask [ceil(vocab * dim / MASK_CHUNK)]`.
pub fn embedding_backward_marked(
    gpu: &Gpu,
    (acc, mask): (&mut CudaSlice<f32>, Option<&mut CudaSlice<u8>>),
    vocab: usize,
    dim: usize,
    tokens: &[u32],
    dy: &CudaSlice<f32>,
) -> Result<()> {
    let held = Vec::new();
    let dest = ScatterDest { acc, mask, held };
    embedding_backward_into(gpu, dest, vocab, dim, tokens, dy)
}

/// Held addends `embedding_bwd` takes at most (ops.cu's EMB_HELD_MAX, held to
/// `grad::HOLD_MAX` by a test).
pub const EMB_HELD_MAX: usize = 8;

/// [`embedding_backward_marked`] into a gradient that may hold BF16 addends
/// (`grad::GradAcc::f32_scatter_mut`: the tied LM head's WGrad outputs): each row
/// it writes takes them first, in order, and they are zeroed there.
pub fn embedding_backward_into(
    gpu: &Gpu,
    ScatterDest {
        acc: dtable,
        mask,
        held,
    }: ScatterDest,
    vocab: usize,
    dim: usize,
    tokens: &[u32],
    dy: &CudaSlice<f32>,
) -> Result<()> {
    check_len(
        "embedding dtable",
        dtable,
        vocab * dim,
        format!("[{vocab}, {dim}]"),
    )?;
    if let Some(m) = mask.as_deref() {
        super::grad::check_mask("embedding dtable's chunk mask", m, vocab * dim)?;
    }
    let mask = mask.map_or(0, |m| gpu.ptr(m));
    check_len(
        "embedding dy",
        dy,
        tokens.len() * dim,
        format!("[{}, {dim}]", tokens.len()),
    )?;
    check_tokens("embedding backward", tokens, vocab)?;
    // The held addends' addresses as arguments (embedding_bwd's d0 .. d7).
    ensure(held.len() <= EMB_HELD_MAX, || {
        format!(
            "embedding backward: {} held gradient addends (at most {EMB_HELD_MAX})",
            held.len()
        )
    })?;
    // Positions grouped by token (CSR), each group in token order.
    let mut order: Vec<usize> = (0..tokens.len()).collect();
    order.sort_by_key(|&i| (tokens[i], i));
    let (mut uniq, mut off, mut pos) = (Vec::new(), vec![0i32], Vec::with_capacity(order.len()));
    for (j, &i) in order.iter().enumerate() {
        if j == 0 || tokens[i] != tokens[order[j - 1]] {
            if j > 0 {
                off.push(j as i32);
            }
            uniq.push(tokens[i] as i32);
        }
        pos.push(i as i32);
    }
    off.push(order.len() as i32);
    if uniq.is_empty() {
        return Ok(());
    }
    let (du, doff, dpos) = (gpu.upload(&uniq)?, gpu.upload(&off)?, gpu.upload(&pos)?);
    let mut args = vec![
        Arg::P(gpu.ptr(&du)),
        Arg::P(gpu.ptr(&doff)),
        Arg::P(gpu.ptr(&dpos)),
        Arg::I(uniq.len() as i32),
        Arg::P(gpu.ptr(dy)),
        Arg::I(dim as i32),
        Arg::P(gpu.ptr(dtable)),
        Arg::P(mask),
        Arg::I(held.len() as i32),
    ];
    // d0 .. d7: the held addends, null past them.
    args.extend((0..EMB_HELD_MAX).map(|j| Arg::P(held.get(j).copied().unwrap_or(0))));
    let grid = (uniq.len() as u32, dim.div_ceil(128) as u32, 1);
    gpu.launch(&OPS, "embedding_bwd", grid, (128, 1, 1), 0, &args)
}

/// Forward: `x [rows, dim]`, `w [dim]` -> `(y [rows, dim], rstd [rows])`.
pub fn rmsnorm_forward(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    rows: usize,
    dim: usize,
    eps: f64,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    check_len("rmsnorm x", x, rows * dim, format!("[{rows}, {dim}]"))?;
    check_len("rmsnorm w", w, dim, format!("[{dim}]"))?;
    let y = gpu.uninit::<f32>(rows * dim)?;
    let rstd = gpu.uninit::<f32>(rows)?;
    gpu.launch(
        &OPS,
        "rmsnorm_fwd",
        (rows as u32, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(x)),
            Arg::P(gpu.ptr(w)),
            Arg::I(rows as i32),
            Arg::I(dim as i32),
            Arg::F(eps as f32),
            Arg::P(gpu.ptr(&y)),
            Arg::P(gpu.ptr(&rstd)),
        ],
    )?;
    Ok((y, rstd))
}

/// Backward: `(dx [rows, dim], dw [dim])` from `dy`, the forward's `x`, `w`, `rstd`;
/// both rounded to BF16 when `round` (the low-precision flows round every gradient
/// passed between ops), and `res [rows, dim]` (a residual branch's gradient), when
/// given, added to dx after the rounding (as `tensor::add_into`).
pub fn rmsnorm_backward(
    gpu: &Gpu,
    dy: &CudaSlice<f32>,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    rstd: &CudaSlice<f32>,
    shape: (usize, usize),
    dx_opts: (bool, Option<&CudaSlice<f32>>),
) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    let mut dw = gpu.uninit::<f32>(shape.1)?;
    let (dx, _) = norm_bwd(
        gpu,
        (DySrc::F32(dy), x, w, rstd),
        shape,
        dx_opts,
        (&mut dw, false),
        false,
    )?;
    Ok((dx, dw))
}

/// [`rmsnorm_backward`] with dw added into `dw_acc [dim]` (`dw_acc += dw`, as
/// `tensor::add_into` of the returned dw, in the column sums' last launch); returns dx.
pub fn rmsnorm_backward_acc(
    gpu: &Gpu,
    (dy, x, w, rstd): NormBwdIn,
    shape: (usize, usize),
    dx_opts: (bool, Option<&CudaSlice<f32>>),
    dw_acc: &mut CudaSlice<f32>,
) -> Result<CudaSlice<f32>> {
    let input = (DySrc::F32(dy), x, w, rstd);
    Ok(norm_bwd_acc(gpu, input, shape, dx_opts, dw_acc, false)?.0)
}

/// How `rmsnorm_bwd_rows1` runs a launch's rows (the same bits each way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows1 {
    /// `NORM_ROWS` rows a block, four rows' loads in flight.
    Four,
    /// `NORM_ROWS` rows a block, eight in flight (`rmsnorm_bwd_rows1g8`).
    Eight,
    /// A row a block, the dw terms summed by a second launch (`rmsnorm_bwd_rows1t`,
    /// `norm_terms_part`).
    Terms,
}

/// [`rmsnorm_backward_acc`] by `rmsnorm_bwd_rows1` in the given form, whatever the
/// grid: the check that every form gives the same bits. Rows of 4 to 1,024 values
/// (a multiple of 4, not 128), f32 dy, no residual.
pub fn rmsnorm_backward_acc_rows1(
    gpu: &Gpu,
    (dy, x, w, rstd): NormBwdIn,
    (rows, dim): (usize, usize),
    round: bool,
    dw_acc: &mut CudaSlice<f32>,
    form: Rows1,
) -> Result<CudaSlice<f32>> {
    let input = (DySrc::F32(dy), x, w, rstd);
    check_norm_bwd(input, (rows, dim), None)?;
    check_len("rmsnorm dw accumulator", dw_acc, dim, format!("[{dim}]"))?;
    ensure(
        rows_groups(gpu, (input.0, x, w, None), dim) == Some(1),
        || format!("rmsnorm_bwd_rows1 does not take rows of {dim}"),
    )?;
    let shape = (rows, dim);
    let out = bwd_rows(
        gpu,
        input,
        shape,
        (round, None),
        (dw_acc, true),
        false,
        (1, Some(form)),
    )?;
    Ok(out.0)
}

/// [`rmsnorm_backward_acc`] that also returns dx's BF16 GEMM operand `[rows][dim]`
/// (the bits of `to_bf16_padded` of dx), written by the same kernel, when `bf16` and
/// `dim` is a multiple of 16 (no padding columns); otherwise None.
pub fn rmsnorm_backward_acc_operand(
    gpu: &Gpu,
    (dy, x, w, rstd): NormBwdIn,
    shape: (usize, usize),
    dx_opts: (bool, Option<&CudaSlice<f32>>),
    dw_acc: &mut CudaSlice<f32>,
    bf16: bool,
) -> Result<(CudaSlice<f32>, Option<CudaSlice<u16>>)> {
    let input = (DySrc::F32(dy), x, w, rstd);
    norm_bwd_acc(gpu, input, shape, dx_opts, dw_acc, bf16)
}

/// [`rmsnorm_backward_acc_operand`] with dy the in-order sum of `parts` (1 to 3
/// BF16 arrays `[rows][dim]`: the DGrad outputs of the projections that read the
/// norm's output, as cuBLASLt wrote them). The kernels read the parts where they
/// read dy, adding them as the DGrad epilogues (`linear_epilogue_bf16`, the first
/// written, the others added) would have into an f32 dy: the same bits, without
/// those launches or the f32 dy.
pub fn rmsnorm_backward_acc_operand_sum(
    gpu: &Gpu,
    parts: &[&CudaSlice<u16>],
    (x, w, rstd): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    shape: (usize, usize),
    dx_opts: (bool, Option<&CudaSlice<f32>>),
    dw_acc: &mut CudaSlice<f32>,
    bf16: bool,
) -> Result<(CudaSlice<f32>, Option<CudaSlice<u16>>)> {
    let input = (DySrc::Bf16Sum(parts), x, w, rstd);
    norm_bwd_acc(gpu, input, shape, dx_opts, dw_acc, bf16)
}

/// The three above: dw added into `dw_acc [dim]`, and dx's BF16 operand when `bf16`
/// and `dim` is a multiple of 16.
fn norm_bwd_acc(
    gpu: &Gpu,
    input: DySrcIn,
    (rows, dim): (usize, usize),
    dx_opts: (bool, Option<&CudaSlice<f32>>),
    dw_acc: &mut CudaSlice<f32>,
    bf16: bool,
) -> Result<(CudaSlice<f32>, Option<CudaSlice<u16>>)> {
    check_len("rmsnorm dw accumulator", dw_acc, dim, format!("[{dim}]"))?;
    let want = bf16 && dim % 16 == 0;
    norm_bwd(gpu, input, (rows, dim), dx_opts, (dw_acc, true), want)
}

/// [`NormBwdIn`] with dy as a [`DySrc`]: the inputs of the kernels that read dy in
/// either form.
type DySrcIn<'a> = (
    DySrc<'a>,
    &'a CudaSlice<f32>,
    &'a CudaSlice<f32>,
    &'a CudaSlice<f32>,
);

/// A norm backward's dy: f32 values, or the in-order sum of BF16 arrays of its
/// shape (`dy_val` in `ops.cu`).
#[derive(Clone, Copy)]
enum DySrc<'a> {
    F32(&'a CudaSlice<f32>),
    Bf16Sum(&'a [&'a CudaSlice<u16>]),
}

impl DySrc<'_> {
    /// The kernels' `dy, p0, p1, p2` arguments (null where unused).
    fn args(&self, gpu: &Gpu) -> [Arg; 4] {
        match self {
            DySrc::F32(d) => [Arg::P(gpu.ptr(*d)), Arg::P(0), Arg::P(0), Arg::P(0)],
            DySrc::Bf16Sum(p) => {
                let at = |i: usize| Arg::P(p.get(i).map_or(0, |b| gpu.ptr(*b)));
                [Arg::P(0), at(0), at(1), at(2)]
            }
        }
    }

    /// dy against `[rows, dim]`: the f32 values, or each of 1 to 3 BF16 parts.
    fn check(&self, rows: usize, dim: usize) -> Result<()> {
        match self {
            DySrc::F32(d) => check_len(
                "rmsnorm dy",
                d,
                rows * dim,
                format!("rows {rows}, dim {dim}"),
            ),
            DySrc::Bf16Sum(parts) => {
                ensure((1..=3).contains(&parts.len()), || {
                    format!(
                        "rmsnorm backward: dy as a sum of {} BF16 parts (1 to 3)",
                        parts.len()
                    )
                })?;
                for (i, p) in parts.iter().enumerate() {
                    check_len(
                        &format!("rmsnorm dy part {i} (BF16)"),
                        p,
                        rows * dim,
                        format!("[{rows}, {dim}]"),
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// A norm backward's inputs (and the residual gradient it adds, if any) against
/// `rows x dim`.
fn check_norm_bwd(
    (dy, x, w, rstd): DySrcIn,
    (rows, dim): (usize, usize),
    res: Option<&CudaSlice<f32>>,
) -> Result<()> {
    dy.check(rows, dim)?;
    for (what, b, n) in [
        ("rmsnorm x", x, rows * dim),
        ("rmsnorm w", w, dim),
        ("rmsnorm rstd", rstd, rows),
    ] {
        check_len(what, b, n, format!("rows {rows}, dim {dim}"))?;
    }
    if let Some(r) = res {
        check_len(
            "rmsnorm residual gradient",
            r,
            rows * dim,
            format!("rows {rows}, dim {dim}"),
        )?;
    }
    Ok(())
}

/// Both backwards: the inputs checked, dx returned (with its BF16 operand when
/// `bf16`), dw written (or added when `add`) into `dw`.
fn norm_bwd(
    gpu: &Gpu,
    (dy, x, w, rstd): DySrcIn,
    (rows, dim): (usize, usize),
    (round, res): (bool, Option<&CudaSlice<f32>>),
    (dw, add): (&mut CudaSlice<f32>, bool),
    bf16: bool,
) -> Result<(CudaSlice<f32>, Option<CudaSlice<u16>>)> {
    check_norm_bwd((dy, x, w, rstd), (rows, dim), res)?;
    if let Some(ng) = rows_groups(gpu, (dy, x, w, res), dim) {
        return bwd_rows(
            gpu,
            (dy, x, w, rstd),
            (rows, dim),
            (round, res),
            (dw, add),
            bf16,
            (ng, None),
        );
    }
    let dx = bwd_dx(
        gpu,
        (dy, x, w, rstd),
        (rows, dim),
        (round, res),
        dim == 128,
        bf16,
    )?;
    colsum(gpu, dy, Some((x, rstd)), (rows, dim), round, (dw, add))?;
    Ok(dx)
}

/// Rows a block of `rmsnorm_bwd_rows*` (`NORM_ROWS` in `ops.cu`).
const NORM_ROWS: usize = 16;

/// The float4 groups a thread of `rmsnorm_bwd_rows{1,2,4,8}` holds for rows of
/// `dim`, where that kernel applies: `dim` a multiple of 4 up to 8,192 and not 128
/// (rows of 128 take a warp each, `rmsnorm_bwd_dx128`), every array 16-byte aligned
/// (the BF16 parts 8-byte). None: `rmsnorm_bwd_dx` and `colsum_partial`.
fn rows_groups(
    gpu: &Gpu,
    (dy, x, w, res): (
        DySrc,
        &CudaSlice<f32>,
        &CudaSlice<f32>,
        Option<&CudaSlice<f32>>,
    ),
    dim: usize,
) -> Option<usize> {
    let ng = dim.div_ceil(1024).next_power_of_two();
    let aligned = |p: u64, a: u64| p.is_multiple_of(a);
    let dy_ok = match dy {
        DySrc::F32(d) => aligned(gpu.ptr(d), 16),
        DySrc::Bf16Sum(ps) => ps.iter().all(|p| aligned(gpu.ptr(*p), 8)),
    };
    let ok = dim.is_multiple_of(4)
        && dim != 128
        && ng <= 8
        && dy_ok
        && [Some(x), Some(w), res]
            .into_iter()
            .flatten()
            .all(|b| aligned(gpu.ptr(b), 16));
    ok.then_some(ng)
}

/// rmsnorm's dx (and its BF16 operand when `bf16`) and dw by `rmsnorm_bwd_rows{ng}`,
/// `NORM_ROWS` rows a block, then `colsum_final` of the blocks' column sums into
/// `dw` (written, or added when `add`). `form` (rows of at most 1,024, `ng` 1):
/// how `rmsnorm_bwd_rows1` runs, or by the grid where None.
fn bwd_rows(
    gpu: &Gpu,
    (dy, x, w, rstd): DySrcIn,
    (rows, dim): (usize, usize),
    (round, res): (bool, Option<&CudaSlice<f32>>),
    (dw, add): (&mut CudaSlice<f32>, bool),
    bf16: bool,
    (ng, form): (usize, Option<Rows1>),
) -> Result<(CudaSlice<f32>, Option<CudaSlice<u16>>)> {
    let (dx, dx16) = dx_outputs(gpu, (rows, dim), bf16)?;
    let blocks = rows.div_ceil(NORM_ROWS).max(1);
    // Fewer blocks than SMs (a GRPO micro-batch's few hundred rows): a row a block,
    // the dw terms summed after (the same bits; 16 blocks each a chain of 16 rows
    // left most SMs idle), unless `form` says which.
    let form = form.unwrap_or(match blocks < gpu.sm_count() {
        true if norm_terms_on() => Rows1::Terms,
        true => Rows1::Eight,
        false => Rows1::Four,
    });
    let name = match (ng, form) {
        (1, Rows1::Terms) => "rmsnorm_bwd_rows1t",
        (1, Rows1::Eight) => "rmsnorm_bwd_rows1g8",
        (1, Rows1::Four) => "rmsnorm_bwd_rows1",
        (2, _) => "rmsnorm_bwd_rows2",
        (4, _) => "rmsnorm_bwd_rows4",
        _ => "rmsnorm_bwd_rows8",
    };
    let mut args = dx_args(
        gpu,
        (dy, x, w, rstd),
        (rows, dim),
        (round, res),
        (&dx, &dx16),
    );
    let part = gpu.uninit::<f32>(blocks * dim)?;
    if ng == 1 && form == Rows1::Terms {
        // The rows' dw terms `[rows][dim]`, then each block's sums as the
        // NORM_ROWS kernel makes them.
        let terms = gpu.uninit::<f32>(rows.max(1) * dim)?;
        args.push(Arg::P(gpu.ptr(&terms)));
        let grid = (rows.max(1) as u32, 1, 1);
        gpu.launch(&OPS, name, grid, (256, 1, 1), 0, &args)?;
        let sums = [
            Arg::P(gpu.ptr(&terms)),
            Arg::I(rows as i32),
            Arg::I(dim as i32),
            Arg::P(gpu.ptr(&part)),
        ];
        let grid = (blocks as u32, 1, 1);
        gpu.launch(&OPS, "norm_terms_part", grid, (256, 1, 1), 0, &sums)?;
    } else {
        args.push(Arg::P(gpu.ptr(&part)));
        gpu.launch(&OPS, name, (blocks as u32, 1, 1), (256, 1, 1), 0, &args)?;
    }
    colsum_final(gpu, &part, (blocks, dim), round, (dw, add))?;
    Ok((dx, dx16))
}

/// Whether launches of fewer blocks than SMs take the terms forms of the norms'
/// backward ([`Rows1::Terms`], `qk_norm_rope_bwd_t`): on unless `JET_NORM_TERMS=0`
/// (a measurement switch; the same bits either way).
fn norm_terms_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::cuda::switch_on("JET_NORM_TERMS"))
}

/// The backward of Qwen3's q (or k) RMSNorm and RoPE for heads of 128 in one pass
/// (`qk_norm_rope_bwd`): `dy [tokens, n_heads * 128]` the attention's gradient of
/// the rotated, normed heads, `x`, `w`, `rstd` the norm's; returns dx of the norm's
/// input and adds dw into `dw_acc [128]`. The bits of [`rope_backward_dev`] of dy
/// then [`rmsnorm_backward_acc`] over rows of 128 (`cuda_parity`).
pub fn qk_norm_rope_backward_acc(
    gpu: &Gpu,
    input: QkBwdIn,
    rope: (&CudaSlice<i32>, &GpuRope),
    shape: (usize, usize),
    round: bool,
    dw_acc: &mut CudaSlice<f32>,
) -> Result<CudaSlice<f32>> {
    match qk_norm_rope_backward_acc_operand(gpu, input, rope, shape, round, dw_acc, false)? {
        QkNormGrad::F32(dx) => Ok(dx),
        QkNormGrad::Bf16(_) => Err(CudaError::Invalid(
            "q/k norm backward: asked for f32, made BF16".into(),
        )),
    }
}

/// [`qk_norm_rope_backward_acc`], or when `bf16` only dx's BF16 GEMM operand
/// `[tokens][n_heads * 128]` (the bits of `to_bf16_padded` of dx; the f32 values
/// are not written).
pub fn qk_norm_rope_backward_acc_operand(
    gpu: &Gpu,
    input: QkBwdIn,
    (positions, table): (&CudaSlice<i32>, &GpuRope),
    (tokens, n_heads): (usize, usize),
    round: bool,
    dw_acc: &mut CudaSlice<f32>,
    bf16: bool,
) -> Result<QkNormGrad> {
    check_qk_rope(table, positions, tokens)?;
    let side = QkSide::new(
        gpu,
        "q/k",
        input,
        (tokens, n_heads),
        dw_acc,
        QkDst::of(bf16),
    )?;
    qk_norm_rope_bwd_launch(gpu, (&side, None), (positions, table), round)?;
    colsum_final(gpu, &side.part, (side.chunks, 128), round, (dw_acc, true))?;
    side.made()
}

/// `qk_norm_rope_bwd` over q's chunks, then k's (none: q's alone, the kernel's k
/// arguments, here q's again, never read).
fn qk_norm_rope_bwd_launch(
    gpu: &Gpu,
    (q, k): (&QkSide, Option<&QkSide>),
    (positions, table): (&CudaSlice<i32>, &GpuRope),
    round: bool,
) -> Result<()> {
    let x16 = q.input.1.is_bf16();
    ensure(k.is_none_or(|k| k.input.1.is_bf16() == x16), || {
        "q/k norm backward: q and k before their norms in different forms".into()
    })?;
    let blocks = q.chunks + k.map_or(0, |k| k.chunks);
    if blocks < gpu.sm_count() && norm_terms_on() {
        return qk_bwd_terms(gpu, (q, k), (positions, table), round);
    }
    let mut args = q.args(gpu);
    args.extend(k.unwrap_or(q).args(gpu));
    args.extend([
        Arg::P(gpu.ptr(positions)),
        Arg::P(gpu.ptr(&table.cos)),
        Arg::P(gpu.ptr(&table.sin)),
        Arg::I(round as i32),
        Arg::I(q.chunks as i32),
    ]);
    let grid = (blocks as u32, 1, 1);
    // More blocks than fit two an SM: the three-an-SM build, so they run as one wave
    // (ops.cu, `_o3`; the same bits).
    let name = match blocks > 2 * gpu.sm_count() {
        false => q.input.1.kernel("qk_norm_rope_bwd", "qk_norm_rope_bwd_x16"),
        true => q
            .input
            .1
            .kernel("qk_norm_rope_bwd_o3", "qk_norm_rope_bwd_x16_o3"),
    };
    gpu.launch(&OPS, name, grid, (256, 1, 1), 0, &args)
}

/// [`qk_norm_rope_bwd_launch`] for fewer 256-row chunks than SMs (a GRPO
/// micro-batch's rows, where each chunk's block was a chain of 32 rows a warp on a
/// few SMs): a row a warp (`qk_norm_rope_bwd_t`, 8 rows a block), each row's dw
/// terms to a `[rows][128]` buffer, then `qk_terms_part` sums them per chunk as
/// `qk_norm_rope_bwd`'s block does (the same adds in the same order: the same bits).
fn qk_bwd_terms(
    gpu: &Gpu,
    (q, k): (&QkSide, Option<&QkSide>),
    (positions, table): (&CudaSlice<i32>, &GpuRope),
    round: bool,
) -> Result<()> {
    let tq = gpu.uninit::<f32>(q.rows * 128)?;
    let tk = k.map(|k| gpu.uninit::<f32>(k.rows * 128)).transpose()?;
    let (k_side, k_terms) = (k.unwrap_or(q), tk.as_ref().unwrap_or(&tq));
    let mut args = q.args_into(gpu, gpu.ptr(&tq));
    args.extend(k_side.args_into(gpu, gpu.ptr(k_terms)));
    let q_blocks = q.rows.div_ceil(8).max(1);
    let k_blocks = k.map_or(0, |k| k.rows.div_ceil(8).max(1));
    args.extend([
        Arg::P(gpu.ptr(positions)),
        Arg::P(gpu.ptr(&table.cos)),
        Arg::P(gpu.ptr(&table.sin)),
        Arg::I(round as i32),
        Arg::I(q_blocks as i32),
    ]);
    let name = q
        .input
        .1
        .kernel("qk_norm_rope_bwd_t", "qk_norm_rope_bwd_x16_t");
    let grid = ((q_blocks + k_blocks) as u32, 1, 1);
    gpu.launch(&OPS, name, grid, (256, 1, 1), 0, &args)?;
    let chunks = q.chunks + k.map_or(0, |k| k.chunks);
    let sums = [
        Arg::P(gpu.ptr(&tq)),
        Arg::I(q.rows as i32),
        Arg::P(gpu.ptr(&q.part)),
        Arg::P(gpu.ptr(k_terms)),
        Arg::I(k_side.rows as i32),
        Arg::P(gpu.ptr(&k_side.part)),
        Arg::I(q.chunks as i32),
    ];
    gpu.launch(
        &OPS,
        "qk_terms_part",
        (chunks as u32, 1, 1),
        (256, 1, 1),
        0,
        &sums,
    )
}

/// [`qk_norm_rope_backward_acc_operand`] for q and k in one launch
/// (`qk_norm_rope_bwd`, then `colsum_final2` for both weights): the bits of the
/// two calls. `inputs`, `n_heads` and `dw_acc` are q's, then k's.
pub fn qk_norm_rope_backward_pair(
    gpu: &Gpu,
    inputs: [QkBwdIn; 2],
    (positions, table): (&CudaSlice<i32>, &GpuRope),
    (tokens, n_heads): (usize, [usize; 2]),
    round: bool,
    (dw_q, dw_k): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
    bf16: bool,
) -> Result<[QkNormGrad; 2]> {
    let outs = [QkDst::of(bf16), QkDst::of(bf16)];
    let [q, k] = qk_pair(
        gpu,
        inputs,
        (positions, table),
        (tokens, n_heads),
        round,
        (dw_q, dw_k),
        outs,
    )?;
    Ok([q.made()?, k.made()?])
}

/// [`qk_norm_rope_backward_pair`] writing q's and k's dy only as BF16 column slices of
/// `st` (`[tokens][ld]` BF16: q/k/v's stacked dy, v's written by the attention's
/// backward), q's at column 0 and k's at `n_heads[0] * 128`: the bits of the BF16
/// operands it makes, at another row stride (one BF16 WGrad and DGrad of q, k, v).
pub fn qk_norm_rope_backward_pair_stacked(
    gpu: &Gpu,
    inputs: [QkBwdIn; 2],
    rope: (&CudaSlice<i32>, &GpuRope),
    (tokens, n_heads): (usize, [usize; 2]),
    round: bool,
    dws: (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
    (st, ld): (&CudaSlice<u16>, usize),
) -> Result<()> {
    let (qw, kw) = (n_heads[0] * 128, n_heads[1] * 128);
    ensure(ld >= qw + kw, || {
        format!("stacked q/k dy: row stride {ld} < {qw} + {kw}")
    })?;
    let want = tokens.saturating_sub(1) * ld + qw + kw;
    check_len("stacked q/k dy", st, want, format!("[{tokens}][{ld}]"))?;
    let base = gpu.ptr(st);
    let outs = [QkDst::At(base, ld), QkDst::At(base + 2 * qw as u64, ld)];
    qk_pair(gpu, inputs, rope, (tokens, n_heads), round, dws, outs)?;
    Ok(())
}

/// q's and k's `qk_norm_rope_bwd` in one launch, then `colsum_final2` for both
/// weights: the sides, with what each made.
fn qk_pair<'a>(
    gpu: &Gpu,
    inputs: [QkBwdIn<'a>; 2],
    (positions, table): (&CudaSlice<i32>, &GpuRope),
    (tokens, n_heads): (usize, [usize; 2]),
    round: bool,
    (dw_q, dw_k): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
    [oq, ok]: [QkDst; 2],
) -> Result<[QkSide<'a>; 2]> {
    check_qk_rope(table, positions, tokens)?;
    let q = QkSide::new(gpu, "q", inputs[0], (tokens, n_heads[0]), dw_q, oq)?;
    let k = QkSide::new(gpu, "k", inputs[1], (tokens, n_heads[1]), dw_k, ok)?;
    qk_norm_rope_bwd_launch(gpu, (&q, Some(&k)), (positions, table), round)?;
    gpu.launch(
        &OPS,
        "colsum_final2",
        (128u32.div_ceil(8), 2, 1),
        (256, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(&q.part)),
            Arg::I(q.chunks as i32),
            Arg::P(gpu.ptr(dw_q)),
            Arg::P(gpu.ptr(&k.part)),
            Arg::I(k.chunks as i32),
            Arg::P(gpu.ptr(dw_k)),
            Arg::I(128),
            Arg::I(1),
            Arg::I(round as i32),
        ],
    )?;
    Ok([q, k])
}

/// The RoPE table and positions `qk_norm_rope_bwd` reads: heads of 128, a position
/// a token.
fn check_qk_rope(table: &GpuRope, positions: &CudaSlice<i32>, tokens: usize) -> Result<()> {
    ensure(table.head_dim == 128, || {
        format!(
            "qk_norm_rope_bwd takes heads of 128, not {}",
            table.head_dim
        )
    })?;
    check_len("rope positions", positions, tokens, format!("[{tokens}]"))
}

/// One of q and k in `qk_norm_rope_bwd`: its checked inputs, its output (f32 dx
/// or dx's BF16 operand alone, its own or at an address with a row stride: `at16`)
/// and its 256-row chunks' column sums `part [chunks][128]`.
struct QkSide<'a> {
    input: QkBwdIn<'a>,
    rows: usize,
    n_heads: usize,
    chunks: usize,
    out: Option<QkNormGrad>,
    at16: (u64, usize),
    part: CudaSlice<f32>,
}

/// Where a side of `qk_norm_rope_bwd` writes dx: f32 or BF16 buffers of its own,
/// or BF16 at a device address with a row stride (elements a token).
#[derive(Clone, Copy)]
enum QkDst {
    F32,
    Bf16,
    At(u64, usize),
}

impl QkDst {
    fn of(bf16: bool) -> QkDst {
        match bf16 {
            true => QkDst::Bf16,
            false => QkDst::F32,
        }
    }
}

impl<'a> QkSide<'a> {
    /// `who` ("q", "k" or "q/k") names the side in errors.
    fn new(
        gpu: &Gpu,
        who: &str,
        input: QkBwdIn<'a>,
        (tokens, n_heads): (usize, usize),
        dw_acc: &CudaSlice<f32>,
        how: QkDst,
    ) -> Result<Self> {
        const HD: usize = 128;
        let (dy, x, w, rstd) = input;
        let rows = tokens * n_heads;
        let shape = format!("{tokens} tokens, {n_heads} heads of {HD}");
        x.check(&format!("{who} norm x"), rows * HD, &shape)?;
        for (what, b, n) in [
            ("dy", dy, rows * HD),
            ("w", w, HD),
            ("rstd", rstd, rows),
            ("dw accumulator", dw_acc, HD),
        ] {
            check_len(
                &format!("{who} norm {what}"),
                b,
                n,
                format!("{tokens} tokens, {n_heads} heads of {HD}"),
            )?;
        }
        let (out, at16) = match how {
            QkDst::Bf16 => {
                let d = gpu.uninit::<u16>(rows * HD)?;
                let at = (gpu.ptr(&d), n_heads * HD);
                (Some(QkNormGrad::Bf16(d)), at)
            }
            QkDst::F32 => (Some(QkNormGrad::F32(gpu.uninit::<f32>(rows * HD)?)), (0, 0)),
            QkDst::At(p, ld) => (None, (p, ld)),
        };
        let chunks = rows.div_ceil(256).max(1);
        let part = gpu.uninit::<f32>(chunks * HD)?;
        Ok(QkSide {
            input,
            rows,
            n_heads,
            chunks,
            out,
            at16,
            part,
        })
    }

    /// The output this side made in a buffer of its own.
    fn made(self) -> Result<QkNormGrad> {
        self.out.ok_or_else(|| {
            CudaError::Invalid("q/k norm backward: the BF16 dy went to a stacked operand".into())
        })
    }

    /// `qk_norm_rope_bwd`'s arguments for this side: dy, x, w, rstd, rows, n_heads,
    /// dx, part, dx16, ld16 (dx or dx16 null by the output's form).
    fn args(&self, gpu: &Gpu) -> Vec<Arg> {
        self.args_into(gpu, gpu.ptr(&self.part))
    }

    /// [`QkSide::args`] with `part` at another address (the `_t` kernels' terms).
    fn args_into(&self, gpu: &Gpu, part: u64) -> Vec<Arg> {
        let (dy, x, w, rstd) = self.input;
        let dx = match &self.out {
            Some(QkNormGrad::F32(d)) => gpu.ptr(d),
            _ => 0,
        };
        let (dx16, ld16) = self.at16;
        vec![
            Arg::P(gpu.ptr(dy)),
            x.ptr_arg(gpu),
            Arg::P(gpu.ptr(w)),
            Arg::P(gpu.ptr(rstd)),
            Arg::I(self.rows as i32),
            Arg::I(self.n_heads as i32),
            Arg::P(dx),
            Arg::P(part),
            Arg::P(dx16),
            Arg::L(ld16 as i64),
        ]
    }
}

/// The q (or k) norm's input gradient from [`qk_norm_rope_backward_acc_operand`]:
/// f32, or only its BF16 GEMM operand `[tokens][n_heads * 128]` (the projection's
/// dy, where nothing reads the f32 values).
pub enum QkNormGrad {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<u16>),
}

/// The q/k norm + RoPE backward's inputs: dy, the forward's x (the heads before
/// their norm: f32, or the BF16 values the q or k projection stored), the norm's
/// weight and rstd.
pub type QkBwdIn<'a> = (
    &'a CudaSlice<f32>,
    ActRef<'a>,
    &'a CudaSlice<f32>,
    &'a CudaSlice<f32>,
);

/// rmsnorm backward's inputs: dy, the forward's x, the weight and rstd.
pub type NormBwdIn<'a> = (
    &'a CudaSlice<f32>,
    &'a CudaSlice<f32>,
    &'a CudaSlice<f32>,
    &'a CudaSlice<f32>,
);

/// rmsnorm's dx: a warp a row (`warp_rows`, rows of 128 only) or a block a row;
/// both add in one order, so the bits are the same.
fn bwd_dx(
    gpu: &Gpu,
    (dy, x, w, rstd): DySrcIn,
    (rows, dim): (usize, usize),
    (round, res): (bool, Option<&CudaSlice<f32>>),
    warp_rows: bool,
    bf16: bool,
) -> Result<(CudaSlice<f32>, Option<CudaSlice<u16>>)> {
    let (dx, dx16) = dx_outputs(gpu, (rows, dim), bf16)?;
    let (name, grid, threads) = if warp_rows {
        ensure(dim == 128, || {
            format!("rmsnorm_bwd_dx128 takes rows of 128, not {dim}")
        })?;
        ("rmsnorm_bwd_dx128", rows.div_ceil(8), 256)
    } else {
        // 256 threads; fewer for a row of at most 256: the threads left out would
        // each add 0, so the sum's bits are the same.
        (
            "rmsnorm_bwd_dx",
            rows,
            dim.next_multiple_of(32).clamp(32, 256),
        )
    };
    let args = dx_args(
        gpu,
        (dy, x, w, rstd),
        (rows, dim),
        (round, res),
        (&dx, &dx16),
    );
    gpu.launch(
        &OPS,
        name,
        (grid as u32, 1, 1),
        (threads as u32, 1, 1),
        0,
        &args,
    )?;
    Ok((dx, dx16))
}

/// dx `[rows, dim]` and, when `bf16`, its BF16 operand, for a norm backward to write.
fn dx_outputs(
    gpu: &Gpu,
    (rows, dim): (usize, usize),
    bf16: bool,
) -> Result<(CudaSlice<f32>, Option<CudaSlice<u16>>)> {
    ensure(!bf16 || dim % 16 == 0, || {
        format!("rmsnorm backward: a BF16 operand of rows of {dim} (not a multiple of 16) needs padding")
    })?;
    let dx = gpu.uninit::<f32>(rows * dim)?;
    let dx16 = bf16.then(|| gpu.uninit::<u16>(rows * dim)).transpose()?;
    Ok((dx, dx16))
}

/// The arguments `rmsnorm_bwd_dx`, `rmsnorm_bwd_dx128` and `rmsnorm_bwd_rows*`
/// start with (`ops.cu`).
fn dx_args(
    gpu: &Gpu,
    (dy, x, w, rstd): DySrcIn,
    (rows, dim): (usize, usize),
    (round, res): (bool, Option<&CudaSlice<f32>>),
    (dx, dx16): (&CudaSlice<f32>, &Option<CudaSlice<u16>>),
) -> Vec<Arg> {
    let [d, p0, p1, p2] = dy.args(gpu);
    vec![
        d,
        Arg::P(gpu.ptr(x)),
        Arg::P(gpu.ptr(w)),
        Arg::P(gpu.ptr(rstd)),
        Arg::I(rows as i32),
        Arg::I(dim as i32),
        Arg::P(gpu.ptr(dx)),
        Arg::I(round as i32),
        Arg::P(res.map_or(0, |r| gpu.ptr(r))),
        Arg::P(dx16.as_ref().map_or(0, |b| gpu.ptr(b))),
        p0,
        p1,
        p2,
    ]
}

/// [`rmsnorm_backward`]'s dx by a block a row whatever the width (the check that
/// the warp-a-row kernel of 128-wide rows gives the same bits; other widths take
/// `rmsnorm_bwd_rows`, whose sums run in another order).
#[doc(hidden)]
pub fn rmsnorm_bwd_dx_block_rows(
    gpu: &Gpu,
    (dy, x, w, rstd): NormBwdIn,
    (rows, dim): (usize, usize),
    (round, res): (bool, Option<&CudaSlice<f32>>),
) -> Result<CudaSlice<f32>> {
    Ok(bwd_dx(
        gpu,
        (DySrc::F32(dy), x, w, rstd),
        (rows, dim),
        (round, res),
        false,
        false,
    )?
    .0)
}

/// Column sums `out [cols] = sum_r a [r, c]`, optionally rounded to BF16 (the bias
/// gradient of a linear layer). Fixed order (`colsum_partial` in `ops.cu`): 256-row
/// chunks, each as eight interleaved row sets, then the chunks.
pub fn column_sums(
    gpu: &Gpu,
    a: &CudaSlice<f32>,
    rows: usize,
    cols: usize,
    round: bool,
) -> Result<CudaSlice<f32>> {
    check_len(
        "column sums input",
        a,
        rows * cols,
        format!("[{rows}, {cols}]"),
    )?;
    let mut out = gpu.uninit::<f32>(cols)?;
    colsum(
        gpu,
        DySrc::F32(a),
        None,
        (rows, cols),
        round,
        (&mut out, false),
    )?;
    Ok(out)
}

/// [`column_sums`] added into `acc [cols]` (`acc += sums`, as `tensor::add_into`).
pub fn column_sums_acc(
    gpu: &Gpu,
    a: &CudaSlice<f32>,
    (rows, cols): (usize, usize),
    round: bool,
    acc: &mut CudaSlice<f32>,
) -> Result<()> {
    check_len(
        "column sums input",
        a,
        rows * cols,
        format!("[{rows}, {cols}]"),
    )?;
    check_len("column sums accumulator", acc, cols, format!("[{cols}]"))?;
    colsum(gpu, DySrc::F32(a), None, (rows, cols), round, (acc, true))
}

/// The column sums (of `a`, or of `a * x * rstd` per row) written, or added when
/// `add`, into `out [cols]`.
fn colsum(
    gpu: &Gpu,
    a: DySrc,
    xr: Option<(&CudaSlice<f32>, &CudaSlice<f32>)>,
    (rows, cols): (usize, usize),
    round: bool,
    (out, add): (&mut CudaSlice<f32>, bool),
) -> Result<()> {
    const CHUNK: usize = 256;
    let chunks = rows.div_ceil(CHUNK).max(1);
    let part = gpu.uninit::<f32>(chunks * cols)?;
    let (xp, rp) = xr.map_or((0, 0), |(x, r)| (gpu.ptr(x), gpu.ptr(r)));
    let [a0, p0, p1, p2] = a.args(gpu);
    gpu.launch(
        &OPS,
        "colsum_partial",
        (cols.div_ceil(32) as u32, chunks as u32, 1),
        (256, 1, 1),
        0,
        &[
            a0,
            Arg::P(xp),
            Arg::P(rp),
            Arg::I(rows as i32),
            Arg::I(cols as i32),
            Arg::I(CHUNK as i32),
            Arg::P(gpu.ptr(&part)),
            p0,
            p1,
            p2,
        ],
    )?;
    colsum_final(gpu, &part, (chunks, cols), round, (out, add))
}

/// `colsum_final`: the chunks' sums `part [chunks][cols]` added in order (rounded
/// when `round`) into `out [cols]` (written, or added when `add`).
fn colsum_final(
    gpu: &Gpu,
    part: &CudaSlice<f32>,
    (chunks, cols): (usize, usize),
    round: bool,
    (out, add): (&mut CudaSlice<f32>, bool),
) -> Result<()> {
    gpu.launch(
        &OPS,
        "colsum_final",
        (cols.div_ceil(8) as u32, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(part)),
            Arg::I(chunks as i32),
            Arg::I(cols as i32),
            Arg::I(add as i32),
            Arg::I(round as i32),
            Arg::P(gpu.ptr(out)),
        ],
    )
}

/// A [`RopeTable`] on the device: cos and sin `[max_positions, head_dim / 2]` as
/// f32 (the CPU's `T::of_f64` of the same f64 values).
pub struct GpuRope {
    pub head_dim: usize,
    pub max_positions: usize,
    pub(crate) cos: CudaSlice<f32>,
    pub(crate) sin: CudaSlice<f32>,
}

impl GpuRope {
    /// Its tables' device addresses (see `GpuWeight::fingerprint`).
    pub fn fingerprint(&self, gpu: &Gpu) -> [u64; 2] {
        [gpu.ptr(&self.cos), gpu.ptr(&self.sin)]
    }

    pub fn new(gpu: &Gpu, table: &RopeTable) -> Result<GpuRope> {
        let f = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        Ok(GpuRope {
            head_dim: table.head_dim,
            max_positions: table.max_positions(),
            cos: gpu.upload(&f(&table.cos))?,
            sin: gpu.upload(&f(&table.sin))?,
        })
    }
}

/// Every position within the RoPE table, or an error naming the first that is not.
pub fn check_positions(positions: &[usize], t: &GpuRope) -> Result<()> {
    match positions.iter().find(|&&p| p >= t.max_positions) {
        Some(&p) => Err(super::CudaError::Invalid(format!(
            "rope: position {p} is beyond the table's {} positions",
            t.max_positions
        ))),
        None => Ok(()),
    }
}

fn rotate(
    gpu: &Gpu,
    x: &mut CudaSlice<f32>,
    positions: &[usize],
    n_heads: usize,
    t: &GpuRope,
    sign: f32,
) -> Result<()> {
    let dpos = upload_positions(gpu, positions, t)?;
    rotate_dev(gpu, x, &dpos, positions.len(), n_heads, t, (sign, false))
}

/// RoPE of `rows` rows whose positions `[rows]` (i32, within the table) are
/// already on the device; the results rounded to BF16 when `round`.
fn rotate_dev(
    gpu: &Gpu,
    x: &mut CudaSlice<f32>,
    dpos: &CudaSlice<i32>,
    rows: usize,
    n_heads: usize,
    t: &GpuRope,
    (sign, round): (f32, bool),
) -> Result<()> {
    check_len(
        "rope x",
        x,
        rows * n_heads * t.head_dim,
        format!("[{rows}, {n_heads} * {}]", t.head_dim),
    )?;
    check_len("rope positions", dpos, rows, format!("[{rows}]"))?;
    gpu.launch(
        &OPS,
        "rope",
        grid1(rows * n_heads * t.head_dim / 2),
        (256, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(x)),
            Arg::P(gpu.ptr(dpos)),
            Arg::P(gpu.ptr(&t.cos)),
            Arg::P(gpu.ptr(&t.sin)),
            Arg::I(rows as i32),
            Arg::I(n_heads as i32),
            Arg::I(t.head_dim as i32),
            Arg::F(sign),
            Arg::I(round as i32),
        ],
    )
}

/// Whether [`qk_norm_rope`] takes heads of `head_dim` values.
pub fn qk_norm_rope_fits(head_dim: usize) -> bool {
    head_dim.is_multiple_of(64) && head_dim <= 256
}

/// Qwen3's per-head q and k norms then RoPE at the device positions, one kernel
/// (fuses [`rmsnorm_forward`] on rows of `head_dim` and [`rope_forward_dev`]; the
/// norm's sum in an order of its own): from `q_pre [rows, nh * hd]`, `k_pre [rows,
/// nkv * hd]` and the norms' weights `[hd]` -> `(q, k, q rstd [rows * nh], k rstd
/// [rows * nkv])`. Heads of a multiple of 64 values, at most 256 ([`qk_norm_rope_fits`]).
#[allow(clippy::type_complexity)]
pub fn qk_norm_rope(
    gpu: &Gpu,
    pre: (&CudaSlice<f32>, &CudaSlice<f32>),
    norms: (&CudaSlice<f32>, &CudaSlice<f32>),
    shape: (usize, usize, usize),
    eps: f64,
    positions: &CudaSlice<i32>,
    t: &GpuRope,
) -> Result<(
    CudaSlice<f32>,
    CudaSlice<f32>,
    CudaSlice<f32>,
    CudaSlice<f32>,
)> {
    let pre = (pre.0.into(), pre.1.into());
    qk_norm_rope_as(gpu, pre, norms, shape, eps, (positions, t))
}

/// [`qk_norm_rope`] writing only the BF16 copies of q and k (RNE, the bits of the
/// tensor-core attention's operand copies: `flash::flash_forward_operand_bf16`
/// reads them): `(q16, k16, q rstd, k rstd)`. q and k before their norms in f32,
/// or both as the BF16 values their projections stored (the same numbers: the
/// same bits).
#[allow(clippy::type_complexity)]
pub fn qk_norm_rope_bf16(
    gpu: &Gpu,
    pre: (ActRef, ActRef),
    norms: (&CudaSlice<f32>, &CudaSlice<f32>),
    shape: (usize, usize, usize),
    eps: f64,
    positions: &CudaSlice<i32>,
    t: &GpuRope,
) -> Result<(
    CudaSlice<u16>,
    CudaSlice<u16>,
    CudaSlice<f32>,
    CudaSlice<f32>,
)> {
    qk_norm_rope_as(gpu, pre, norms, shape, eps, (positions, t))
}

/// The element `qk_norm_rope` writes q and k as: f32 values or their BF16 copies.
trait QkOut: cudarc::driver::DeviceRepr {
    const BF16: bool;
}
impl QkOut for f32 {
    const BF16: bool = false;
}
impl QkOut for u16 {
    const BF16: bool = true;
}

/// `qk_norm_rope` with q and k written as `T`.
#[allow(clippy::type_complexity)]
fn qk_norm_rope_as<T: QkOut>(
    gpu: &Gpu,
    pre: (ActRef, ActRef),
    norms: (&CudaSlice<f32>, &CudaSlice<f32>),
    (rows, nh, nkv): (usize, usize, usize),
    eps: f64,
    rope: (&CudaSlice<i32>, &GpuRope),
) -> Result<(CudaSlice<T>, CudaSlice<T>, CudaSlice<f32>, CudaSlice<f32>)> {
    let hd = rope.1.head_dim;
    let (q, k) = (
        gpu.uninit::<T>(rows * nh * hd)?,
        gpu.uninit::<T>(rows * nkv * hd)?,
    );
    let (qp, kp) = (gpu.ptr(&q), gpu.ptr(&k));
    let outs = match T::BF16 {
        false => [qp, kp, 0, 0],
        true => [0, 0, qp, kp],
    };
    let (qr, kr) = qk_norm_rope_launch(gpu, pre, norms, (rows, nh, nkv), eps, rope, outs)?;
    Ok((q, k, qr, kr))
}

/// `qk_norm_rope` into `[q, k, q16, k16]` (device addresses, 0: not written), after
/// the shape checks; returns the norms' rstd.
/// Heads a warp of `qk_norm_rope_{64,128,192,256}` (`QKNR_HEADS` in `ops.cu`).
const QKNR_HEADS: usize = 4;

fn qk_norm_rope_launch(
    gpu: &Gpu,
    (q_pre, k_pre): (ActRef, ActRef),
    (qw, kw): (&CudaSlice<f32>, &CudaSlice<f32>),
    (rows, nh, nkv): (usize, usize, usize),
    eps: f64,
    (positions, t): (&CudaSlice<i32>, &GpuRope),
    [q, k, q16, k16]: [u64; 4],
) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    let hd = t.head_dim;
    ensure(qk_norm_rope_fits(hd), || {
        format!("q/k norm with RoPE: head_dim {hd} (must be a multiple of 64, at most 256)")
    })?;
    ensure(q_pre.is_bf16() == k_pre.is_bf16(), || {
        "q/k norm with RoPE: q and k before their norms in different forms".into()
    })?;
    let q_arg = q_pre.arg(gpu, "q", rows * nh * hd, &format!("[{rows}, {nh} * {hd}]"))?;
    let k_arg = k_pre.arg(
        gpu,
        "k",
        rows * nkv * hd,
        &format!("[{rows}, {nkv} * {hd}]"),
    )?;
    check_len("q_norm weight", qw, hd, format!("[{hd}]"))?;
    check_len("k_norm weight", kw, hd, format!("[{hd}]"))?;
    check_len("rope positions", positions, rows, format!("[{rows}]"))?;
    let (qr, kr) = (
        gpu.uninit::<f32>(rows * nh)?,
        gpu.uninit::<f32>(rows * nkv)?,
    );
    if rows > 0 {
        gpu.launch(
            &OPS,
            match (hd, q_pre.is_bf16()) {
                (64, false) => "qk_norm_rope_64",
                (128, false) => "qk_norm_rope_128",
                (192, false) => "qk_norm_rope_192",
                (_, false) => "qk_norm_rope_256",
                (64, true) => "qk_norm_rope_64_x16",
                (128, true) if qknr_words() => "qk_norm_rope_128_x16w",
                (128, true) => "qk_norm_rope_128_x16",
                (192, true) => "qk_norm_rope_192_x16",
                (_, true) => "qk_norm_rope_256_x16",
            },
            // QKNR_HEADS heads a warp, eight warps a block.
            (rows as u32, (nh + nkv).div_ceil(8 * QKNR_HEADS) as u32, 1),
            (256, 1, 1),
            0,
            &[
                q_arg,
                k_arg,
                Arg::P(gpu.ptr(qw)),
                Arg::P(gpu.ptr(kw)),
                Arg::I(nh as i32),
                Arg::I(nkv as i32),
                Arg::F(eps as f32),
                Arg::P(gpu.ptr(positions)),
                Arg::P(gpu.ptr(&t.cos)),
                Arg::P(gpu.ptr(&t.sin)),
                Arg::P(q),
                Arg::P(k),
                Arg::P(gpu.ptr(&qr)),
                Arg::P(gpu.ptr(&kr)),
                Arg::P(q16),
                Arg::P(k16),
            ],
        )?;
    }
    Ok((qr, kr))
}

/// Whether BF16 heads of 128 take `qk_norm_rope_128_x16w` (word loads): on unless
/// `JET_QKNR_WORDS=0` (a measurement switch; the same bits either way).
fn qknr_words() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::cuda::switch_on("JET_QKNR_WORDS"))
}

/// [`rope_forward`] with the positions on the device ([`upload_positions`]):
/// uploaded once for all layers, or replayed by a CUDA graph.
pub fn rope_forward_dev(
    gpu: &Gpu,
    x: &mut CudaSlice<f32>,
    positions: &CudaSlice<i32>,
    rows: usize,
    n_heads: usize,
    table: &GpuRope,
) -> Result<()> {
    rotate_dev(gpu, x, positions, rows, n_heads, table, (1.0, false))
}

/// [`rope_backward`] with the positions on the device, dx rounded to BF16 when
/// `round` (the low-precision flows' gradient rounding, fused).
pub fn rope_backward_dev(
    gpu: &Gpu,
    dx: &mut CudaSlice<f32>,
    positions: &CudaSlice<i32>,
    (rows, n_heads): (usize, usize),
    table: &GpuRope,
    round: bool,
) -> Result<()> {
    rotate_dev(gpu, dx, positions, rows, n_heads, table, (-1.0, round))
}

/// Forward, in place: `x [positions.len(), n_heads * head_dim]`.
pub fn rope_forward(
    gpu: &Gpu,
    x: &mut CudaSlice<f32>,
    positions: &[usize],
    n_heads: usize,
    table: &GpuRope,
) -> Result<()> {
    rotate(gpu, x, positions, n_heads, table, 1.0)
}

/// Backward, in place: `dx` holds dy on entry and dx on return.
pub fn rope_backward(
    gpu: &Gpu,
    dx: &mut CudaSlice<f32>,
    positions: &[usize],
    n_heads: usize,
    table: &GpuRope,
) -> Result<()> {
    rotate(gpu, dx, positions, n_heads, table, -1.0)
}

/// The f32 inputs (of all 2^32 bit patterns) at which the kernels' sigmoid, whose
/// division skips the IEEE division's range check (`div_unit` in common.cuh),
/// differs in its bits from the one with the IEEE division; NaNs count as equal.
/// Zero on a device where that fast path is the division.
pub fn sigmoid_mismatches(gpu: &Gpu) -> Result<u64> {
    count_mismatches(gpu, "sigmoid_div_is_ieee", 0, 1 << 32)
}

/// The f32 inputs (of all 2^32 bit patterns) at which the hardware BF16 conversions
/// (`cvt.rn.bf16x2.f32`, both halves, and `cvt.rn.bf16.f32`) differ in bits from
/// `f32_to_bf16` (half's `bf16::from_f32`); a NaN input counts only if a result is
/// not NaN (the instruction's NaN is 0x7fff, whatever the payload). Zero is what
/// the rows kernels' `ROWS_HW_PACK` and `swiglu_bwd_fp8`'s `SWIGLU_HW_BF16` rest on.
pub fn bf16_cvt_mismatches(gpu: &Gpu) -> Result<u64> {
    count_mismatches(gpu, "bf16_cvt_is_f32_to_bf16", 0, 1 << 32)
}

/// The largest-|x| bit patterns of a quantized group, of all where the quantizers
/// take their branch-free scale (`quot_usual`: 0 and [2^-79, inf)), at which its
/// scale, reciprocal or fast flag differ in bits from `quot(e4m3_scale(a))`'s.
pub fn quot_usual_mismatches(gpu: &Gpu) -> Result<u64> {
    let (lo, hi) = (0x1800_0000i64, 0x7f80_0000i64);
    count_mismatches(gpu, "quot_usual_is_quot", lo, hi - lo)
}

/// An exhaustive check kernel's count over the bit patterns [start, start + count)
/// (`(start, count, bad)`: grid-stride, each warp's misses added into `bad[0]`).
fn count_mismatches(gpu: &Gpu, kernel: &'static str, start: i64, count: i64) -> Result<u64> {
    let bad = gpu.zeros::<u64>(1)?;
    gpu.launch(
        &OPS,
        kernel,
        ((32 * gpu.sm_count()) as u32, 1, 1),
        (256, 1, 1),
        0,
        &[Arg::L(start), Arg::L(count), Arg::P(gpu.ptr(&bad))],
    )?;
    Ok(gpu.download(&bad)?[0])
}

/// Forward: `h [n] = silu(gate) * up`.
pub fn swiglu_forward(
    gpu: &Gpu,
    gate: &CudaSlice<f32>,
    up: &CudaSlice<f32>,
    n: usize,
) -> Result<CudaSlice<f32>> {
    check_len("swiglu gate", gate, n, n)?;
    check_len("swiglu up", up, n, n)?;
    let h = gpu.uninit::<f32>(n)?;
    gpu.launch(
        &OPS,
        "swiglu_fwd",
        grid1(n),
        (256, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(gate)),
            Arg::P(gpu.ptr(up)),
            Arg::L(n as i64),
            Arg::P(gpu.ptr(&h)),
        ],
    )?;
    Ok(h)
}

/// Backward: `(dgate [n], dup [n])` from `dh` and the forward's `gate`, `up`, rounded
/// to BF16 when `round`.
pub fn swiglu_backward(
    gpu: &Gpu,
    dh: &CudaSlice<f32>,
    gate: &CudaSlice<f32>,
    up: &CudaSlice<f32>,
    n: usize,
    round: bool,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    for (what, b) in [("swiglu dh", dh), ("swiglu gate", gate), ("swiglu up", up)] {
        check_len(what, b, n, n)?;
    }
    ensure(n < i64::MAX as usize, || "swiglu: too long".into())?;
    let (dg, du) = (gpu.uninit::<f32>(n)?, gpu.uninit::<f32>(n)?);
    gpu.launch(
        &OPS,
        "swiglu_bwd",
        grid1(n),
        (256, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(dh)),
            Arg::P(gpu.ptr(gate)),
            Arg::P(gpu.ptr(up)),
            Arg::L(n as i64),
            Arg::P(gpu.ptr(&dg)),
            Arg::P(gpu.ptr(&du)),
            Arg::I(round as i32),
        ],
    )?;
    Ok((dg, du))
}

/// swiglu's upstream gradient dh `[rows, cols]`: f32, or the down projection's
/// DGrad output as cuBLASLt wrote it in BF16 (`[rows][ld]`, `linear::GemmOut`),
/// read without its epilogue (the same values).
#[derive(Clone, Copy)]
pub enum SwigluDh<'a> {
    F32(&'a CudaSlice<f32>),
    Bf16(&'a CudaSlice<u16>, usize),
}

impl SwigluDh<'_> {
    /// Check dh against `[rows, cols]`; the swiglu backward kernel's leading
    /// arguments (`dh`, or `dh, ldh` for the `_dh16` kernels) and whether BF16.
    pub(crate) fn args(&self, gpu: &Gpu, rows: usize, cols: usize) -> Result<(Vec<Arg>, bool)> {
        match *self {
            SwigluDh::F32(d) => {
                check_len("swiglu dh", d, rows * cols, format!("[{rows}, {cols}]"))?;
                Ok((vec![Arg::P(gpu.ptr(d))], false))
            }
            SwigluDh::Bf16(d, ld) => {
                ensure(ld >= cols, || {
                    format!("swiglu dh: row stride {ld} < {cols}")
                })?;
                let n = rows.saturating_sub(1) * ld + cols;
                check_len("swiglu dh (BF16)", d, n, format!("[{rows}][{ld}]"))?;
                Ok((vec![Arg::P(gpu.ptr(d)), Arg::L(ld as i64)], true))
            }
        }
    }
}

/// [`swiglu_backward`] (rounded) as the BF16 GEMM operands of the gate and up
/// backward: `(dgate, dup)`, each `[rows][pad16(cols)]` BF16 with zero padding,
/// the bits of `to_bf16_padded` of the rounded f32 results.
/// gate and up: f32, or both the BF16 values a rows GEMM stored (the same bits).
pub fn swiglu_backward_bf16<'a>(
    gpu: &Gpu,
    dh: SwigluDh,
    gate: impl Into<ActRef<'a>>,
    up: impl Into<ActRef<'a>>,
    (rows, cols): (usize, usize),
) -> Result<(CudaSlice<u16>, CudaSlice<u16>)> {
    let ldb = super::pad16(cols);
    let (dg, du) = (
        gpu.uninit::<u16>(rows * ldb)?,
        gpu.uninit::<u16>(rows * ldb)?,
    );
    let outs = (gpu.ptr(&dg), gpu.ptr(&du), ldb);
    swiglu_bwd_bf16_launch(gpu, dh, (gate.into(), up.into()), (rows, cols), outs)?;
    Ok((dg, du))
}

/// [`swiglu_backward_bf16`] with `dgate` and `dup` as the column halves of one
/// stacked `[rows][2 cols]` BF16 operand (`[dgate | dup]`, for one WGrad and one
/// DGrad of gate and up): the same bits. `cols` a multiple of 16 (no padding
/// columns between the halves).
pub fn swiglu_backward_bf16_stacked<'a>(
    gpu: &Gpu,
    dh: SwigluDh,
    gate: impl Into<ActRef<'a>>,
    up: impl Into<ActRef<'a>>,
    (rows, cols): (usize, usize),
) -> Result<CudaSlice<u16>> {
    ensure(cols.is_multiple_of(16), || {
        format!("stacked swiglu backward: {cols} columns, not a multiple of 16")
    })?;
    let st = gpu.uninit::<u16>(rows * 2 * cols)?;
    let outs = (gpu.ptr(&st), gpu.ptr(&st) + 2 * cols as u64, 2 * cols);
    swiglu_bwd_bf16_launch(gpu, dh, (gate.into(), up.into()), (rows, cols), outs)?;
    Ok(st)
}

/// `swiglu_bwd_bf16*` writing dgate and dup at `outs` = (dgate, dup, row stride
/// ldo >= pad16(cols)), each `[rows][ldo]` with its pad16(cols) columns written.
fn swiglu_bwd_bf16_launch(
    gpu: &Gpu,
    dh: SwigluDh,
    (gate, up): (ActRef, ActRef),
    (rows, cols): (usize, usize),
    (dg, du, ldo): (u64, u64, usize),
) -> Result<()> {
    let (gate, up, gu16) = super::quantize::gu_args(gpu, gate, up, (rows, cols))?;
    let (head, dh16) = dh.args(gpu, rows, cols)?;
    ensure(dh16 || !gu16, || {
        "swiglu backward: BF16 gate and up need the BF16 dh".into()
    })?;
    let ldb = super::pad16(cols);
    ensure(
        rows * ldo < i64::MAX as usize && cols < i32::MAX as usize && ldo >= ldb,
        || format!("swiglu backward of [{rows}, {cols}] at row stride {ldo}: too large"),
    )?;
    if rows == 0 {
        return Ok(());
    }
    gpu.launch(
        &OPS,
        match (dh16, gu16) {
            (true, true) => "swiglu_bwd_bf16_dh16_gu16",
            (true, false) => "swiglu_bwd_bf16_dh16",
            (false, _) => "swiglu_bwd_bf16",
        },
        grid1((rows * ldb).div_ceil(4)),
        (256, 1, 1),
        0,
        &[
            &head[..],
            &[
                gate,
                up,
                Arg::I(rows as i32),
                Arg::I(cols as i32),
                Arg::I(ldb as i32),
                Arg::L(ldo as i64),
                Arg::P(dg),
                Arg::P(du),
            ],
        ]
        .concat(),
    )
}
