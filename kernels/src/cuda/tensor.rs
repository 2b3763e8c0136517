//! Plain f32 tensor ops on device buffers (`tensor.cu`), the glue of a GPU training
//! step: gradient accumulation, scaling, BF16 rounding, row gather/scatter (KV cache
//! writes, the LM head's rows and their gradient's placement) and the f64 sum of squares behind the global gradient
//! norm. Element-wise ops are bit-exact with the Rust expression they name; the sum
//! of squares is deterministic (fixed-order tree, no atomics).
//!
//! Every op runs on the [`Gpu`]'s stream and returns at once; only downloads wait.

use cudarc::driver::CudaSlice;

use super::context::{Arg, TENSOR};
use super::flash::CacheRows;
use super::grad::GradSrc;
use super::{check_len, ensure, CudaError, Gpu, Result};

pub(crate) const BLOCK: u32 = 256;

pub(crate) fn grid(n: usize) -> (u32, u32, u32) {
    (n.div_ceil(BLOCK as usize) as u32, 1, 1)
}

/// Launch an element-wise kernel over `n` values: `(buffer, n, extra args...)`.
fn elementwise(gpu: &Gpu, name: &'static str, n: usize, args: &[Arg]) -> Result<()> {
    gpu.launch(&TENSOR, name, grid(n), (BLOCK, 1, 1), 0, args)
}

/// `acc[i] += x[i]` for `i < n` (f32, as Rust's `a += b`).
pub fn add_into(gpu: &Gpu, acc: &mut CudaSlice<f32>, x: &CudaSlice<f32>, n: usize) -> Result<()> {
    check_len("add_into acc", acc, n, format!("[{n}]"))?;
    check_len("add_into x", x, n, format!("[{n}]"))?;
    elementwise(
        gpu,
        "add_into",
        n,
        &[Arg::P(gpu.ptr(acc)), Arg::P(gpu.ptr(x)), Arg::L(n as i64)],
    )
}

/// `x[i] = x[i] / s` for `i < n` (IEEE division, as Rust's `x / s`).
pub fn div_scalar(gpu: &Gpu, x: &mut CudaSlice<f32>, n: usize, s: f32) -> Result<()> {
    check_len("div_scalar x", x, n, format!("[{n}]"))?;
    elementwise(
        gpu,
        "div_scalar",
        n,
        &[Arg::P(gpu.ptr(x)), Arg::L(n as i64), Arg::F(s)],
    )
}

/// Round `x[..n]` to BF16 (nearest even) and back, as [`crate::bf16::round_slice`].
pub fn round_bf16(gpu: &Gpu, x: &mut CudaSlice<f32>, n: usize) -> Result<()> {
    check_len("round_bf16 x", x, n, format!("[{n}]"))?;
    elementwise(
        gpu,
        "round_bf16_inplace",
        n,
        &[Arg::P(gpu.ptr(x)), Arg::L(n as i64)],
    )
}

/// The BF16 values `x` widened to f32 (exact), a new buffer of `x.len()`.
pub fn bf16_to_f32(gpu: &Gpu, x: &CudaSlice<u16>) -> Result<CudaSlice<f32>> {
    let n = x.len();
    let y = gpu.uninit::<f32>(n)?;
    if n > 0 {
        elementwise(
            gpu,
            "bf16_widen",
            n,
            &[Arg::P(gpu.ptr(x)), Arg::L(n as i64), Arg::P(gpu.ptr(&y))],
        )?;
    }
    Ok(y)
}

/// `x[i] = v` for `i < n` (for zeros, [`Gpu::zeros`] allocates them directly).
pub fn fill(gpu: &Gpu, x: &mut CudaSlice<f32>, n: usize, v: f32) -> Result<()> {
    check_len("fill x", x, n, format!("[{n}]"))?;
    elementwise(
        gpu,
        "fill_f32",
        n,
        &[Arg::P(gpu.ptr(x)), Arg::L(n as i64), Arg::F(v)],
    )
}

