//! The linear layers that read one input (q, k, v; gate, up) in one launch each
//! for the GEMMs and the epilogues, where each would take the split-K path (a
//! decode step's few rows on a wgmma GPU): the same blocks and the same adds as
//! one [`forward`] call each, so each output's bits are those of its own call,
//! with two launches where there were six (q, k, v) or four (gate, up).

use cudarc::driver::CudaSlice;

use super::super::act::Act;
use super::super::context::OPS;
use super::super::gemv::{gemv_fp8_partial_group, split_k_pays, CStruct, Partial, GEMV_MAX_TOKENS};
use super::super::gemv_bf16::gemv_bf16_partial_group;
use super::{forward, forward_act, w_rows, x_rows, GpuWeight, XIn, XOperand};
use crate::cuda::{check_len, ensure, Gpu, Result};
use crate::GemmPrecision;

/// [`super::linear_forward_shared`] for each of `layers` (weight, bias), all
/// reading `x [m, k]` and its low-precision copy in `xo`: grouped launches where
/// every layer would take the split-K path, else one call each. Returns the
/// outputs `[m, n_i]` in order.
pub fn linear_forward_group<'a>(
    gpu: &Gpu,
    x: impl Into<XIn<'a>>,
    xo: &mut XOperand,
    m: usize,
    layers: &[(&GpuWeight, Option<&CudaSlice<f32>>)],
    prec: GemmPrecision,
) -> Result<Vec<CudaSlice<f32>>> {
    let x = x.into();
    match grouped(gpu, x, xo, m, layers, prec)? {
        Some(ys) => Ok(ys),
        None => layers
            .iter()
            .map(|&(w, b)| forward(gpu, x, xo, m, w, b, prec, None))
            .collect(),
    }
}

/// [`linear_forward_group`] with each output an [`Act`]: where a layer's rows
/// GEMM or split-K epilogue writes it, the BF16 values themselves (half the bytes;
/// gate and up of a training forward or a long prefill, a GRPO micro-batch's k and
/// v), else f32 (the grouped split-K launches). The same numbers either way.
pub fn linear_forward_group_act<'a>(
    gpu: &Gpu,
    x: impl Into<XIn<'a>>,
    xo: &mut XOperand,
    m: usize,
    layers: &[(&GpuWeight, Option<&CudaSlice<f32>>)],
    prec: GemmPrecision,
) -> Result<Vec<Act>> {
    let x = x.into();
    match grouped(gpu, x, xo, m, layers, prec)? {
        Some(ys) => Ok(ys.into_iter().map(Act::F32).collect()),
        None => layers
            .iter()
            .map(|&(w, b)| forward_act(gpu, x, xo, m, w, b, prec))
            .collect(),
    }
}

/// The grouped split-K launches of [`linear_forward_group`], where they apply.
fn grouped(
    gpu: &Gpu,
    x: XIn,
    xo: &mut XOperand,
    m: usize,
    layers: &[(&GpuWeight, Option<&CudaSlice<f32>>)],
    prec: GemmPrecision,
) -> Result<Option<Vec<CudaSlice<f32>>>> {
    for &(w, b) in layers {
        if let Some(b) = b {
            check_len("linear bias", b, w.n, format!("[{}]", w.n))?;
        }
    }
    let ws: Vec<_> = layers.iter().map(|&(w, _)| w).collect();
    match group_partials(gpu, x, xo, m, &ws, prec)? {
        Some(parts) => {
            let biases: Vec<_> = layers.iter().map(|&(_, b)| b).collect();
            epilogue_group(gpu, &parts, &biases, m, prec).map(Some)
        }
        None => Ok(None),
    }
}

/// The split-K partial sums of `x [m, k]` through each of `ws` in one grouped
/// launch, where each would take the split-K path of its own [`forward`] call
/// (the same blocks, so the same bits); `None` where not.
pub(super) fn group_partials(
    gpu: &Gpu,
    x: XIn,
    xo: &mut XOperand,
    m: usize,
    ws: &[&GpuWeight],
    prec: GemmPrecision,
) -> Result<Option<Vec<Partial>>> {
    let k = ws.first().map_or(0, |w| w.k);
    let grouped = gpu.wgmma()
        && m > 0
        && (2..=3).contains(&ws.len())
        && matches!(prec, GemmPrecision::Bf16 | GemmPrecision::Fp8)
        && ws.iter().all(|w| {
            w.k == k
                && w.batch_invariant
                && (m <= GEMV_MAX_TOKENS || split_k_pays(gpu, m, w.n))
                && match prec {
                    GemmPrecision::Bf16 => w.bf16_view().is_some(),
                    _ => w.fp8.is_some(),
                }
        });
    if !grouped {
        return Ok(None);
    }
    x.check(m, k)?;
    let xo = xo.of(m, k)?;
    let parts = match prec {
        GemmPrecision::Bf16 => {
            let xr = x_rows(xo.bf16(gpu, x, m, k)?.into(), m, k);
            let ws = ws
                .iter()
                .map(|w| {
                    Ok(w_rows(
                        w.bf16_view().ok_or_else(|| w.missing(prec))?,
                        w.n,
                        k,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            gemv_bf16_partial_group(gpu, xr, &ws)?
        }
        _ => {
            let qx = xo.fp8(gpu, x, m, k)?;
            let ws = ws
                .iter()
                .map(|w| w.fp8.as_ref().ok_or_else(|| w.missing(prec)))
                .collect::<Result<Vec<_>>>()?;
            gemv_fp8_partial_group(gpu, qx, &ws)?
        }
    };
    Ok(Some(parts))
}

/// Bytes of one `EpiProb` (`ops.cu`); `EpiGroup` holds three, then rows, round,
/// count.
const EPI_PROB_BYTES: usize = 64;

/// `linear_epilogue` of each partial (its slices added in order, + bias, the BF16
/// rounding) in one launch of `linear_epilogue_group`: `[m, n_i]` each.
fn epilogue_group(
    gpu: &Gpu,
    parts: &[Partial],
    biases: &[Option<&CudaSlice<f32>>],
    m: usize,
    prec: GemmPrecision,
) -> Result<Vec<CudaSlice<f32>>> {
    ensure((1..=3).contains(&parts.len()), || {
        format!("a grouped epilogue of {} outputs", parts.len())
    })?;
    let (mut g, mut ys, mut blocks) = (CStruct::default(), vec![], 0);
    for (p, b) in parts.iter().zip(biases) {
        let n = m * p.ldp;
        let y = gpu.uninit::<f32>(n)?;
        let nb = n.div_ceil(1024);
        g.u64(gpu.ptr(&p.p)).u64(b.map_or(0, |b| gpu.ptr(b))).u64(0);
        g.u64(gpu.ptr(&y)).i64(p.ldp as i64).i64(p.sstride as i64);
        g.i32(p.splits as i32)
            .i32(p.ldp as i32)
            .i32(nb as i32)
            .i32(0);
        blocks += nb;
        ys.push(y);
    }
    g.pad_to(3 * EPI_PROB_BYTES);
    g.i32(m as i32).i32((prec != GemmPrecision::F32) as i32);
    g.i32(parts.len() as i32).i32(0);
    gpu.launch(
        &OPS,
        "linear_epilogue_group",
        (blocks as u32, 1, 1),
        (256, 1, 1),
        0,
        &[g.arg()?],
    )?;
    Ok(ys)
}
