//! Token log-probabilities, entropy and log-sum-exp of logits `[rows, vocab]` on
//! the GPU (`logsoftmax.cu`), forward and backward, as `ops::logsoftmax`.

use cudarc::driver::CudaSlice;

use super::context::{Arg, LOGSOFTMAX};
use super::{check_len, Gpu, Result};

/// Threads of every kernel that reduces a whole row (`row_shift`): the block size
/// fixes the order of the sum, so all of them use one.
const ROW_THREADS: u32 = 512;

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

/// Forward: logp, entropy, lse of each row for its target token.
pub fn token_logprobs_forward(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
    tgt: &[u32],
) -> Result<GpuTokenLogprobs> {
    check_len("logits", logits, rows * vocab, format!("[{rows}, {vocab}]"))?;
    let t = targets(gpu, tgt, rows, vocab)?;
    let out = GpuTokenLogprobs {
        logp: gpu.uninit(rows)?,
        entropy: gpu.uninit(rows)?,
        lse: gpu.uninit(rows)?,
    };
    gpu.launch(
        &LOGSOFTMAX,
        "token_logprobs_fwd",
        (rows as u32, 1, 1),
        (ROW_THREADS, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(logits)),
            Arg::I(rows as i32),
            Arg::I(vocab as i32),
            Arg::P(gpu.ptr(&t)),
            Arg::P(gpu.ptr(&out.logp)),
            Arg::P(gpu.ptr(&out.entropy)),
            Arg::P(gpu.ptr(&out.lse)),
        ],
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
    check_len("logits", logits, rows * vocab, format!("[{rows}, {vocab}]"))?;
    let out = gpu.uninit::<f32>(rows * vocab)?;
    gpu.launch(
        &LOGSOFTMAX,
        "log_softmax_rows",
        (rows as u32, 1, 1),
        (ROW_THREADS, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(logits)),
            Arg::I(rows as i32),
            Arg::I(vocab as i32),
            Arg::P(gpu.ptr(&out)),
        ],
    )?;
    Ok(out)
}

/// Each row's max and `ln S` (`row_shift` in `logsoftmax.cu`): `(m [rows], lns
/// [rows])`, the numbers [`token_logprobs_forward`] and [`log_softmax_rows`] shift
/// by, bit for bit.
pub(crate) fn row_stats(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    check_len("logits", logits, rows * vocab, format!("[{rows}, {vocab}]"))?;
    let (m, lns) = (gpu.uninit::<f32>(rows)?, gpu.uninit::<f32>(rows)?);
    gpu.launch(
        &LOGSOFTMAX,
        "row_stats",
        (rows as u32, 1, 1),
        (ROW_THREADS, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(logits)),
            Arg::I(rows as i32),
            Arg::I(vocab as i32),
            Arg::P(gpu.ptr(&m)),
            Arg::P(gpu.ptr(&lns)),
        ],
    )?;
    Ok((m, lns))
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
    check_len("logits", logits, rows * vocab, format!("[{rows}, {vocab}]"))?;
    for (what, b) in [
        ("lse", &fwd.lse),
        ("entropy", &fwd.entropy),
        ("dlogp", dlogp),
    ] {
        check_len(what, b, rows, format!("[{rows}]"))?;
    }
    if let Some(d) = dentropy {
        check_len("dentropy", d, rows, format!("[{rows}]"))?;
    }
    let t = targets(gpu, tgt, rows, vocab)?;
    let dz = gpu.uninit::<f32>(rows * vocab)?;
    gpu.launch(
        &LOGSOFTMAX,
        "token_logprobs_bwd",
        (rows as u32, vocab.div_ceil(256) as u32, 1),
        (256, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(logits)),
            Arg::I(rows as i32),
            Arg::I(vocab as i32),
            Arg::P(gpu.ptr(&t)),
            Arg::P(gpu.ptr(&fwd.lse)),
            Arg::P(gpu.ptr(&fwd.entropy)),
            Arg::P(gpu.ptr(dlogp)),
            Arg::P(dentropy.map_or(0, |d| gpu.ptr(d))),
            Arg::P(gpu.ptr(&dz)),
        ],
    )?;
    Ok(dz)
}
