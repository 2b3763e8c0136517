//! Model parameters in f32, with HF tensor names and shapes, and one fixed
//! order of tensors (so an optimizer can walk parameters and gradients in
//! lockstep).

use std::path::Path;

use super::config::ModelConfig;
use super::error::ModelError;

/// One decoder layer. Matrices are row-major `[out, in]`, like HF `nn.Linear`.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerWeights {
    /// [hidden]
    pub input_layernorm: Vec<f32>,
    /// [heads*hd, hidden]
    pub q_proj: Vec<f32>,
    /// [kv*hd, hidden]
    pub k_proj: Vec<f32>,
    /// [kv*hd, hidden]
    pub v_proj: Vec<f32>,
    /// [hidden, heads*hd]
    pub o_proj: Vec<f32>,
    /// [heads*hd] (Qwen2)
    pub q_bias: Option<Vec<f32>>,
    /// [kv*hd] (Qwen2)
    pub k_bias: Option<Vec<f32>>,
    /// [kv*hd] (Qwen2)
    pub v_bias: Option<Vec<f32>>,
    /// [head_dim] (Qwen3)
    pub q_norm: Option<Vec<f32>>,
    /// [head_dim] (Qwen3)
    pub k_norm: Option<Vec<f32>>,
    /// [hidden]
    pub post_attention_layernorm: Vec<f32>,
    /// [inter, hidden]
    pub gate_proj: Vec<f32>,
    /// [inter, hidden]
    pub up_proj: Vec<f32>,
    /// [hidden, inter]
    pub down_proj: Vec<f32>,
}

/// The whole model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelWeights {
    /// [vocab, hidden]
    pub embed_tokens: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    /// [hidden]
    pub norm: Vec<f32>,
    /// [vocab, hidden]; `None` when tied to `embed_tokens`.
    pub lm_head: Option<Vec<f32>>,
}

/// What a tensor is, for initialization and weight decay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorKind {
    /// Token embeddings or lm_head.
    Embedding,
    /// A linear layer's weight.
    Matrix,
    /// An RMSNorm weight.
    Norm,
    /// A linear layer's bias.
    Bias,
}

/// A tensor's HF name, shape and kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub kind: TensorKind,
}

impl TensorSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }
}

pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
pub const FINAL_NORM: &str = "model.norm.weight";
pub const LM_HEAD: &str = "lm_head.weight";

/// Per-layer tensor names (after `model.layers.{i}.`), in the fixed order.
const LAYER_FIELDS: [&str; 14] = [
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.q_proj.bias",
    "self_attn.k_proj.weight",
    "self_attn.k_proj.bias",
    "self_attn.v_proj.weight",
    "self_attn.v_proj.bias",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];

fn layer_name(i: usize, field: &str) -> String {
    format!("model.layers.{i}.{field}")
}

/// Shapes and kinds of one layer's tensors, in `LAYER_FIELDS` order; `None`
/// for tensors this config does not have.
fn layer_shapes(cfg: &ModelConfig) -> [Option<(Vec<usize>, TensorKind)>; 14] {
    use TensorKind::*;
    let h = cfg.hidden_size;
    let q = cfg.num_attention_heads.saturating_mul(cfg.head_dim);
    let kv = cfg.num_key_value_heads.saturating_mul(cfg.head_dim);
    let inter = cfg.intermediate_size;
    let bias = |n: usize| cfg.attention_bias.then(|| (vec![n], Bias));
    let qk_norm = || cfg.qk_norm.then(|| (vec![cfg.head_dim], Norm));
    [
        Some((vec![h], Norm)),
        Some((vec![q, h], Matrix)),
        bias(q),
        Some((vec![kv, h], Matrix)),
        bias(kv),
        Some((vec![kv, h], Matrix)),
        bias(kv),
        Some((vec![h, q], Matrix)),
        qk_norm(),
        qk_norm(),
        Some((vec![h], Norm)),
        Some((vec![inter, h], Matrix)),
        Some((vec![inter, h], Matrix)),
        Some((vec![h, inter], Matrix)),
    ]
}

