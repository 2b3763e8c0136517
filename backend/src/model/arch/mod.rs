//! Per-architecture parsing of HF `config.json` (one file each) and the
//! pieces they share.

mod llama;
mod qwen2;
mod qwen3;

use std::path::Path;

use serde_json::{json, Map, Value};

use super::config::{Arch, ModelConfig, RopeScaling};
use super::error::ModelError;
use super::json::Fields;

/// Finds the architecture from `architectures[0]` and/or `model_type`, then
/// parses the rest with that architecture's fields and defaults.
pub(crate) fn parse(f: &Fields) -> Result<ModelConfig, ModelError> {
    match detect(f)? {
        Arch::Llama => llama::parse(f),
        Arch::Qwen2 => qwen2::parse(f),
        Arch::Qwen3 => qwen3::parse(f),
    }
}

pub(crate) fn to_hf_json(cfg: &ModelConfig) -> Value {
    let mut m = common_json(cfg);
    match cfg.arch {
        Arch::Llama => llama::extra_json(cfg, &mut m),
        Arch::Qwen2 => qwen2::extra_json(cfg, &mut m),
        Arch::Qwen3 => qwen3::extra_json(cfg, &mut m),
    }
    Value::Object(m)
}

/// The flags each architecture fixes (biases, q/k norm).
pub(crate) fn validate_flags(cfg: &ModelConfig, path: &Path) -> Result<(), ModelError> {
    let (bias, qk_norm) = match cfg.arch {
        Arch::Llama => (false, false),
        Arch::Qwen2 => (true, false),
        Arch::Qwen3 => (false, true),
    };
    let bad = |field: &str, value: bool, want: bool| ModelError::UnsupportedField {
        path: path.to_path_buf(),
        field: field.into(),
        value: value.to_string(),
        reason: format!(
            "a {} model in Jet has {field} = {want}",
            cfg.arch.hf_class()
        ),
    };
    if cfg.attention_bias != bias {
        return Err(bad("attention_bias", cfg.attention_bias, bias));
    }
    if cfg.qk_norm != qk_norm {
        return Err(bad("qk_norm", cfg.qk_norm, qk_norm));
    }
    Ok(())
}

fn detect(f: &Fields) -> Result<Arch, ModelError> {
    let from_class = match f.get("architectures") {
        None => None,
        Some(Value::Array(items)) => match items.first() {
            Some(Value::String(name)) => Some(match name.as_str() {
                "LlamaForCausalLM" => Arch::Llama,
                "Qwen2ForCausalLM" => Arch::Qwen2,
                "Qwen3ForCausalLM" => Arch::Qwen3,
                other => {
                    return Err(ModelError::UnsupportedArch {
                        path: f.path_buf(),
                        arch: format!("`{other}` (field `architectures`)"),
                    })
                }
            }),
            None => None,
            Some(v) => return Err(f.wrong_type("architectures", "a list of class names", v)),
        },
        Some(v) => return Err(f.wrong_type("architectures", "a list of class names", v)),
    };
    let from_type = match f.opt_str("model_type")? {
        None => None,
        Some("llama") => Some(Arch::Llama),
        Some("qwen2") => Some(Arch::Qwen2),
        Some("qwen3") => Some(Arch::Qwen3),
        Some(other) => {
            return Err(ModelError::UnsupportedArch {
                path: f.path_buf(),
                arch: format!("`{other}` (field `model_type`)"),
            })
        }
    };
    match (from_class, from_type) {
        (Some(a), Some(b)) if a != b => Err(f.invalid(
            "model_type",
            format!(
                "`{}` disagrees with architectures[0] `{}`",
                b.model_type(),
                a.hf_class()
            ),
        )),
        (Some(a), _) | (None, Some(a)) => Ok(a),
        (None, None) => Err(f.missing("architectures")),
    }
}

/// The sizes every architecture requires (no HF default is trusted for them:
/// a config without them is broken, and a silent default would only surface
/// later as a confusing shape mismatch).
pub(super) struct Sizes {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
}

pub(super) fn sizes(f: &Fields) -> Result<Sizes, ModelError> {
    Ok(Sizes {
        vocab_size: f.req_usize("vocab_size")?,
        hidden_size: f.req_usize("hidden_size")?,
        intermediate_size: f.req_usize("intermediate_size")?,
        num_hidden_layers: f.req_usize("num_hidden_layers")?,
        num_attention_heads: f.req_usize("num_attention_heads")?,
    })
}

/// `head_dim` if given, else hidden_size / num_attention_heads (which must divide).
pub(super) fn head_dim_or_derived(f: &Fields, s: &Sizes) -> Result<usize, ModelError> {
    if let Some(hd) = f.opt_usize("head_dim")? {
        return Ok(hd);
    }
    if s.num_attention_heads == 0 || !s.hidden_size.is_multiple_of(s.num_attention_heads) {
        return Err(f.invalid(
            "hidden_size",
            format!(
                "{} is not a multiple of num_attention_heads {} (and no head_dim is given)",
                s.hidden_size, s.num_attention_heads
            ),
        ));
    }
    Ok(s.hidden_size / s.num_attention_heads)
}

