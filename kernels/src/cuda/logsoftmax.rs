//! Token log-probabilities, entropy and log-sum-exp of logits `[rows, vocab]` on
//! the GPU (`logsoftmax.cu`), forward and backward, as `ops::logsoftmax`.

use cudarc::driver::CudaSlice;

use super::act::{Act, ActRef};
use super::context::{Arg, LOGSOFTMAX, QUANTIZE};
use super::quantize::{unwritten_dual, DualFp8};
use super::{check_len, ensure, pad16, Gpu, Result};
use crate::GemmPrecision;

/// Entries of a row a `softmax_chunk_stats` block reduces (`LS_CHUNK` in
/// `logsoftmax.cu`): fixed, so every caller's max and `ln S` are the same bits
/// (and the plain draw's chunks, [`super::draw`]).
pub(super) const LS_CHUNK: usize = 8192;
/// Its block size (`LS_THREADS`).
pub(super) const LS_THREADS: u32 = 256;

/// Per-row results, each `[rows]` on the device.
pub struct GpuTokenLogprobs {
    pub logp: CudaSlice<f32>,
    pub entropy: CudaSlice<f32>,
    pub lse: CudaSlice<f32>,
}

fn targets(gpu: &Gpu, t: &[u32], rows: usize, vocab: usize) -> Result<CudaSlice<i32>> {
    super::ensure(t.len() == rows && vocab > 0, || {
        format!(
            "token_logprobs: {} targets for {rows} rows of {vocab}",
            t.len()
        )
    })?;
    if let Some((r, &x)) = t.iter().enumerate().find(|(_, &x)| x as usize >= vocab) {
        return Err(super::CudaError::Invalid(format!(
            "token_logprobs: target {x} of row {r} is outside the vocabulary of {vocab}"
        )));
    }
    gpu.upload(&t.iter().map(|&x| x as i32).collect::<Vec<_>>())
}

/// `logits` holds `[rows, vocab]`.
fn check_logits<'a>(logits: impl Into<ActRef<'a>>, rows: usize, vocab: usize) -> Result<()> {
    let shape = format!("[{rows}, {vocab}]");
    logits.into().check("logits", rows * vocab, &shape)
}

/// Forward: logp, entropy, lse of each row for its target token.
pub fn token_logprobs_forward(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
    tgt: &[u32],
) -> Result<GpuTokenLogprobs> {
    check_logits(logits, rows, vocab)?;
    scored_forward(gpu, logits.into(), None, rows, vocab, tgt)
}

/// [`token_logprobs_forward`] of the rows `at` (distinct, each `< total`) of
/// `logits [total, vocab]`, read in place: result `i` scores row `at[i]` for
/// `tgt[i]`, the same bits as the forward over those rows gathered.
pub fn token_logprobs_forward_at<'a>(
    gpu: &Gpu,
    logits: impl Into<ActRef<'a>>,
    total: usize,
    vocab: usize,
    at: &[usize],
    tgt: &[u32],
) -> Result<GpuTokenLogprobs> {
    let logits = logits.into();
    check_logits(logits, total, vocab)?;
    slots(at, total)?;
    let src = gpu.upload(&at.iter().map(|&r| r as i32).collect::<Vec<_>>())?;
    scored_forward(gpu, logits, Some(&src), at.len(), vocab, tgt)
}

/// `at` as the map from a logits row to its scored slot (-1: not scored), after
/// checking that the rows are distinct and inside `[0, total)`.
fn slots(at: &[usize], total: usize) -> Result<Vec<i32>> {
    super::ensure(total <= i32::MAX as usize, || {
        format!("token_logprobs: {total} logits rows exceed the i32 row index")
    })?;
    let mut slot = vec![-1i32; total];
    for (i, &r) in at.iter().enumerate() {
        super::ensure(r < total && slot[r] < 0, || {
            format!(
                "token_logprobs: scored row {r} (entry {i}) is repeated or outside [0, {total})"
            )
        })?;
        slot[r] = i as i32;
    }
    Ok(slot)
}

