//! GEMMs and quantizers at a model's shapes, timed with device events.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, DevicePtr};
use jet_kernels::cuda::gemm::{dense_gemm, fp8_gemm_nt_into, Dense, LtType};
use jet_kernels::cuda::quantize::{
    fill_random, quantize_block128, quantize_col128x1, quantize_row1x128, to_bf16_padded,
};
use jet_kernels::cuda::{Gpu, Result};
use serde::Serialize;

use crate::model::ModelConfig;

/// Rows of the training-sized GEMMs (the M).
const M: usize = 8192;

#[derive(Serialize)]
pub struct GemmRow {
    pub name: String,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub bf16_us: f64,
    pub fp8_us: f64,
    pub bf16_tflops: f64,
    pub fp8_tflops: f64,
    pub speedup: f64,
}

#[derive(Serialize)]
pub struct QuantRow {
    pub name: String,
    pub shape: String,
    pub us: f64,
    pub gb_per_s: f64,
    /// Fraction of the device-to-device copy bandwidth.
    pub of_copy: f64,
}

/// Mean device time of one call of `f` in microseconds over `reps` calls
/// queued back to back after three warm-up calls.
pub(crate) fn time_us(g: &Gpu, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    g.sync()?;
    let ev = || {
        g.context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| jet_kernels::cuda::CudaError::Driver {
                what: "creating an event".into(),
                err: e.to_string(),
            })
    };
    let (a, b) = (ev()?, ev()?);
    let drv = |e: cudarc::driver::DriverError| jet_kernels::cuda::CudaError::Driver {
        what: "timing with events".into(),
        err: e.to_string(),
    };
    a.record(g.stream()).map_err(drv)?;
    for _ in 0..reps {
        f()?;
    }
    b.record(g.stream()).map_err(drv)?;
    b.synchronize().map_err(drv)?;
    Ok(a.elapsed_ms(&b).map_err(drv)? as f64 * 1e3 / reps as f64)
}

pub(crate) fn rand_dev(g: &Gpu, n: usize, seed: u32, amp: f32) -> Result<CudaSlice<f32>> {
    let mut x = g.zeros::<f32>(n)?;
    fill_random(g, &mut x, seed, amp)?;
    Ok(x)
}

fn dense(g: &Gpu, s: &CudaSlice<u16>, rows: usize, cols: usize) -> Dense {
    Dense {
        ptr: s.device_ptr(g.stream()).0,
        ty: LtType::Bf16,
        rows,
        cols,
        ld: cols,
    }
}

/// The distinct projections of `cfg`: (name, N, K).
fn shapes(cfg: &ModelConfig) -> Vec<(&'static str, usize, usize)> {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let qd = cfg.num_attention_heads * cfg.head_dim;
    let kvd = cfg.num_key_value_heads * cfg.head_dim;
    vec![
        ("q_proj", qd, h),
        ("k_proj / v_proj", kvd, h),
        ("o_proj", h, qd),
        ("gate / up_proj", i, h),
        ("down_proj", h, i),
        ("lm_head", cfg.vocab_size, h),
    ]
}

/// BF16 (cuBLASLt) against FP8 1x128 x 128x128 block-scaled (cuBLASLt) at M = 8192.
pub fn gemms(g: &Gpu, cfg: &ModelConfig) -> Result<Vec<GemmRow>> {
    let mut out = Vec::new();
    for (name, n, k) in shapes(cfg) {
        let flops = 2.0 * (M * k * n) as f64;
        let (xa, wa) = (rand_dev(g, M * k, 2, 2.0)?, rand_dev(g, n * k, 3, 0.05)?);
        let (xb, wb) = (
            to_bf16_padded(g, &xa, M, k, M, k)?,
            to_bf16_padded(g, &wa, n, k, n, k)?,
        );
        let d = g.zeros::<f32>(M * n)?;
        let dp = d.device_ptr(g.stream()).0;
        let bf16_us = time_us(g, 10, || {
            dense_gemm(
                g,
                dense(g, &xb, M, k),
                false,
                dense(g, &wb, n, k),
                true,
                dp,
                n,
            )
        })?;
        drop((xb, wb, d));
        let qx = quantize_row1x128(g, &xa, M, k)?;
        let (qw, _) = quantize_block128(g, &wa, n, k, false)?;
        let mut d8 = g.zeros::<f32>(qx.outer_pad() * qw.outer_pad())?;
        let fp8_us = time_us(g, 10, || fp8_gemm_nt_into(g, &qx, &qw, &mut d8))?;
        out.push(GemmRow {
            name: name.into(),
            m: M,
            k,
            n,
            bf16_us,
            fp8_us,
            bf16_tflops: flops / bf16_us / 1e6,
            fp8_tflops: flops / fp8_us / 1e6,
            speedup: bf16_us / fp8_us,
        });
    }
    Ok(out)
}

/// The three quantizers against a device copy of the same f32 tensor.
pub fn quantizers(g: &Gpu, cfg: &ModelConfig) -> Result<Vec<QuantRow>> {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let x = rand_dev(g, M * h, 1, 3.0)?;
    let mut y = g.zeros::<f32>(M * h)?;
    let copy_us = time_us(g, 20, || {
        g.stream()
            .memcpy_dtod(&x, &mut y)
            .map_err(|e| jet_kernels::cuda::CudaError::Driver {
                what: "copy".into(),
                err: e.to_string(),
            })
    })?;
    let copy_gbs = 2.0 * (M * h * 4) as f64 / copy_us / 1e3;
    let mut out = vec![QuantRow {
        name: "copy f32 (read + write)".into(),
        shape: format!("[{M}, {h}]"),
        us: copy_us,
        gb_per_s: copy_gbs,
        of_copy: 1.0,
    }];
    // Bytes moved: f32 in, E4M3 out, f32 scales out.
    let act_bytes = (M * h * 5 + M * h.div_ceil(128) * 4) as f64;
    let t = time_us(g, 20, || quantize_row1x128(g, &x, M, h).map(drop))?;
    out.push(QuantRow {
        name: "activations 1x128".into(),
        shape: format!("[{M}, {h}]"),
        us: t,
        gb_per_s: act_bytes / t / 1e3,
        of_copy: act_bytes / t / 1e3 / copy_gbs,
    });
    let t = time_us(g, 20, || quantize_col128x1(g, &x, M, h).map(drop))?;
    out.push(QuantRow {
        name: "gradients 128x1 (WGrad)".into(),
        shape: format!("[{M}, {h}]"),
        us: t,
        gb_per_s: act_bytes / t / 1e3,
        of_copy: act_bytes / t / 1e3 / copy_gbs,
    });
    drop((x, y));
    let w = rand_dev(g, i * h, 4, 0.05)?;
    // Reads W (f32), writes W and W^T in E4M3.
    let wb = (i * h * 6) as f64;
    let t = time_us(g, 20, || quantize_block128(g, &w, i, h, true).map(drop))?;
    out.push(QuantRow {
        name: "weights 128x128 (+W^T)".into(),
        shape: format!("[{i}, {h}]"),
        us: t,
        gb_per_s: wb / t / 1e3,
        of_copy: wb / t / 1e3 / copy_gbs,
    });
    Ok(out)
}
