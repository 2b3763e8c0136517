//! Causal GQA attention on the GPU for short sequences (`attention.cu`): the
//! training forward and backward over packed sequences, and the decode step
//! against a KV cache, all through one per-row kernel (so, as `attend_row` on the
//! CPU, a row's output does not depend on the other rows of the batch).
//!
//! Packed batch: sequences of `seq_lens` rows follow each other in q `[rows, nh*hd]`
//! and k, v `[rows, nkv*hd]`; probs of sequence s are `[len_s, nh, len_s]` (the
//! CPU's layout), concatenated; zero above the diagonal.

use cudarc::driver::CudaSlice;

use super::context::{Arg, ATTENTION};
use super::flash::{paged_rows, PAGE_ROWS};
use super::{check_len, ensure, Gpu, Result};
use crate::ops::attention::AttnShape;

/// Longest row the kernels take: the scores of a row live in 48 KiB of shared memory.
pub const MAX_ATTN_LEN: usize = 8192;

/// Per-row metadata on the device: first kv row, keys seen, probs offset and stride,
/// and (backward) the end of the row's sequence.
struct Rows {
    n: usize,
    kv0: CudaSlice<i32>,
    len: CudaSlice<i32>,
    poff: CudaSlice<i64>,
    pstride: CudaSlice<i32>,
    end: CudaSlice<i32>,
    max_len: usize,
    probs_len: usize,
}

fn packed_rows(gpu: &Gpu, seq_lens: &[usize], nh: usize) -> Result<Rows> {
    let (mut kv0, mut len, mut poff, mut pstride, mut end) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut start, mut off) = (0usize, 0usize);
    for &s in seq_lens {
        ensure(s <= MAX_ATTN_LEN, || {
            format!("attention: a sequence of {s} rows is longer than {MAX_ATTN_LEN}")
        })?;
        for t in 0..s {
            kv0.push(start as i32);
            len.push((t + 1) as i32);
            poff.push((off + t * nh * s) as i64);
            pstride.push(s as i32);
            end.push((start + s) as i32);
        }
        start += s;
        off += s * nh * s;
    }
    Ok(Rows {
        n: start,
        max_len: seq_lens.iter().copied().max().unwrap_or(0),
        probs_len: off,
        kv0: gpu.upload(&kv0)?,
        len: gpu.upload(&len)?,
        poff: gpu.upload(&poff)?,
        pstride: gpu.upload(&pstride)?,
        end: gpu.upload(&end)?,
    })
}

fn check_shape(shape: AttnShape) -> Result<()> {
    ensure(
        shape.n_kv_heads > 0
            && shape.n_heads.is_multiple_of(shape.n_kv_heads)
            && shape.head_dim > 0,
        || {
            format!(
                "attention: {} query heads do not group over {} kv heads",
                shape.n_heads, shape.n_kv_heads
            )
        },
    )
}

fn smem(hd: usize, max_len: usize) -> u32 {
    ((hd + max_len.max(1)) * 4) as u32
}

#[allow(clippy::too_many_arguments)]
fn fwd(
    gpu: &Gpu,
    q: &CudaSlice<f32>,
    k: &CudaSlice<f32>,
    v: &CudaSlice<f32>,
    rows: &Rows,
    shape: AttnShape,
    out: &CudaSlice<f32>,
    probs: u64,
    pages: u64,
) -> Result<()> {
    let hd = shape.head_dim;
    gpu.launch(
        &ATTENTION,
        "attn_fwd",
        (rows.n as u32, shape.n_heads as u32, 1),
        (128, 1, 1),
        smem(hd, rows.max_len),
        &[
            Arg::P(gpu.ptr(q)),
            Arg::P(gpu.ptr(k)),
            Arg::P(gpu.ptr(v)),
            Arg::P(gpu.ptr(&rows.kv0)),
            Arg::P(pages),
            Arg::I(PAGE_ROWS as i32),
            Arg::P(gpu.ptr(&rows.len)),
            Arg::P(gpu.ptr(&rows.poff)),
            Arg::P(gpu.ptr(&rows.pstride)),
            Arg::I(shape.n_heads as i32),
            Arg::I(shape.n_kv_heads as i32),
            Arg::I(hd as i32),
            Arg::F((1.0 / (hd as f64).sqrt()) as f32),
            Arg::P(gpu.ptr(out)),
            Arg::P(probs),
        ],
    )
}