fn scored_forward(
    gpu: &Gpu,
    logits: ActRef,
    src: Option<&CudaSlice<i32>>,
    rows: usize,
    vocab: usize,
    tgt: &[u32],
) -> Result<GpuTokenLogprobs> {
    let t = targets(gpu, tgt, rows, vocab)?;
    let out = GpuTokenLogprobs {
        logp: gpu.uninit(rows)?,
        entropy: gpu.uninit(rows)?,
        lse: gpu.uninit(rows)?,
    };
    if rows == 0 {
        return Ok(out);
    }
    let st = chunk_stats(gpu, logits, src, rows, vocab)?;
    finish(
        gpu,
        (&st, rows, vocab),
        Some((logits, src, &t)),
        None,
        Some(&out),
    )?;
    Ok(out)
}

/// Log-probabilities `[rows, vocab]` (for sampling); a token's entry equals
/// [`token_logprobs_forward`]'s logp bit for bit.
pub fn log_softmax_rows(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
) -> Result<CudaSlice<f32>> {
    let (m, lns) = row_stats(gpu, logits, rows, vocab)?;
    let out = gpu.uninit::<f32>(rows * vocab)?;
    if rows == 0 {
        return Ok(out);
    }
    gpu.launch(
        &LOGSOFTMAX,
        "log_softmax_rows",
        (rows as u32, vocab.div_ceil(1024) as u32, 1),
        (256, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(logits)),
            Arg::I(vocab as i32),
            Arg::P(gpu.ptr(&m)),
            Arg::P(gpu.ptr(&lns)),
            Arg::P(gpu.ptr(&out)),
        ],
    )?;
    Ok(out)
}

/// Each row's max and `ln S`: `(m [rows], lns [rows])`, the numbers
/// [`token_logprobs_forward`] and [`log_softmax_rows`] shift by, bit for bit.
pub(crate) fn row_stats(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    check_logits(logits, rows, vocab)?;
    let (m, lns) = (gpu.uninit::<f32>(rows)?, gpu.uninit::<f32>(rows)?);
    if rows == 0 {
        return Ok((m, lns));
    }
    let st = chunk_stats(gpu, logits.into(), None, rows, vocab)?;
    finish(gpu, (&st, rows, vocab), None, Some((&m, &lns)), None)?;
    Ok((m, lns))
}

/// The chunks of a row of `vocab` entries, whose indices the kernels keep in i32.
fn stat_chunks(vocab: usize) -> Result<usize> {
    super::ensure(vocab > 0 && vocab <= i32::MAX as usize - LS_CHUNK, || {
        format!("log-softmax over a vocabulary of {vocab}")
    })?;
    Ok(vocab.div_ceil(LS_CHUNK))
}

/// `softmax_chunk_stats`: `[rows][chunks]` of (max, sum of exp, sum of exp times
/// the shifted logit, 0) over chunks of [`LS_CHUNK`] entries of each scored row
/// (row `src[r]` of `logits`, or row `r`), as f32 quadruples.
fn chunk_stats(
    gpu: &Gpu,
    logits: ActRef,
    src: Option<&CudaSlice<i32>>,
    rows: usize,
    vocab: usize,
) -> Result<CudaSlice<f32>> {
    let chunks = stat_chunks(vocab)?;
    let st = gpu.uninit::<f32>(rows * chunks * 4)?;
    gpu.launch(
        &LOGSOFTMAX,
        logits.kernel("softmax_chunk_stats", "softmax_chunk_stats_z16"),
        (rows as u32, chunks as u32, 1),
        (LS_THREADS, 1, 1),
        0,
        &[
            logits.ptr_arg(gpu),
            Arg::I(vocab as i32),
            Arg::P(src.map_or(0, |s| gpu.ptr(s))),
            Arg::P(gpu.ptr(&st)),
        ],
    )?;
    Ok(st)
}

