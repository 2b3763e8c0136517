//! Qwen2 (`Qwen2ForCausalLM`, model_type "qwen2"), with HF `Qwen2Config`
//! defaults. q/k/v projections always have a bias; o_proj never does.

use serde_json::{json, Map, Value};

use super::super::config::{Arch, ModelConfig};
use super::super::error::ModelError;
use super::super::json::Fields;

pub(super) fn parse(f: &Fields) -> Result<ModelConfig, ModelError> {
    super::check_common_unsupported(f)?;
    let s = super::sizes(f)?;
    super::check_no_sliding_window(f, s.num_hidden_layers)?;
    // HF's Qwen2Attention reads `head_dim` when present.
    let head_dim = super::head_dim_or_derived(f, &s)?;
    // Qwen2Config: a missing key means 32, an explicit null means num_attention_heads.
    let num_key_value_heads = super::kv_heads(f, s.num_attention_heads, 32)?;
    let (rope_theta, rope_scaling) = super::rope(f, 10000.0)?;
    Ok(ModelConfig {
        arch: Arch::Qwen2,
        vocab_size: s.vocab_size,
        hidden_size: s.hidden_size,
        intermediate_size: s.intermediate_size,
        num_hidden_layers: s.num_hidden_layers,
        num_attention_heads: s.num_attention_heads,
        num_key_value_heads,
        head_dim,
        rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
        rope_theta,
        rope_scaling,
        max_position_embeddings: f.usize_or("max_position_embeddings", 32768)?,
        tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
        attention_bias: true,
        qk_norm: false,
        bos_token_id: super::bos(f, None)?,
        eos_token_ids: super::eos(f, &[])?,
    })
}

pub(super) fn extra_json(cfg: &ModelConfig, m: &mut Map<String, Value>) {
    m.insert("use_sliding_window".into(), json!(false));
    m.insert("sliding_window".into(), Value::Null);
    m.insert("max_window_layers".into(), json!(cfg.num_hidden_layers));
}
