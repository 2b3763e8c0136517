//! The model configuration: what Jet needs from an HF `config.json`, for the
//! architectures it supports (Llama, Qwen2, Qwen3).

use std::path::Path;

use serde_json::Value;

use super::arch;
use super::error::ModelError;
use super::json::{parse_json, read_json_file, Fields};
use super::weights::tensor_layout;

/// A supported architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
}

impl Arch {
    /// The HF `architectures[0]` class name.
    pub fn hf_class(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    /// The HF `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }
}

/// HF rope_type "llama3" frequency scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

/// The model hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// q/k/v projections have a bias (always for Qwen2; never for the others,
    /// since HF's `attention_bias` also puts a bias on o_proj, which Jet does
    /// not support).
    pub attention_bias: bool,
    /// Qwen3 per-head RMSNorm on q and k.
    pub qk_norm: bool,
    pub bos_token_id: Option<u32>,
    /// HF's `eos_token_id`, which may be an int or a list.
    pub eos_token_ids: Vec<u32>,
}

/// The name used in messages about a config that did not come from a file.
const IN_MEMORY: &str = "<in-memory config>";

impl ModelConfig {
    /// Reads and validates an HF `config.json`.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<ModelConfig, ModelError> {
        let path = path.as_ref();
        let value = read_json_file(path)?;
        Self::from_json_value(&value, path)
    }

    /// Parses and validates the text of an HF `config.json`.
    pub fn from_json_str(json: &str) -> Result<ModelConfig, ModelError> {
        let path = Path::new(IN_MEMORY);
        let value = parse_json(json.as_bytes(), path)?;
        Self::from_json_value(&value, path)
    }

    /// Parses and validates a config already read as JSON; `origin` names it in errors.
    pub fn from_json_value(value: &Value, origin: &Path) -> Result<ModelConfig, ModelError> {
        let fields = Fields::root(origin, value)?;
        let cfg = arch::parse(&fields)?;
        cfg.validate_at(origin)?;
        Ok(cfg)
    }

    /// An HF-loadable `config.json` for this config (weights saved as f32).
    pub fn to_hf_json(&self) -> Value {
        arch::to_hf_json(self)
    }

    /// Checks the invariants the forward pass relies on.
    pub fn validate(&self) -> Result<(), ModelError> {
        self.validate_at(Path::new(IN_MEMORY))
    }

    /// Number of parameters (lm_head counted only when untied).
    pub fn param_count(&self) -> usize {
        tensor_layout(self)
            .iter()
            .map(|t| t.numel())
            .fold(0usize, |a, n| a.saturating_add(n))
    }

    /// Like [`ModelConfig::validate`], naming `path` in errors.
    pub(crate) fn validate_at(&self, path: &Path) -> Result<(), ModelError> {
        let invalid = |field: &str, reason: String| ModelError::InvalidField {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, v) in sizes {
            if v == 0 {
                return Err(invalid(field, "must be positive, found 0".into()));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(invalid(
                "num_key_value_heads",
                format!(
                    "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                    self.num_attention_heads, self.num_key_value_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(invalid(
                "head_dim",
                format!("must be even for RoPE, found {}", self.head_dim),
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(invalid(
                "rms_norm_eps",
                format!("must be a positive number, found {}", self.rms_norm_eps),
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(invalid(
                "rope_theta",
                format!("must be a positive number, found {}", self.rope_theta),
            ));
        }
        if let Some(rs) = &self.rope_scaling {
            for (field, v) in [
                ("rope_scaling.factor", rs.factor),
                ("rope_scaling.low_freq_factor", rs.low_freq_factor),
                ("rope_scaling.high_freq_factor", rs.high_freq_factor),
            ] {
                if !(v.is_finite() && v > 0.0) {
                    return Err(invalid(
                        field,
                        format!("must be a positive number, found {v}"),
                    ));
                }
            }
            if rs.high_freq_factor <= rs.low_freq_factor {
                return Err(invalid(
                    "rope_scaling.high_freq_factor",
                    format!(
                        "must be greater than low_freq_factor {}, found {}",
                        rs.low_freq_factor, rs.high_freq_factor
                    ),
                ));
            }
            if rs.original_max_position_embeddings == 0 {
                return Err(invalid(
                    "rope_scaling.original_max_position_embeddings",
                    "must be positive, found 0".into(),
                ));
            }
        }
        arch::validate_flags(self, path)?;
        for (field, id) in self
            .bos_token_id
            .iter()
            .map(|id| ("bos_token_id", *id))
            .chain(self.eos_token_ids.iter().map(|id| ("eos_token_id", *id)))
        {
            if id as usize >= self.vocab_size {
                return Err(invalid(
                    field,
                    format!("token id {id} is not below vocab_size {}", self.vocab_size),
                ));
            }
        }
        // Every tensor's element count, and the total, must fit in usize.
        let mut total = 0usize;
        for t in tensor_layout(self) {
            let n = t
                .shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .and_then(|n| n.checked_mul(4));
            total = match n.and_then(|n| total.checked_add(n)) {
                Some(t) => t,
                None => {
                    return Err(invalid(
                        "hidden_size",
                        format!("tensor {} of shape {:?} is too large", t.name, t.shape),
                    ))
                }
            };
        }
        Ok(())
    }
}
