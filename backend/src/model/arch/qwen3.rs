//! Qwen3 (`Qwen3ForCausalLM`, model_type "qwen3"), with HF `Qwen3Config`
//! defaults. Per-head RMSNorm on q and k; `head_dim` is explicit (default 128)
//! and need not equal hidden_size / num_attention_heads.

use serde_json::{json, Map, Value};

use super::super::config::{Arch, ModelConfig};
use super::super::error::ModelError;
use super::super::json::Fields;

pub(super) fn parse(f: &Fields) -> Result<ModelConfig, ModelError> {
    super::check_common_unsupported(f)?;
    let s = super::sizes(f)?;
    super::check_no_sliding_window(f, s.num_hidden_layers)?;
    let head_dim = f.usize_or("head_dim", 128)?;
    // Qwen3Config: a missing key means 32, an explicit null means num_attention_heads.
    let num_key_value_heads = super::kv_heads(f, s.num_attention_heads, 32)?;
    if f.bool_or("attention_bias", false)? {
        return Err(f.unsupported(
            "attention_bias",
            &Value::Bool(true),
            "Qwen3 attention_bias also puts a bias on o_proj, which is not supported",
        ));
    }
    let (rope_theta, rope_scaling) = super::rope(f, 10000.0)?;
    Ok(ModelConfig {
        arch: Arch::Qwen3,
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
        attention_bias: false,
        qk_norm: true,
        bos_token_id: super::bos(f, None)?,
        eos_token_ids: super::eos(f, &[])?,
    })
}

pub(super) fn extra_json(cfg: &ModelConfig, m: &mut Map<String, Value>) {
    m.insert("attention_bias".into(), json!(false));
    m.insert("use_sliding_window".into(), json!(false));
    m.insert("sliding_window".into(), Value::Null);
    m.insert("max_window_layers".into(), json!(cfg.num_hidden_layers));
}