/// Every tensor of a model with this config, in the fixed order: embeddings,
/// then each layer, then the final norm, then lm_head (only when untied).
pub fn tensor_layout(cfg: &ModelConfig) -> Vec<TensorSpec> {
    let mut out = Vec::new();
    let vocab = vec![cfg.vocab_size, cfg.hidden_size];
    out.push(TensorSpec {
        name: EMBED_TOKENS.into(),
        shape: vocab.clone(),
        kind: TensorKind::Embedding,
    });
    let shapes = layer_shapes(cfg);
    for i in 0..cfg.num_hidden_layers {
        for (field, shape) in LAYER_FIELDS.iter().zip(shapes.iter()) {
            if let Some((shape, kind)) = shape {
                out.push(TensorSpec {
                    name: layer_name(i, field),
                    shape: shape.clone(),
                    kind: *kind,
                });
            }
        }
    }
    out.push(TensorSpec {
        name: FINAL_NORM.into(),
        shape: vec![cfg.hidden_size],
        kind: TensorKind::Norm,
    });
    if !cfg.tie_word_embeddings {
        out.push(TensorSpec {
            name: LM_HEAD.into(),
            shape: vocab,
            kind: TensorKind::Embedding,
        });
    }
    out
}

/// `(HF name, shape)` of every tensor, in the fixed order.
pub fn tensor_specs(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    tensor_layout(cfg)
        .into_iter()
        .map(|t| (t.name, t.shape))
        .collect()
}

impl LayerWeights {
    fn fields(&self) -> [Option<&Vec<f32>>; 14] {
        [
            Some(&self.input_layernorm),
            Some(&self.q_proj),
            self.q_bias.as_ref(),
            Some(&self.k_proj),
            self.k_bias.as_ref(),
            Some(&self.v_proj),
            self.v_bias.as_ref(),
            Some(&self.o_proj),
            self.q_norm.as_ref(),
            self.k_norm.as_ref(),
            Some(&self.post_attention_layernorm),
            Some(&self.gate_proj),
            Some(&self.up_proj),
            Some(&self.down_proj),
        ]
    }

    fn fields_mut(&mut self) -> [Option<&mut Vec<f32>>; 14] {
        [
            Some(&mut self.input_layernorm),
            Some(&mut self.q_proj),
            self.q_bias.as_mut(),
            Some(&mut self.k_proj),
            self.k_bias.as_mut(),
            Some(&mut self.v_proj),
            self.v_bias.as_mut(),
            Some(&mut self.o_proj),
            self.q_norm.as_mut(),
            self.k_norm.as_mut(),
            Some(&mut self.post_attention_layernorm),
            Some(&mut self.gate_proj),
            Some(&mut self.up_proj),
            Some(&mut self.down_proj),
        ]
    }

    /// A layer with empty (unallocated) tensors, its optional ones present
    /// exactly when the config has them.
    fn empty(cfg: &ModelConfig) -> LayerWeights {
        let opt = |on: bool| on.then(Vec::new);
        LayerWeights {
            input_layernorm: Vec::new(),
            q_proj: Vec::new(),
            k_proj: Vec::new(),
            v_proj: Vec::new(),
            o_proj: Vec::new(),
            q_bias: opt(cfg.attention_bias),
            k_bias: opt(cfg.attention_bias),
            v_bias: opt(cfg.attention_bias),
            q_norm: opt(cfg.qk_norm),
            k_norm: opt(cfg.qk_norm),
            post_attention_layernorm: Vec::new(),
            gate_proj: Vec::new(),
            up_proj: Vec::new(),
            down_proj: Vec::new(),
        }
    }
}

impl ModelWeights {
    /// The structure of a model for `cfg` with every tensor empty; filling
    /// [`ModelWeights::tensors_mut`] in order makes it whole.
    pub(crate) fn empty(cfg: &ModelConfig) -> ModelWeights {
        ModelWeights {
            embed_tokens: Vec::new(),
            layers: (0..cfg.num_hidden_layers)
                .map(|_| LayerWeights::empty(cfg))
                .collect(),
            norm: Vec::new(),
            lm_head: (!cfg.tie_word_embeddings).then(Vec::new),
        }
    }

