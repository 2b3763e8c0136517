//! Llama (`LlamaForCausalLM`, model_type "llama"), with HF `LlamaConfig` defaults.

use serde_json::{json, Map, Value};

use super::super::config::{Arch, ModelConfig};
use super::super::error::ModelError;
use super::super::json::Fields;

pub(super) fn parse(f: &Fields) -> Result<ModelConfig, ModelError> {
    super::check_common_unsupported(f)?;
    let s = super::sizes(f)?;
    let head_dim = super::head_dim_or_derived(f, &s)?;
    let num_key_value_heads = super::kv_heads(f, s.num_attention_heads, s.num_attention_heads)?;
    if f.bool_or("mlp_bias", false)? {
        return Err(f.unsupported(
            "mlp_bias",
            &Value::Bool(true),
            "MLP biases are not supported",
        ));
    }
    if f.bool_or("attention_bias", false)? {
        return Err(f.unsupported(
            "attention_bias",
            &Value::Bool(true),
            "Llama attention_bias also puts a bias on o_proj, which is not supported",
        ));
    }
    let (rope_theta, rope_scaling) = super::rope(f, 10000.0)?;
    Ok(ModelConfig {
        arch: Arch::Llama,
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
        max_position_embeddings: f.usize_or("max_position_embeddings", 2048)?,
        tie_word_embeddings: f.bool_or("tie_word_embeddings", false)?,
        attention_bias: false,
        qk_norm: false,
        bos_token_id: super::bos(f, Some(1))?,
        eos_token_ids: super::eos(f, &[2])?,
    })
}

pub(super) fn extra_json(_cfg: &ModelConfig, m: &mut Map<String, Value>) {
    m.insert("attention_bias".into(), json!(false));
    m.insert("mlp_bias".into(), json!(false));
    m.insert("pretraining_tp".into(), json!(1));
}
