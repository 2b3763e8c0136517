//! Building a trainer from a run config: model, tokenizer, task.

use std::path::PathBuf;
use std::sync::Arc;

use jet_kernels::cuda::Gpu;
use jet_kernels::Flow;

use crate::config::{RunConfig, TINY_ARITH_TOKENIZER};
use crate::model::{init_random, load_model, Arch, ModelConfig, ModelError};
use crate::rl::optim::AdamW;
use crate::tasks::{build_task, TaskError};
use crate::tokenizer::Tokenizer;

use super::{Progress, Trainer};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("CUDA: {0}")]
    Device(String),
    #[error("{file}: {field}: {message}")]
    Config {
        file: String,
        field: String,
        message: String,
    },
}

impl Trainer {
    /// Load or initialise the model, the tokenizer and the task of `cfg`.
    /// `flow` overrides the config's flow when given. A `cuda` run opens the
    /// first GPU.
    pub fn new(cfg: RunConfig, flow: Option<Flow>) -> Result<Trainer, SetupError> {
        Self::with_gpu(cfg, flow, None)
    }

    /// As [`Trainer::new`], on `gpu` when the run is a `cuda` run (the daemon
    /// picks the device and its kernel cache); `None` opens the first GPU.
    pub fn with_gpu(
        cfg: RunConfig,
        flow: Option<Flow>,
        gpu: Option<Arc<Gpu>>,
    ) -> Result<Trainer, SetupError> {
        let flow = flow.unwrap_or(cfg.run.flow.0);
        let bad = |field: &str, message: String| SetupError::Config {
            file: cfg.source.clone(),
            field: field.into(),
            message,
        };
        let tok_path: Option<PathBuf> = match (&cfg.model.tokenizer, &cfg.model.path) {
            (Some(t), _) => Some(cfg.resolve(t)),
            (None, Some(p)) => Some(cfg.resolve(p).join("tokenizer.json")),
            (None, None) => None,
        };
        let tokenizer = match &tok_path {
            // The embedded default carries its tokenizer inside the binary.
            Some(p) if cfg.source.starts_with("<embedded") && !p.exists() => {
                Tokenizer::from_json_str(TINY_ARITH_TOKENIZER)
            }
            Some(p) => Tokenizer::from_file(p),
            None => {
                return Err(bad(
                    "model.tokenizer",
                    "a random model needs a tokenizer path".into(),
                ))
            }
        }
        .map_err(|e| SetupError::Tokenizer(e.to_string()))?;
        let (model_cfg, weights) = match (&cfg.model.path, &cfg.model.random) {
            (Some(p), _) => load_model(&cfg.resolve(p))?,
            (None, Some(r)) => {
                let arch = r.arch().ok_or_else(|| {
                    bad(
                        "model.random.arch",
                        format!("unknown architecture '{}' (llama, qwen2, qwen3)", r.arch),
                    )
                })?;
                let eos = tokenizer.end_token_id();
                let mc = ModelConfig {
                    arch,
                    vocab_size: tokenizer.vocab_size(),
                    hidden_size: r.hidden_size,
                    intermediate_size: r.intermediate_size,
                    num_hidden_layers: r.num_hidden_layers,
                    num_attention_heads: r.num_attention_heads,
                    num_key_value_heads: r.num_key_value_heads,
                    head_dim: r.head_dim,
                    rms_norm_eps: 1e-6,
                    rope_theta: r.rope_theta,
                    rope_scaling: None,
                    max_position_embeddings: r.max_position_embeddings,
                    tie_word_embeddings: r.tie_word_embeddings,
                    attention_bias: arch == Arch::Qwen2,
                    qk_norm: arch == Arch::Qwen3,
                    bos_token_id: None,
                    eos_token_ids: eos.into_iter().collect(),
                };
                mc.validate()
                    .map_err(|e| bad("model.random", e.to_string()))?;
                let w = init_random(&mc, cfg.run.seed);
                (mc, w)
            }
            (None, None) => return Err(bad("model", "give model.path or model.random".into())),
        };
        if tokenizer.vocab_size() > model_cfg.vocab_size {
            return Err(bad(
                "model",
                format!(
                    "vocabulary mismatch: the tokenizer has {} tokens but the model's vocab_size is {}",
                    tokenizer.vocab_size(),
                    model_cfg.vocab_size
                ),
            ));
        }
        let mut stop_tokens = model_cfg.eos_token_ids.clone();
        if let Some(e) = tokenizer.end_token_id() {
            if !stop_tokens.contains(&e) {
                stop_tokens.push(e);
            }
        }
        if stop_tokens.is_empty() {
            return Err(bad(
                "model",
                "neither the model config nor the tokenizer names an EOS token".into(),
            ));
        }
        let task = build_task(&cfg.task, &cfg.base_dir)?;
        let reference = (cfg.train.kl_coef > 0.0).then(|| weights.clone());
        let opt = AdamW::new(&model_cfg);
        let device = match cfg.run.device.as_str() {
            "cuda" => {
                let gpu = match gpu {
                    Some(g) => g,
                    None => crate::gpu::open_gpu()
                        .map_err(|e| bad("run.device", format!("\"cuda\" asked for, but {e}")))?,
                };
                Some(crate::gpu::GpuState::new(
                    gpu,
                    &weights,
                    &opt,
                    reference.as_ref(),
                )?)
            }
            _ => None,
        };
        Ok(Trainer {
            opt,
            device,
            model_cfg,
            tokenizer,
            task,
            flow,
            weights,
            reference,
            progress: Progress::default(),
            stop_tokens,
            last_heldout: None,
            cfg,
        })
    }
}
