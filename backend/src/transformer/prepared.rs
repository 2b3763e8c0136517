//! A model's weights prepared for one step in one precision flow: every linear
//! weight in the copies its GEMM roles read (in the `fp8` flow the 128x128-block
//! quantization, done once and read by rollout, training forward and DGrad).

use jet_kernels::ops::attention::AttnShape;
use jet_kernels::ops::linear::PreparedWeight;
use jet_kernels::ops::rope::{Llama3Scaling, RopeTable};
use jet_kernels::Flow;

use crate::model::{ModelConfig, ModelWeights};

pub struct PreparedLayer {
    pub q: PreparedWeight<f32>,
    pub k: PreparedWeight<f32>,
    pub v: PreparedWeight<f32>,
    pub o: PreparedWeight<f32>,
    pub gate: PreparedWeight<f32>,
    pub up: PreparedWeight<f32>,
    pub down: PreparedWeight<f32>,
}

pub struct PreparedModel<'w> {
    pub cfg: &'w ModelConfig,
    pub w: &'w ModelWeights,
    pub flow: Flow,
    pub layers: Vec<PreparedLayer>,
    /// `[vocab, hidden]`: lm_head, or the embedding table when tied.
    pub lm_head: PreparedWeight<f32>,
    pub rope: RopeTable,
}

/// The RoPE table of `cfg` (the GPU path copies this one, so both rotate alike).
pub fn rope_table(cfg: &ModelConfig) -> RopeTable {
    let scaling = cfg.rope_scaling.map(|s| Llama3Scaling {
        factor: s.factor,
        low_freq_factor: s.low_freq_factor,
        high_freq_factor: s.high_freq_factor,
        original_max_position_embeddings: s.original_max_position_embeddings,
    });
    RopeTable::new(
        cfg.head_dim,
        cfg.max_position_embeddings,
        cfg.rope_theta,
        scaling,
    )
}

impl<'w> PreparedModel<'w> {
    pub fn new(cfg: &'w ModelConfig, w: &'w ModelWeights, flow: Flow) -> Self {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let (qd, kvd) = (
            cfg.num_attention_heads * cfg.head_dim,
            cfg.num_key_value_heads * cfg.head_dim,
        );
        let prep = |x: &[f32], n, k| PreparedWeight::prepare(x, n, k, flow);
        let layers = w
            .layers
            .iter()
            .map(|l| PreparedLayer {
                q: prep(&l.q_proj, qd, h),
                k: prep(&l.k_proj, kvd, h),
                v: prep(&l.v_proj, kvd, h),
                o: prep(&l.o_proj, h, qd),
                gate: prep(&l.gate_proj, i, h),
                up: prep(&l.up_proj, i, h),
                down: prep(&l.down_proj, h, i),
            })
            .collect();
        let head = w.lm_head.as_deref().unwrap_or(&w.embed_tokens);
        PreparedModel {
            cfg,
            w,
            flow,
            layers,
            lm_head: prep(head, cfg.vocab_size, h),
            rope: rope_table(cfg),
        }
    }

    pub fn attn_shape(&self) -> AttnShape {
        AttnShape {
            n_heads: self.cfg.num_attention_heads,
            n_kv_heads: self.cfg.num_key_value_heads,
            head_dim: self.cfg.head_dim,
        }
    }
}