/// `num_key_value_heads`: `absent` when the key is missing, num_attention_heads when null.
pub(super) fn kv_heads(f: &Fields, heads: usize, absent: usize) -> Result<usize, ModelError> {
    if !f.obj.contains_key("num_key_value_heads") {
        return Ok(absent);
    }
    Ok(f.opt_usize("num_key_value_heads")?.unwrap_or(heads))
}

/// A token id field with an HF default used only when the key is absent
/// (an explicit null means "none").
pub(super) fn bos(f: &Fields, default: Option<u32>) -> Result<Option<u32>, ModelError> {
    if f.obj.contains_key("bos_token_id") {
        f.opt_token_id("bos_token_id")
    } else {
        Ok(default)
    }
}

pub(super) fn eos(f: &Fields, default: &[u32]) -> Result<Vec<u32>, ModelError> {
    if f.obj.contains_key("eos_token_id") {
        f.token_ids("eos_token_id")
    } else {
        Ok(default.to_vec())
    }
}

/// Rejects what Jet does not implement whatever the architecture: activations
/// other than SiLU and quantized checkpoints.
pub(super) fn check_common_unsupported(f: &Fields) -> Result<(), ModelError> {
    if let Some(act) = f.opt_str("hidden_act")? {
        if act != "silu" {
            return Err(f.unsupported(
                "hidden_act",
                &Value::String(act.into()),
                "only \"silu\" is supported",
            ));
        }
    }
    if let Some(q) = f.get("quantization_config") {
        return Err(f.unsupported(
            "quantization_config",
            q,
            "quantized checkpoints are not supported",
        ));
    }
    Ok(())
}

/// Rejects sliding-window attention (Qwen2/Qwen3), following HF's rule:
/// with `use_sliding_window`, layers from `max_window_layers` on use it; an
/// explicit `layer_types` list overrides that.
pub(super) fn check_no_sliding_window(f: &Fields, num_layers: usize) -> Result<(), ModelError> {
    if let Some(types) = f.get("layer_types") {
        let Value::Array(items) = types else {
            return Err(f.wrong_type("layer_types", "a list of strings", types));
        };
        for item in items {
            match item.as_str() {
                Some("full_attention") => {}
                Some(_) => {
                    return Err(f.unsupported(
                        "layer_types",
                        item,
                        "only full_attention layers are supported",
                    ))
                }
                None => return Err(f.wrong_type("layer_types", "a list of strings", types)),
            }
        }
        return Ok(());
    }
    if f.bool_or("use_sliding_window", false)? {
        let max_window_layers = f.usize_or("max_window_layers", 28)?;
        if max_window_layers < num_layers {
            return Err(f.unsupported(
                "use_sliding_window",
                &Value::Bool(true),
                "sliding-window attention is not supported",
            ));
        }
    }
    Ok(())
}

/// Reads `rope_theta` and the rope scaling, in either the transformers v4
/// layout (`rope_theta` + `rope_scaling`) or the v5 one (`rope_parameters`).
pub(super) fn rope(
    f: &Fields,
    default_theta: f64,
) -> Result<(f64, Option<RopeScaling>), ModelError> {
    if let Some(params) = f.opt_object("rope_parameters")? {
        let theta = match params.opt_f64("rope_theta")? {
            Some(t) => t,
            None => f.f64_or("rope_theta", default_theta)?,
        };
        return Ok((theta, rope_scaling(&params)?));
    }
    let theta = f.f64_or("rope_theta", default_theta)?;
    let scaling = match f.opt_object("rope_scaling")? {
        None => None,
        Some(s) => rope_scaling(&s)?,
    };
    Ok((theta, scaling))
}

fn rope_scaling(s: &Fields) -> Result<Option<RopeScaling>, ModelError> {
    let key = if s.obj.contains_key("rope_type") {
        "rope_type"
    } else {
        "type"
    };
    let kind = s.opt_str(key)?.ok_or_else(|| s.missing("rope_type"))?;
    match kind {
        "default" => Ok(None),
        "llama3" => Ok(Some(RopeScaling {
            factor: s.req_f64("factor")?,
            low_freq_factor: s.req_f64("low_freq_factor")?,
            high_freq_factor: s.req_f64("high_freq_factor")?,
            original_max_position_embeddings: s.req_usize("original_max_position_embeddings")?,
        })),
        other => Err(s.unsupported(
            key,
            &Value::String(other.into()),
            "only \"default\" and \"llama3\" RoPE are supported",
        )),
    }
}

fn token_ids_json(ids: &[u32]) -> Value {
    match ids {
        [] => Value::Null,
        [one] => json!(one),
        many => json!(many),
    }
}

/// The fields all three architectures write.
fn common_json(cfg: &ModelConfig) -> Map<String, Value> {
    let rope_scaling = match &cfg.rope_scaling {
        None => Value::Null,
        Some(rs) => json!({
            "rope_type": "llama3",
            "factor": rs.factor,
            "low_freq_factor": rs.low_freq_factor,
            "high_freq_factor": rs.high_freq_factor,
            "original_max_position_embeddings": rs.original_max_position_embeddings,
        }),
    };
    let v = json!({
        "architectures": [cfg.arch.hf_class()],
        "model_type": cfg.arch.model_type(),
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": 0.02,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_dropout": 0.0,
        "use_cache": true,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": token_ids_json(&cfg.eos_token_ids),
        "torch_dtype": "float32",
    });
    match v {
        Value::Object(m) => m,
        _ => unreachable!("json! of an object literal is an object"),
    }
}