    /// All-zero weights for `cfg` (a gradient buffer, say).
    pub fn zeros(cfg: &ModelConfig) -> ModelWeights {
        let mut w = Self::empty(cfg);
        for ((_, t), spec) in w.tensors_mut().into_iter().zip(tensor_layout(cfg)) {
            *t = vec![0.0; spec.numel()];
        }
        w
    }

    /// `(HF name, data)` of every tensor present, in the order of [`tensor_specs`].
    pub fn tensors(&self) -> Vec<(String, &[f32])> {
        let mut out: Vec<(String, &[f32])> = vec![(EMBED_TOKENS.into(), &self.embed_tokens)];
        for (i, layer) in self.layers.iter().enumerate() {
            for (field, t) in LAYER_FIELDS.iter().zip(layer.fields()) {
                if let Some(t) = t {
                    out.push((layer_name(i, field), t));
                }
            }
        }
        out.push((FINAL_NORM.into(), &self.norm));
        if let Some(t) = &self.lm_head {
            out.push((LM_HEAD.into(), t));
        }
        out
    }

    /// Like [`ModelWeights::tensors`], mutable.
    pub fn tensors_mut(&mut self) -> Vec<(String, &mut Vec<f32>)> {
        let mut out: Vec<(String, &mut Vec<f32>)> =
            vec![(EMBED_TOKENS.into(), &mut self.embed_tokens)];
        for (i, layer) in self.layers.iter_mut().enumerate() {
            for (field, t) in LAYER_FIELDS.iter().zip(layer.fields_mut()) {
                if let Some(t) = t {
                    out.push((layer_name(i, field), t));
                }
            }
        }
        out.push((FINAL_NORM.into(), &mut self.norm));
        if let Some(t) = &mut self.lm_head {
            out.push((LM_HEAD.into(), t));
        }
        out
    }

    /// The output projection: `lm_head`, or `embed_tokens` when tied.
    pub fn lm_head_weights(&self) -> &[f32] {
        self.lm_head.as_deref().unwrap_or(&self.embed_tokens)
    }

    /// Total number of f32 values.
    pub fn num_params(&self) -> usize {
        self.tensors().iter().map(|(_, t)| t.len()).sum()
    }

    /// Checks that these weights have exactly the tensors and sizes `cfg` calls for.
    pub fn check(&self, cfg: &ModelConfig) -> Result<(), ModelError> {
        self.check_at(cfg, Path::new("<in-memory weights>"))
    }

    pub(crate) fn check_at(&self, cfg: &ModelConfig, path: &Path) -> Result<(), ModelError> {
        let specs = tensor_layout(cfg);
        let have = self.tensors();
        let mut specs_it = specs.iter();
        for (name, data) in &have {
            // Both lists are in the same order; a mismatch of names means a
            // tensor is missing from one side.
            let Some(spec) = specs_it.next() else {
                return Err(ModelError::UnexpectedTensor {
                    path: path.to_path_buf(),
                    tensor: name.clone(),
                    arch: cfg.arch.hf_class().into(),
                });
            };
            if spec.name != *name {
                return Err(if specs.iter().any(|s| s.name == *name) {
                    ModelError::MissingTensor {
                        path: path.to_path_buf(),
                        tensor: spec.name.clone(),
                    }
                } else {
                    ModelError::UnexpectedTensor {
                        path: path.to_path_buf(),
                        tensor: name.clone(),
                        arch: cfg.arch.hf_class().into(),
                    }
                });
            }
            if data.len() != spec.numel() {
                return Err(ModelError::WrongShape {
                    path: path.to_path_buf(),
                    tensor: name.clone(),
                    expected: spec.shape.clone(),
                    found: vec![data.len()],
                });
            }
        }
        if let Some(spec) = specs_it.next() {
            return Err(ModelError::MissingTensor {
                path: path.to_path_buf(),
                tensor: spec.name.clone(),
            });
        }
        Ok(())
    }
}