/// Forward over packed sequences: `(out [rows, nh*hd], probs)`.
pub fn attention_forward(
    gpu: &Gpu,
    q: &CudaSlice<f32>,
    k: &CudaSlice<f32>,
    v: &CudaSlice<f32>,
    seq_lens: &[usize],
    shape: AttnShape,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    check_shape(shape)?;
    let rows = packed_rows(gpu, seq_lens, shape.n_heads)?;
    let (qw, kvw) = (
        shape.n_heads * shape.head_dim,
        shape.n_kv_heads * shape.head_dim,
    );
    check_len("attention q", q, rows.n * qw, format!("[{}, {qw}]", rows.n))?;
    check_len(
        "attention k",
        k,
        rows.n * kvw,
        format!("[{}, {kvw}]", rows.n),
    )?;
    check_len(
        "attention v",
        v,
        rows.n * kvw,
        format!("[{}, {kvw}]", rows.n),
    )?;
    let out = gpu.uninit::<f32>(rows.n * qw)?;
    let probs = gpu.zeros::<f32>(rows.probs_len.max(1))?;
    fwd(gpu, q, k, v, &rows, shape, &out, gpu.ptr(&probs), 0)?;
    Ok((out, probs))
}

/// Backward over packed sequences: `(dq, dk, dv)` from `dout` and the forward's
/// q, k, v, probs.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    gpu: &Gpu,
    dout: &CudaSlice<f32>,
    q: &CudaSlice<f32>,
    k: &CudaSlice<f32>,
    v: &CudaSlice<f32>,
    probs: &CudaSlice<f32>,
    seq_lens: &[usize],
    shape: AttnShape,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>)> {
    check_shape(shape)?;
    let rows = packed_rows(gpu, seq_lens, shape.n_heads)?;
    let (hd, nh, nkv) = (shape.head_dim, shape.n_heads, shape.n_kv_heads);
    let (qw, kvw) = (nh * hd, nkv * hd);
    for (what, b, n) in [
        ("dout", dout, rows.n * qw),
        ("q", q, rows.n * qw),
        ("k", k, rows.n * kvw),
        ("v", v, rows.n * kvw),
        ("probs", probs, rows.probs_len),
    ] {
        check_len(
            &format!("attention backward {what}"),
            b,
            n,
            format!("{} rows", rows.n),
        )?;
    }
    let ds = gpu.zeros::<f32>(rows.probs_len.max(1))?;
    let dq = gpu.uninit::<f32>(rows.n * qw)?;
    let (dk, dv) = (
        gpu.uninit::<f32>(rows.n * kvw)?,
        gpu.uninit::<f32>(rows.n * kvw)?,
    );
    let meta = [
        gpu.ptr(&rows.kv0),
        gpu.ptr(&rows.len),
        gpu.ptr(&rows.poff),
        gpu.ptr(&rows.pstride),
    ];
    let dims = [Arg::I(nh as i32), Arg::I(nkv as i32), Arg::I(hd as i32)];
    let mut args = vec![
        Arg::P(gpu.ptr(dout)),
        Arg::P(gpu.ptr(q)),
        Arg::P(gpu.ptr(k)),
        Arg::P(gpu.ptr(v)),
        Arg::P(gpu.ptr(probs)),
    ];
    args.extend(meta.iter().map(|&p| Arg::P(p)));
    args.extend(dims);
    args.extend([
        Arg::F((1.0 / (hd as f64).sqrt()) as f32),
        Arg::P(gpu.ptr(&ds)),
        Arg::P(gpu.ptr(&dq)),
    ]);
    gpu.launch(
        &ATTENTION,
        "attn_bwd_q",
        (rows.n as u32, nh as u32, 1),
        (128, 1, 1),
        smem(hd, rows.max_len),
        &args,
    )?;
    let mut args = vec![
        Arg::P(gpu.ptr(dout)),
        Arg::P(gpu.ptr(q)),
        Arg::P(gpu.ptr(probs)),
        Arg::P(gpu.ptr(&ds)),
        Arg::P(meta[0]),
        Arg::P(gpu.ptr(&rows.end)),
        Arg::P(meta[2]),
        Arg::P(meta[3]),
    ];
    args.extend(dims);
    args.extend([Arg::P(gpu.ptr(&dk)), Arg::P(gpu.ptr(&dv))]);
    gpu.launch(
        &ATTENTION,
        "attn_bwd_kv",
        (rows.n as u32, nkv as u32, 1),
        (hd.min(256) as u32, 1, 1),
        0,
        &args,
    )?;
    Ok((dq, dk, dv))
}

/// Decode: one query row per sequence `q [B, nh*hd]` against its KV cache rows
/// `0..lens[b]` of `k_cache, v_cache [B, capacity, nkv*hd]` -> `out [B, nh*hd]`.
/// The same kernel as the forward, so it gives the forward's last row bit for bit.
pub fn attention_decode(
    gpu: &Gpu,
    q: &CudaSlice<f32>,
    k_cache: &CudaSlice<f32>,
    v_cache: &CudaSlice<f32>,
    capacity: usize,
    lens: &[usize],
    shape: AttnShape,
) -> Result<CudaSlice<f32>> {
    let slots: Vec<usize> = (0..lens.len()).collect();
    attention_decode_at(gpu, q, k_cache, v_cache, capacity, &slots, lens, shape)
}

