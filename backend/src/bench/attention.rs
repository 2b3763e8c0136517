//! Attention of one layer, timed with device events: the exact per-row kernels
//! (the f32 flow) and the tensor-core kernels (every other flow) at the training
//! shape, the tensor-core kernels at the published FlashAttention shapes
//! (B x heads x L = 8 x 16 x 512 and 4 x 16 x 2048 for a 16-head model), and
//! decode against a cache.

use jet_kernels::cuda::attention::{attention_backward, attention_decode, attention_forward};
use jet_kernels::cuda::flash::{
    flash_backward, flash_backward_with, flash_decode_at, flash_forward, flash_forward_with,
    flash_scatter_rows, flash_supported, BwdKernel, Dout, FlashPlan, FwdKernel,
};
use jet_kernels::cuda::{Gpu, Result};
use jet_kernels::ops::attention::AttnShape;
use serde::Serialize;

use super::kernels::{rand_dev, time_us};
use crate::model::ModelConfig;

#[derive(Serialize)]
pub struct OpRow {
    pub name: String,
    pub shape: String,
    /// Device time of one call (one layer).
    pub us: f64,
    /// Causal attention FLOPs over the time (training shapes): 4 B H L^2 d / 2
    /// forward, 2.5x that backward (the FlashAttention papers' count).
    pub tflops: Option<f64>,
    /// Bytes of the KV cache read over the time (decode).
    pub gb_per_s: Option<f64>,
}

fn causal_flops(shape: AttnShape, seqs: usize, len: usize) -> f64 {
    2.0 * (seqs * shape.n_heads * len * len * shape.head_dim) as f64
}

/// Forward and backward of the tensor-core kernels over `seqs` x `len` tokens.
fn flash_rows(g: &Gpu, shape: AttnShape, seqs: usize, len: usize) -> Result<Vec<OpRow>> {
    let (qd, kvd) = (
        shape.n_heads * shape.head_dim,
        shape.n_kv_heads * shape.head_dim,
    );
    let rows = seqs * len;
    let (q, k, v, dout) = (
        rand_dev(g, rows * qd, 15, 1.0)?,
        rand_dev(g, rows * kvd, 16, 1.0)?,
        rand_dev(g, rows * kvd, 17, 1.0)?,
        rand_dev(g, rows * qd, 18, 1.0)?,
    );
    let plan = FlashPlan::new(g, &vec![len; seqs])?;
    let fwd = time_us(g, 20, || {
        flash_forward(g, &plan, &q, &k, &v, shape).map(drop)
    })?;
    let fwd3 = time_us(g, 20, || {
        flash_forward_with(g, &plan, &q, &k, &v, shape, FwdKernel::Occupancy3).map(drop)
    })?;
    let (o, saved) = flash_forward(g, &plan, &q, &k, &v, shape)?;
    let bwd = time_us(g, 20, || {
        flash_backward(g, &plan, Dout::F32(&dout), &o, &saved, shape, false).map(drop)
    })?;
    let f = causal_flops(shape, seqs, len);
    let desc = format!("{seqs} x {} x {len}, d {}", shape.n_heads, shape.head_dim);
    // Where the backward runs on wgmma, its mma.sync build in the same run.
    let mut other = None;
    if BwdKernel::default_for(g) == BwdKernel::Wgmma {
        let mma = BwdKernel::MmaSync;
        let us = time_us(g, 20, || {
            flash_backward_with(g, &plan, &dout, &o, &saved, shape, mma).map(drop)
        })?;
        other = Some(OpRow {
            name: "  the same, mma.sync".into(),
            shape: desc.clone(),
            us,
            tflops: Some(2.5 * f / us / 1e6),
            gb_per_s: None,
        });
    }
    let name = match BwdKernel::default_for(g) {
        BwdKernel::Wgmma => "attention bwd (wgmma)",
        BwdKernel::MmaSync => "attention bwd (tensor cores)",
    };
    let mut rows = vec![
        OpRow {
            name: "attention fwd (tensor cores)".into(),
            shape: desc.clone(),
            us: fwd,
            tflops: Some(f / fwd / 1e6),
            gb_per_s: None,
        },
        OpRow {
            name: "  the same, 3 CTAs an SM".into(),
            shape: desc.clone(),
            us: fwd3,
            tflops: Some(f / fwd3 / 1e6),
            gb_per_s: None,
        },
        OpRow {
            name: name.into(),
            shape: desc,
            us: bwd,
            tflops: Some(2.5 * f / bwd / 1e6),
            gb_per_s: None,
        },
    ];
    rows.extend(other);
    Ok(rows)
}