/// [`chunk_stats`] of every row of tempered `logits [rows, vocab]` (f32) with each
/// chunk's integer mass for the plain draw (`softmax_chunk_stats_mass`): the stats
/// `[rows][chunks]` (four f32 each, the same bits as `chunk_stats`') and the masses
/// `[rows][chunks]`.
pub(super) fn mass_stats(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
) -> Result<(CudaSlice<f32>, CudaSlice<u64>)> {
    check_logits(logits, rows, vocab)?;
    let chunks = stat_chunks(vocab)?;
    let st = gpu.uninit::<f32>(rows * chunks * 4)?;
    let mass = gpu.uninit::<u64>(rows * chunks)?;
    if rows > 0 {
        gpu.launch(
            &LOGSOFTMAX,
            "softmax_chunk_stats_mass",
            (rows as u32, chunks as u32, 1),
            (LS_THREADS, 1, 1),
            0,
            &[
                Arg::P(gpu.ptr(logits)),
                Arg::I(vocab as i32),
                Arg::P(gpu.ptr(&st)),
                Arg::P(gpu.ptr(&mass)),
            ],
        )?;
    }
    Ok((st, mass))
}

/// The logits, their scored rows (`None`: every row) and the targets.
type Scored<'a> = (ActRef<'a>, Option<&'a CudaSlice<i32>>, &'a CudaSlice<i32>);

/// `softmax_row_finish`: a row's chunks merged in order into `m, lns` (`shift`)
/// and/or the scored outputs of target `t[r]` in logits row `src[r]` (`scored`).
fn finish(
    gpu: &Gpu,
    (st, rows, vocab): (&CudaSlice<f32>, usize, usize),
    scored: Option<Scored>,
    shift: Option<(&CudaSlice<f32>, &CudaSlice<f32>)>,
    out: Option<&GpuTokenLogprobs>,
) -> Result<()> {
    let p = |x: Option<&CudaSlice<f32>>| Arg::P(x.map_or(0, |x| gpu.ptr(x)));
    let (z, src, tgt, name) = match scored {
        Some((z, src, t)) => (
            z.ptr(gpu),
            src.map_or(0, |s| gpu.ptr(s)),
            gpu.ptr(t),
            z.kernel("softmax_row_finish", "softmax_row_finish_z16"),
        ),
        None => (0, 0, 0, "softmax_row_finish"),
    };
    gpu.launch(
        &LOGSOFTMAX,
        name,
        (rows.div_ceil(128) as u32, 1, 1),
        (128, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(st)),
            Arg::I(rows as i32),
            Arg::I(vocab.div_ceil(LS_CHUNK) as i32),
            Arg::P(z),
            Arg::I(vocab as i32),
            Arg::P(src),
            Arg::P(tgt),
            p(shift.map(|s| s.0)),
            p(shift.map(|s| s.1)),
            p(out.map(|o| &o.logp)),
            p(out.map(|o| &o.entropy)),
            p(out.map(|o| &o.lse)),
        ],
    )
}

/// Backward: `dlogits [rows, vocab]` for `dlogp [rows]` and optional `dentropy [rows]`.
#[allow(clippy::too_many_arguments)]
pub fn token_logprobs_backward(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
    tgt: &[u32],
    fwd: &GpuTokenLogprobs,
    dlogp: &CudaSlice<f32>,
    dentropy: Option<&CudaSlice<f32>>,
) -> Result<CudaSlice<f32>> {
    check_logits(logits, rows, vocab)?;
    let d = ScoredGrad {
        tgt,
        fwd,
        dlogp,
        dentropy,
    };
    let t = scored_inputs(gpu, &d, vocab)?;
    let dz = gpu.uninit::<f32>(rows * vocab)?;
    let args = scored_args(gpu, (logits.into(), rows, vocab), 0, &t, &d, 1.0);
    scored_backward(gpu, args, rows, (gpu.ptr(&dz), 0, vocab), false)?;
    Ok(dz)
}