/// Check `rows` against a buffer of `len` values seen as `[len / cols, cols]` and
/// upload them as i64.
fn row_indices(
    gpu: &Gpu,
    what: &str,
    len: usize,
    cols: usize,
    rows: &[usize],
) -> Result<CudaSlice<i64>> {
    ensure(cols > 0, || format!("{what}: cols must be positive"))?;
    let have = len / cols;
    if let Some((j, &r)) = rows.iter().enumerate().find(|(_, &r)| r >= have) {
        return Err(CudaError::Invalid(format!(
            "{what}: row index {r} (entry {j}) is outside [{have}, {cols}] ({len} values)"
        )));
    }
    gpu.upload(&rows.iter().map(|&r| r as i64).collect::<Vec<_>>())
}

/// `out [rows.len(), cols]`, `out[j] = x[rows[j]]` with `x` seen as
/// `[x.len() / cols, cols]`. Indices are checked here (an error, not a device fault);
/// repeats are fine. With no rows the result is a 1-value placeholder.
pub fn gather_rows(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    cols: usize,
    rows: &[usize],
) -> Result<CudaSlice<f32>> {
    let idx = row_indices(gpu, "gather_rows", x.len(), cols, rows)?;
    let n = rows.len();
    let out = gpu.uninit::<f32>(n * cols)?;
    gpu.launch(
        &TENSOR,
        "gather_rows",
        grid(n * cols),
        (BLOCK, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(x)),
            Arg::P(gpu.ptr(&idx)),
            Arg::L(n as i64),
            Arg::L(cols as i64),
            Arg::P(gpu.ptr(&out)),
        ],
    )?;
    Ok(out)
}

/// `dst[rows[j]] = src[j]` (whole rows of `cols`), `src [rows.len(), cols]`, `dst`
/// seen as `[dst.len() / cols, cols]`: new K/V rows into a cache `[B * capacity,
/// kvd]`, the LM head's dn rows into place. Indices must be in range and distinct (a repeat
/// would make the result depend on thread order), checked here.
pub fn scatter_rows(
    gpu: &Gpu,
    dst: &mut CudaSlice<f32>,
    cols: usize,
    rows: &[usize],
    src: &CudaSlice<f32>,
) -> Result<()> {
    ensure(cols > 0, || {
        "scatter_rows: cols must be positive".to_string()
    })?;
    let rows = CacheRows::new(gpu, rows, dst.len() / cols)?;
    scatter_rows_dev(gpu, dst, cols, &rows, src)
}

/// [`scatter_rows`] to rows checked and uploaded once ([`CacheRows`], with their
/// sources): a prefill
/// writes the same rows into every layer's k and v caches.
pub fn scatter_rows_dev(
    gpu: &Gpu,
    dst: &mut CudaSlice<f32>,
    cols: usize,
    rows: &CacheRows,
    src: &CudaSlice<f32>,
) -> Result<()> {
    rows.fits("scatter_rows", dst, cols)?;
    let n = rows.len();
    rows.source_fits("scatter_rows src", src, cols)?;
    if n == 0 {
        return Ok(());
    }
    gpu.launch(
        &TENSOR,
        "scatter_rows",
        grid(n * cols),
        (BLOCK, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(dst)),
            Arg::P(gpu.ptr(rows.idx())),
            Arg::P(rows.src_ptr(gpu)),
            Arg::L(n as i64),
            Arg::L(cols as i64),
            Arg::P(gpu.ptr(src)),
        ],
    )
}

/// Blocks of the first pass of [`sum_squares_into`]: a function of `n` alone (never
/// of the device), so the summation order, hence the bits, are fixed for a given `n`.
fn sumsq_blocks(n: usize) -> usize {
    n.div_ceil(BLOCK as usize * 8).clamp(1, 1024)
}