/// [`attention_decode`] where query row b reads cache slot `slots[b]` of
/// `k_cache, v_cache [S, capacity, nkv*hd]` (a rollout's unfinished sequences are
/// a subset of the slots).
#[allow(clippy::too_many_arguments)]
pub fn attention_decode_at(
    gpu: &Gpu,
    q: &CudaSlice<f32>,
    k_cache: &CudaSlice<f32>,
    v_cache: &CudaSlice<f32>,
    capacity: usize,
    slots: &[usize],
    lens: &[usize],
    shape: AttnShape,
) -> Result<CudaSlice<f32>> {
    check_shape(shape)?;
    let b = lens.len();
    let (qw, kvw) = (
        shape.n_heads * shape.head_dim,
        shape.n_kv_heads * shape.head_dim,
    );
    ensure(slots.len() == b, || {
        format!("decode: {} slots for {b} rows", slots.len())
    })?;
    let n_slots = slots.iter().map(|&s| s + 1).max().unwrap_or(0);
    check_len("decode q", q, b * qw, format!("[{b}, {qw}]"))?;
    check_len(
        "k cache",
        k_cache,
        n_slots * capacity * kvw,
        format!("[{n_slots}, {capacity}, {kvw}]"),
    )?;
    check_len(
        "v cache",
        v_cache,
        n_slots * capacity * kvw,
        format!("[{n_slots}, {capacity}, {kvw}]"),
    )?;
    ensure(
        lens.iter()
            .all(|&l| l >= 1 && l <= capacity.min(MAX_ATTN_LEN)),
        || {
            format!(
                "decode: lengths {lens:?} must lie in 1..={}",
                capacity.min(MAX_ATTN_LEN)
            )
        },
    )?;
    let kv0: Vec<i32> = slots.iter().map(|&s| (s * capacity) as i32).collect();
    decode_rows(gpu, q, (k_cache, v_cache), &kv0, lens, shape, 0)
}

/// [`attention_decode_at`] against a paged cache (`flash::PAGE_ROWS` rows a page):
/// key j of row b is cache row `pages[slots[b] * stride + j / PAGE_ROWS] *
/// PAGE_ROWS + j % PAGE_ROWS` of `k_cache, v_cache [*, nkv*hd]`. The caller's
/// table names pages inside the caches.
#[allow(clippy::too_many_arguments)]
pub fn attention_decode_paged(
    gpu: &Gpu,
    q: &CudaSlice<f32>,
    (k_cache, v_cache): (&CudaSlice<f32>, &CudaSlice<f32>),
    (pages, stride): (&CudaSlice<i32>, usize),
    slots: &[usize],
    lens: &[usize],
    shape: AttnShape,
) -> Result<CudaSlice<f32>> {
    check_shape(shape)?;
    let kv0 = paged_rows(
        (
            k_cache.len(),
            v_cache.len(),
            shape.n_kv_heads * shape.head_dim,
        ),
        (pages, stride),
        slots,
        lens,
        (stride * PAGE_ROWS).min(MAX_ATTN_LEN),
    )?;
    decode_rows(
        gpu,
        q,
        (k_cache, v_cache),
        &kv0,
        lens,
        shape,
        gpu.ptr(pages),
    )
}

/// The decode rows' launch: row b's keys from `kv0[b]` (a first row, or with
/// `pages` an offset into that table) for `lens[b]` keys.
fn decode_rows(
    gpu: &Gpu,
    q: &CudaSlice<f32>,
    (k_cache, v_cache): (&CudaSlice<f32>, &CudaSlice<f32>),
    kv0: &[i32],
    lens: &[usize],
    shape: AttnShape,
    pages: u64,
) -> Result<CudaSlice<f32>> {
    let b = lens.len();
    let qw = shape.n_heads * shape.head_dim;
    check_len("decode q", q, b * qw, format!("[{b}, {qw}]"))?;
    let len: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
    let rows = Rows {
        n: b,
        max_len: lens.iter().copied().max().unwrap_or(0),
        probs_len: 0,
        kv0: gpu.upload(kv0)?,
        len: gpu.upload(&len)?,
        poff: gpu.upload(&vec![0i64; b])?,
        pstride: gpu.upload(&vec![0i32; b])?,
        end: gpu.upload(&vec![0i32; b])?,
    };
    let out = gpu.uninit::<f32>(b * qw)?;
    fwd(gpu, q, k_cache, v_cache, &rows, shape, &out, 0, pages)?;
    Ok(out)
}