/// The per-scored-row inputs of the backward, each `[scored rows]`.
pub struct ScoredGrad<'a> {
    pub tgt: &'a [u32],
    pub fwd: &'a GpuTokenLogprobs,
    pub dlogp: &'a CudaSlice<f32>,
    pub dentropy: Option<&'a CudaSlice<f32>>,
}

/// Where [`token_logprobs_backward_at`] writes `dlogits [total, vocab]`: over the
/// logits (f32, in place: each element's gradient needs only that logit and its
/// row's statistics), or as the LM head's BF16 or FP8 GEMM operands. The caller
/// allocates these while the forward runs (`gpu/pass.rs`): a fresh buffer of a
/// gigabyte or more costs the pool milliseconds of host time (it maps new memory),
/// which a stream waiting on the host would sit out.
pub enum ScoredOut {
    InPlace,
    /// `[total][pad16(vocab)]` BF16 bits.
    Bf16(CudaSlice<u16>),
    /// The 1x128 and 128x1 operands.
    Fp8(Box<DualFp8>),
}

impl ScoredOut {
    /// The buffers for `dlogits [total, vocab]` as the operands of a `prec` DGrad
    /// and WGrad (`None`, F32: in place).
    pub fn alloc(
        gpu: &Gpu,
        prec: Option<GemmPrecision>,
        total: usize,
        vocab: usize,
    ) -> Result<ScoredOut> {
        let (rp, cp) = (pad16(total), pad16(vocab));
        ensure(
            rp.checked_mul(cp).is_some_and(|e| e < i64::MAX as usize),
            || format!("token log-prob backward of [{total}, {vocab}]: too large"),
        )?;
        Ok(match prec {
            Some(GemmPrecision::Bf16) => ScoredOut::Bf16(gpu.uninit::<u16>(total * cp)?),
            Some(GemmPrecision::Fp8) => {
                ensure(total > 0, || {
                    "token log-prob backward (FP8) of 0 rows".into()
                })?;
                ScoredOut::Fp8(Box::new(unwritten_dual(gpu, total, vocab)?))
            }
            _ => ScoredOut::InPlace,
        })
    }
}

/// `dlogits` in the form its [`ScoredOut`] asked for.
pub enum ScoredDz {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<u16>),
    Fp8(Box<DualFp8>),
}

/// The backward of [`token_logprobs_forward_at`]: `dlogits [total, vocab]`, row
/// `at[i]` the gradient of result `i` times `scale` (`1 / temperature` for logits
/// that were divided by it; 1 is exact), every other row 0. The same bits as the
/// gathered backward scattered into zeros and scaled; as BF16 operands, the bits
/// of `to_bf16_padded` of it (`token_logprobs_bwd` fuses the copy); as FP8
/// operands, those of `quantize_dual` of it (`token_logprobs_bwd_fp8`, no f32
/// written). `logits` is consumed: in place (f32 only) it becomes the result; the
/// BF16 values of [`super::act::Act::Bf16`] give the same bits as their f32 form.
pub fn token_logprobs_backward_at(
    gpu: &Gpu,
    logits: Act,
    (total, vocab): (usize, usize),
    at: &[usize],
    d: &ScoredGrad,
    scale: f32,
    out: ScoredOut,
) -> Result<ScoredDz> {
    let z = logits.view();
    check_logits(z, total, vocab)?;
    let z16 = z.is_bf16();
    let fp8_kernel = z.kernel("token_logprobs_bwd_fp8", "token_logprobs_bwd_fp8_z16");
    let slot = gpu.upload(&slots(at, total)?)?;
    let t = scored_inputs(gpu, d, vocab)?;
    let args = scored_args(gpu, (z, total, vocab), gpu.ptr(&slot), &t, d, scale);
    match out {
        ScoredOut::InPlace => {
            let Act::F32(logits) = logits else {
                return Err(super::CudaError::Invalid(
                    "token log-prob backward in place needs f32 logits, not BF16".into(),
                ));
            };
            scored_backward(gpu, args, total, (gpu.ptr(&logits), 0, vocab), false)?;
            Ok(ScoredDz::F32(logits))
        }
        ScoredOut::Bf16(b) => {
            let cp = pad16(vocab);
            check_len("BF16 dlogits", &b, total * cp, format!("[{total}][{cp}]"))?;
            scored_backward(gpu, args, total, (0, gpu.ptr(&b), cp), z16)?;
            Ok(ScoredDz::Bf16(b))
        }
        ScoredOut::Fp8(q) => {
            ensure(
                (q.row.rows, q.row.cols, q.col.rows, q.col.cols) == (total, vocab, total, vocab),
                || format!("FP8 dlogits buffers are not those of [{total}, {vocab}]"),
            )?;
            let (rp, cp) = (pad16(total), pad16(vocab));
            gpu.launch(
                &QUANTIZE,
                fp8_kernel,
                (cp.div_ceil(128) as u32, total.div_ceil(128) as u32, 1),
                (512, 1, 1),
                0,
                &[
                    &args[..],
                    &[Arg::I(rp as i32), Arg::I(cp as i32)],
                    &q.args(gpu),
                ]
                .concat(),
            )?;
            Ok(ScoredDz::Fp8(q))
        }
    }
}