/// Every attention row of the report for `cfg`: training shape `seqs` x `len`,
/// decode at `batch` rows with `ctx` cached positions.
pub fn attention(
    g: &Gpu,
    cfg: &ModelConfig,
    seqs: usize,
    len: usize,
    batch: usize,
    ctx: usize,
) -> Result<Vec<OpRow>> {
    let shape = AttnShape {
        n_heads: cfg.num_attention_heads,
        n_kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
    };
    let (qd, kvd) = (
        shape.n_heads * shape.head_dim,
        shape.n_kv_heads * shape.head_dim,
    );
    let mut out = Vec::new();
    let f = causal_flops(shape, seqs, len);
    let tshape = format!("{seqs} x {} x {len}, d {}", shape.n_heads, shape.head_dim);
    {
        let rows = seqs * len;
        let lens = vec![len; seqs];
        let (q, k, v) = (
            rand_dev(g, rows * qd, 5, 1.0)?,
            rand_dev(g, rows * kvd, 6, 1.0)?,
            rand_dev(g, rows * kvd, 7, 1.0)?,
        );
        let fwd = time_us(g, 3, || {
            attention_forward(g, &q, &k, &v, &lens, shape).map(drop)
        })?;
        let (o, p) = attention_forward(g, &q, &k, &v, &lens, shape)?;
        let bwd = time_us(g, 3, || {
            attention_backward(g, &o, &q, &k, &v, &p, &lens, shape).map(drop)
        })?;
        out.push(OpRow {
            name: "attention fwd (per row, f32)".into(),
            shape: tshape.clone(),
            us: fwd,
            tflops: Some(f / fwd / 1e6),
            gb_per_s: None,
        });
        out.push(OpRow {
            name: "attention bwd (per row, f32)".into(),
            shape: tshape,
            us: bwd,
            tflops: Some(2.5 * f / bwd / 1e6),
            gb_per_s: None,
        });
    }
    let flash = flash_supported(shape);
    if flash {
        out.extend(flash_rows(g, shape, seqs, len)?);
        for (s, l) in [(8, 512), (4, 2048)] {
            if (s, l) != (seqs, len) {
                out.extend(flash_rows(g, shape, s, l)?);
            }
        }
    }
    let qb = rand_dev(g, batch * qd, 8, 1.0)?;
    let (kc, vc) = (
        rand_dev(g, batch * ctx * kvd, 9, 1.0)?,
        rand_dev(g, batch * ctx * kvd, 10, 1.0)?,
    );
    let dlens = vec![ctx; batch];
    let slots: Vec<usize> = (0..batch).collect();
    let kv_bytes = (2 * batch * ctx * kvd * 4) as f64;
    let dshape = format!("batch {batch}, {ctx} cached");
    let dec = time_us(g, 10, || {
        attention_decode(g, &qb, &kc, &vc, ctx, &dlens, shape).map(drop)
    })?;
    out.push(OpRow {
        name: "attention decode (per row)".into(),
        shape: dshape.clone(),
        us: dec,
        tflops: None,
        gb_per_s: Some(kv_bytes / dec / 1e3),
    });
    if flash {
        // The BF16 cache: half the bytes.
        let (mut kc16, mut vc16) = (
            g.zeros::<u16>(batch * ctx * kvd)?,
            g.zeros::<u16>(batch * ctx * kvd)?,
        );
        let all: Vec<usize> = (0..batch * ctx).collect();
        flash_scatter_rows(g, &mut kc16, kvd, &all, &kc)?;
        flash_scatter_rows(g, &mut vc16, kvd, &all, &vc)?;
        let dec = time_us(g, 10, || {
            flash_decode_at(g, &qb, &kc16, &vc16, ctx, &slots, &dlens, shape).map(drop)
        })?;
        out.push(OpRow {
            name: "attention decode (tensor cores)".into(),
            shape: dshape,
            us: dec,
            tflops: None,
            gb_per_s: Some(kv_bytes / 2.0 / dec / 1e3),
        });
    }
    Ok(out)
}
