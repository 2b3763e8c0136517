//! A model's device weights prepared for one step in one precision flow: every
//! linear weight in the copies its GEMM roles read (in the `fp8` flow the
//! 128x128-block quantization, done once per step and read by rollout, the
//! training forward and DGrad alike), and the RoPE table.

use std::sync::Arc;

use jet_kernels::cuda::linear::GpuWeight;
use jet_kernels::cuda::ops::GpuRope;
use jet_kernels::cuda::{Gpu, Result};
use jet_kernels::ops::attention::AttnShape;
use jet_kernels::Flow;

use super::weights::GpuWeights;
use crate::model::ModelConfig;
use crate::transformer::rope_table;

/// One layer's seven projections.
pub struct GpuLayer {
    pub q: GpuWeight,
    pub k: GpuWeight,
    pub v: GpuWeight,
    pub o: GpuWeight,
    pub gate: GpuWeight,
    pub up: GpuWeight,
    pub down: GpuWeight,
}

pub struct GpuModel<'w> {
    pub gpu: Arc<Gpu>,
    pub cfg: &'w ModelConfig,
    pub w: &'w GpuWeights,
    pub flow: Flow,
    pub layers: Vec<GpuLayer>,
    /// `[vocab, hidden]`: lm_head, or the embedding table when tied.
    pub lm_head: GpuWeight,
    pub rope: GpuRope,
}

impl<'w> GpuModel<'w> {
    pub fn new(
        gpu: &Arc<Gpu>,
        cfg: &'w ModelConfig,
        w: &'w GpuWeights,
        flow: Flow,
    ) -> Result<GpuModel<'w>> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let (qd, kvd) = (
            cfg.num_attention_heads * cfg.head_dim,
            cfg.num_key_value_heads * cfg.head_dim,
        );
        let prep = |t: usize, n, k| GpuWeight::prepare(gpu, w.t(t), n, k, flow);
        let layers =
            w.ix.layers
                .iter()
                .map(|l| {
                    Ok(GpuLayer {
                        q: prep(l.q, qd, h)?,
                        k: prep(l.k, kvd, h)?,
                        v: prep(l.v, kvd, h)?,
                        o: prep(l.o, h, qd)?,
                        gate: prep(l.gate, i, h)?,
                        up: prep(l.up, i, h)?,
                        down: prep(l.down, h, i)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
        let lm_head = GpuWeight::prepare(gpu, w.lm_head(), cfg.vocab_size, h, flow)?;
        Ok(GpuModel {
            gpu: gpu.clone(),
            cfg,
            w,
            flow,
            layers,
            lm_head,
            rope: GpuRope::new(gpu, &rope_table(cfg))?,
        })
    }

    pub fn attn_shape(&self) -> AttnShape {
        AttnShape {
            n_heads: self.cfg.num_attention_heads,
            n_kv_heads: self.cfg.num_key_value_heads,
            head_dim: self.cfg.head_dim,
        }
    }
}