/// The arguments `token_logprobs_bwd` and `token_logprobs_bwd_fp8` share, up to
/// their outputs: the logits `[rows, vocab]`, the slots (0: none), the targets, the
/// per-scored-row inputs and the scale.
fn scored_args(
    gpu: &Gpu,
    (logits, rows, vocab): (ActRef, usize, usize),
    slot: u64,
    t: &CudaSlice<i32>,
    d: &ScoredGrad,
    scale: f32,
) -> Vec<Arg> {
    vec![
        logits.ptr_arg(gpu),
        Arg::I(rows as i32),
        Arg::I(vocab as i32),
        Arg::P(slot),
        Arg::P(gpu.ptr(t)),
        Arg::P(gpu.ptr(&d.fwd.lse)),
        Arg::P(gpu.ptr(&d.fwd.entropy)),
        Arg::P(gpu.ptr(d.dlogp)),
        Arg::P(d.dentropy.map_or(0, |x| gpu.ptr(x))),
        Arg::F(scale),
    ]
}

/// Check the per-scored-row inputs; the targets on the device.
fn scored_inputs(gpu: &Gpu, d: &ScoredGrad, vocab: usize) -> Result<CudaSlice<i32>> {
    let rows = d.tgt.len();
    for (what, b) in [
        ("lse", &d.fwd.lse),
        ("entropy", &d.fwd.entropy),
        ("dlogp", d.dlogp),
    ] {
        check_len(what, b, rows, format!("[{rows}]"))?;
    }
    if let Some(de) = d.dentropy {
        check_len("dentropy", de, rows, format!("[{rows}]"))?;
    }
    targets(gpu, d.tgt, rows, vocab)
}

/// `token_logprobs_bwd` over `out_rows` logits rows (`args`: [`scored_args`])
/// into `(dz, dzb, ld)`: f32 `dz [out_rows, vocab]` (which may be the logits: the
/// kernel reads each element before it writes it) with `dzb` 0 and `ld` vocab, or
/// `dz` 0 and the BF16 operand `dzb [out_rows][ld]`, ld = pad16(vocab).
fn scored_backward(
    gpu: &Gpu,
    args: Vec<Arg>,
    out_rows: usize,
    (dz, dzb, ld): (u64, u64, usize),
    z16: bool,
) -> Result<()> {
    if out_rows == 0 {
        return Ok(());
    }
    gpu.launch(
        &LOGSOFTMAX,
        match z16 {
            true => "token_logprobs_bwd_z16",
            false => "token_logprobs_bwd",
        },
        // logsoftmax.cu's TLB_SPAN entries a block (256 threads, four quads each).
        (out_rows as u32, ld.div_ceil(4096) as u32, 1),
        (256, 1, 1),
        0,
        &[&args[..], &[Arg::P(dz), Arg::P(dzb), Arg::I(ld as i32)]].concat(),
    )
}