/// `acc[t] += sum of squares of xs[t]` for every t (`acc` holds at least
/// `xs.len()` values) in two launches: each tensor's blocks and sums are those of
/// [`sum_squares_into`] on its values (a gradient's with its BF16 addend added,
/// [`GradSrc`]), so the bits are too.
pub fn sum_squares_multi(gpu: &Gpu, xs: &[GradSrc], acc: &mut CudaSlice<f64>) -> Result<()> {
    ensure(xs.len() <= acc.len(), || {
        format!(
            "sum_squares_multi: {} tensors for {} sums",
            xs.len(),
            acc.len()
        )
    })?;
    let mut tab: Vec<i64> = Vec::with_capacity(xs.len() * 6);
    let mut first = 0usize;
    for (t, x) in xs.iter().enumerate() {
        let n = x.len;
        let what = format!("sum_squares_multi tensor {t}");
        let (a, p) = x.ptrs(gpu, &what)?;
        let mask = x.mask_ptr(gpu, &what)?;
        let blocks = if n == 0 { 0 } else { sumsq_blocks(n) };
        tab.extend([
            a as i64,
            p as i64,
            n as i64,
            blocks as i64,
            first as i64,
            mask as i64,
        ]);
        first += blocks;
    }
    if first == 0 {
        return Ok(());
    }
    let tab = gpu.upload(&tab)?;
    let part = gpu.uninit::<f64>(first)?;
    gpu.launch(
        &TENSOR,
        "sumsq_partial_multi",
        (first as u32, 1, 1),
        (BLOCK, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(&tab)),
            Arg::I(xs.len() as i32),
            Arg::P(gpu.ptr(&part)),
        ],
    )?;
    gpu.launch(
        &TENSOR,
        "sumsq_final_multi",
        (xs.len() as u32, 1, 1),
        (1024, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(&tab)),
            Arg::P(gpu.ptr(&part)),
            Arg::P(gpu.ptr(acc)),
        ],
    )
}

/// The global gradient norm and the clip's scale, on the device, from the
/// per-tensor sums of squares `acc [n]` ([`sum_squares_multi`]'s): `norm [1]` =
/// sqrt of their in-order sum, `scale [1]` = `clip / norm` when `clip > 0` and the
/// norm exceeds it, else 1, as f32 (the host optimizer's operations, so its bits).
/// AdamW reads the scale where it is (`adamw::adamw_multi_scaled`).
pub fn clip_scale(
    gpu: &Gpu,
    acc: &CudaSlice<f64>,
    n: usize,
    clip: f64,
) -> Result<(CudaSlice<f64>, CudaSlice<f32>)> {
    check_len("clip_scale sums", acc, n, format!("[{n}]"))?;
    ensure(n <= i32::MAX as usize, || format!("clip_scale: {n} sums"))?;
    let (norm, scale) = (gpu.uninit::<f64>(1)?, gpu.uninit::<f32>(1)?);
    gpu.launch(
        &TENSOR,
        "grad_clip_scale",
        (1, 1, 1),
        (32, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(acc)),
            Arg::I(n as i32),
            Arg::D(clip),
            Arg::P(gpu.ptr(&norm)),
            Arg::P(gpu.ptr(&scale)),
        ],
    )?;
    Ok((norm, scale))
}

/// `acc[slot] += sum_i (x[i] as f64)^2` over `i < n`, in f64 and a fixed order (block
/// partials into a scratch buffer, then one block sums them): bitwise the same on
/// every run. For a global gradient norm, give every tensor the same `acc` and slot
/// (or one slot each) and download `acc` once at the end.
pub fn sum_squares_into(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    n: usize,
    acc: &mut CudaSlice<f64>,
    slot: usize,
) -> Result<()> {
    check_len("sum_squares_into x", x, n, format!("[{n}]"))?;
    ensure(slot < acc.len(), || {
        format!(
            "sum_squares_into: slot {slot} is outside acc of {} values",
            acc.len()
        )
    })?;
    if n == 0 {
        return Ok(());
    }
    let blocks = sumsq_blocks(n);
    let part = gpu.uninit::<f64>(blocks)?;
    gpu.launch(
        &TENSOR,
        "sumsq_partial",
        (blocks as u32, 1, 1),
        (BLOCK, 1, 1),
        0,
        &[Arg::P(gpu.ptr(x)), Arg::L(n as i64), Arg::P(gpu.ptr(&part))],
    )?;
    gpu.launch(
        &TENSOR,
        "sumsq_final",
        (1, 1, 1),
        (1024, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(&part)),
            Arg::I(blocks as i32),
            Arg::P(gpu.ptr(acc)),
            Arg::L(slot as i64),
        ],
    )
}
