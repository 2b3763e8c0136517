//! Run configuration (TOML). Unknown keys, wrong types and impossible values are
//! errors that name the field's path (`train.lr`, `rollout.group_size`).

use std::path::{Path, PathBuf};

use jet_kernels::Flow;
use serde::{Deserialize, Serialize};

use crate::rl::optim::{OptimConfig, Schedule};
use crate::rollout::sampler::SamplingParams;
use crate::tasks::{RewardConfig, TaskConfig};

/// The embedded default run (`configs/tiny-arith.toml`) and its tokenizer.
pub const TINY_ARITH_TOML: &str = include_str!("../../configs/tiny-arith.toml");
pub const TINY_ARITH_TOKENIZER: &str = include_str!("../../configs/tiny-arith.tokenizer.json");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{file}: {path}: {message}")]
    Parse {
        file: String,
        path: String,
        message: String,
    },
    #[error("{file}: {field}: {message}")]
    Invalid {
        file: String,
        field: String,
        message: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    #[serde(default)]
    pub run: RunSection,
    pub model: ModelSection,
    pub task: TaskConfig,
    #[serde(default)]
    pub reward: RewardConfig,
    #[serde(default)]
    pub rollout: RolloutSection,
    #[serde(default)]
    pub train: TrainSection,
    #[serde(default)]
    pub sft: SftSection,
    #[serde(default)]
    pub checkpoint: CheckpointSection,
    #[serde(default)]
    pub health: HealthSection,
    #[serde(default)]
    pub debug: DebugSection,
    /// Folder the config's relative paths are resolved against (not in the file).
    #[serde(skip)]
    pub base_dir: PathBuf,
    /// Name shown in messages for this config (its path, or "<embedded tiny-arith>").
    #[serde(skip)]
    pub source: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// Number of RL steps (after the SFT warm-up).
    pub steps: u64,
    pub flow: FlowName,
    pub seed: u64,
    pub device: String,
    /// Evaluate held-out accuracy every this many RL steps (and at the last).
    pub eval_every: u64,
    /// Held-out problems per evaluation (at most the task's held-out size).
    pub eval_size: usize,
    /// Also measure pass@k on them at each evaluation: k samples per problem at
    /// the rollout's sampling settings (0 = off).
    pub eval_pass_k: usize,
    /// On the GPU, compute every row of the FP8 and BF16 forward GEMMs in one
    /// order whatever the batch, so rollout and training logprobs agree bit for
    /// bit (`mismatch_kl` 0 in the `fp8` and `bf16` flows). `false` lets the
    /// forward use cuBLASLt's GEMMs: faster, no longer bitwise on-policy. No
    /// effect on the CPU, which is always exact.
    pub batch_invariant: bool,
    /// On the GPU, replay each rollout decode step as a CUDA graph (one per
    /// batch-size bucket, captured once per rollout): the same kernels and the
    /// same numbers with a fraction of the host's launch work. `false` launches
    /// every kernel of every step (for debugging and comparison).
    pub cuda_graphs: bool,
}

impl Default for RunSection {
    fn default() -> Self {
        RunSection {
            steps: 100,
            flow: FlowName(Flow::Fp8),
            seed: 0,
            device: "cpu".into(),
            eval_every: 10,
            eval_size: 200,
            eval_pass_k: 0,
            batch_invariant: true,
            cuda_graphs: true,
        }
    }
}

/// A flow as written in a config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowName(pub Flow);

impl Serialize for FlowName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.name())
    }
}

impl<'de> Deserialize<'de> for FlowName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map(FlowName).map_err(serde::de::Error::custom)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A Hugging Face model folder (config.json, safetensors, tokenizer.json).
    pub path: Option<PathBuf>,
    /// Or a model from random weights with this shape.
    pub random: Option<RandomModel>,
    /// tokenizer.json (default: the model folder's).
    pub tokenizer: Option<PathBuf>,
    /// Passed to the chat template as `enable_thinking` (Qwen3's templates:
    /// false opens the answer with an empty think block); unset, the template's
    /// own default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_thinking: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomModel {
    pub arch: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
}

impl RandomModel {
    /// The architecture named by `arch` (an HF `model_type`), if supported.
    pub fn arch(&self) -> Option<crate::model::Arch> {
        use crate::model::Arch;
        [Arch::Llama, Arch::Qwen2, Arch::Qwen3]
            .into_iter()
            .find(|a| a.model_type() == self.arch)
    }
}

fn default_true() -> bool {
    true
}
fn default_theta() -> f64 {
    10000.0
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutSection {
    /// Prompts per RL step.
    pub prompts_per_step: usize,
    /// Samples per prompt (GRPO group size, at least 2).
    pub group_size: usize,
    pub max_new_tokens: usize,
    /// 0 means greedy.
    pub temperature: f64,
    pub top_p: f64,
    /// 0 means off.
    pub top_k: usize,
    pub stop_strings: Vec<String>,
    /// Most sequences decoded at once; 0: all of a step's samples. When one
    /// finishes, its KV-cache slot takes the step's next sample (continuous
    /// batching), so the cache holds max_batch x (prompt + max_new_tokens) rows.
    /// The rollouts depend on it (the sampling order follows the batch), so a run
    /// keeps one value.
    pub max_batch: usize,
    /// GiB the GPU's KV cache may take; 0: room for max_batch sequences at full
    /// length. Under it the cache's pages go to sequences as they grow; where a
    /// step finds none free the youngest sequences are preempted and prefilled
    /// again later (the same logprobs; the order of the draws, so the samples,
    /// then depends on it too).
    pub kv_cache_gib: f64,
}

/// `gib` GiB in bytes, None for 0 (no bound); a positive value under one byte
/// stays a bound (too small: an error at the rollout, naming the setting).
pub fn gib_bytes(gib: f64) -> Option<usize> {
    (gib > 0.0).then_some(((gib * (1u64 << 30) as f64) as usize).max(1))
}

impl RolloutSection {
    /// The KV cache's bound in bytes (None: room for max_batch full-length sequences).
    pub fn kv_cache_bytes(&self) -> Option<usize> {
        gib_bytes(self.kv_cache_gib)
    }

    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
        }
    }
}

impl Default for RolloutSection {
    fn default() -> Self {
        RolloutSection {
            prompts_per_step: 16,
            group_size: 8,
            max_new_tokens: 32,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            stop_strings: Vec::new(),
            max_batch: 0,
            kv_cache_gib: 0.0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    pub lr: f64,
    pub warmup_steps: u64,
    pub schedule: Schedule,
    pub min_lr_ratio: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub grad_clip: f64,
    pub clip_low: f64,
    pub clip_high: f64,
    /// Truncated importance sampling cap (off when absent).
    pub tis_cap: Option<f64>,
    pub kl_coef: f64,
    pub entropy_coef: f64,
    /// Divide advantages by the group's standard deviation (GRPO) or not (Dr. GRPO).
    pub scale_adv_by_std: bool,
    /// Sequences per forward/backward pass (bounds memory).
    pub micro_batch: usize,
    /// Tokens per forward/backward pass at most: a step's sequences of very
    /// different lengths packed into micro-batches of about one size (a longer
    /// sequence runs alone). `"auto"` (the default): on a GPU, what its memory holds
    /// by the model's per-token estimate (`gpu::micro`); on the CPU, no bound.
    pub micro_batch_tokens: MicroTokens,
    /// Optimizer steps per RL step (the batch is split into this many parts).
    pub mini_batches: usize,
}

/// `train.micro_batch`'s default: sequences a forward/backward pass takes at most
/// (`jetd bench`'s GRPO-shaped step takes it too).
pub const DEFAULT_MICRO_BATCH: usize = 64;

/// `train.micro_batch_tokens`: `"auto"` or a number of tokens (0: no bound).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MicroTokens {
    /// Sized to the device: see [`TrainSection::micro_batch_tokens`].
    #[default]
    Auto,
    /// At most this many tokens a micro-batch (0: `micro_batch` alone bounds it).
    Max(usize),
}

impl std::str::FromStr for MicroTokens {
    type Err = String;

    /// The command line's form (`jetd bench --train-tokens`): `auto` or a number.
    fn from_str(v: &str) -> Result<Self, String> {
        match v.trim() {
            "auto" => Ok(MicroTokens::Auto),
            n => n
                .parse()
                .map(MicroTokens::Max)
                .map_err(|_| format!("{v:?}: expected a number of tokens (0: no bound) or auto")),
        }
    }
}

impl Serialize for MicroTokens {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MicroTokens::Auto => s.serialize_str("auto"),
            MicroTokens::Max(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for MicroTokens {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = MicroTokens;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number of tokens (0: no bound) or \"auto\"")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<MicroTokens, E> {
                usize::try_from(n)
                    .map(MicroTokens::Max)
                    .map_err(|_| E::custom(format!("{n} tokens is too many")))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<MicroTokens, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format!(
                        "{n}: expected a number of tokens >= 0 (0: no bound) or \"auto\""
                    ))),
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<MicroTokens, E> {
                match v {
                    "auto" => Ok(MicroTokens::Auto),
                    _ => Err(E::custom(format!(
                        "{v:?}: expected a number of tokens (0: no bound) or \"auto\""
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl Default for TrainSection {
    fn default() -> Self {
        TrainSection {
            lr: 1e-6,
            warmup_steps: 0,
            schedule: Schedule::Constant,
            min_lr_ratio: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            grad_clip: 1.0,
            clip_low: 0.2,
            clip_high: 0.28,
            tis_cap: None,
            kl_coef: 0.0,
            entropy_coef: 0.0,
            scale_adv_by_std: true,
            micro_batch: DEFAULT_MICRO_BATCH,
            micro_batch_tokens: MicroTokens::Auto,
            mini_batches: 1,
        }
    }
}

impl TrainSection {
    pub fn optim(&self) -> OptimConfig {
        OptimConfig {
            lr: self.lr,
            warmup_steps: self.warmup_steps,
            schedule: self.schedule,
            min_lr_ratio: self.min_lr_ratio,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            grad_clip: self.grad_clip,
        }
    }
}

/// Supervised warm-up on the task's demonstrations (for models from random weights).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftSection {
    pub steps: u64,
    pub batch: usize,
    pub lr: f64,
    pub warmup_steps: u64,
}

impl Default for SftSection {
    fn default() -> Self {
        SftSection {
            steps: 0,
            batch: 32,
            lr: 1e-3,
            warmup_steps: 0,
        }
    }
}

/// Checkpoints of a daemon-run (`jetd serve`) job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointSection {
    /// A checkpoint every this many RL steps (0 = only on demand, at the end of
    /// the SFT warm-up, on pause/stop and at the end).
    pub every: u64,
    /// Checkpoints kept on the run's line (older ones, and those of a branch
    /// abandoned by a rollback, are deleted).
    pub keep_last: usize,
    /// Also keep the checkpoint with the best held-out accuracy.
    pub keep_best: bool,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        CheckpointSection {
            every: 10,
            keep_last: 3,
            keep_best: true,
        }
    }
}

/// What to do after an automatic rollback.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Remedy {
    /// Skip the batches that led to the collapse (draw different problems).
    SkipBatch,
    /// Multiply the learning rate by `health.lr_factor`.
    LowerLr,
}

/// Collapse detection: each rule is an event when it fires; with
/// `auto_rollback` the run rolls back to its last healthy checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthSection {
    /// Reward collapse: reward_mean below (best EMA - reward_drop) for
    /// reward_drop_steps consecutive steps (reward_drop 0 = off).
    pub reward_drop: f64,
    pub reward_drop_steps: u64,
    /// EMA factor of the reward mean.
    pub reward_ema: f64,
    /// Entropy collapse / explosion bounds (0 = off).
    pub entropy_min: f64,
    pub entropy_max: f64,
    /// mismatch_kl above this raises an alarm (0 = off).
    pub mismatch_kl_alarm: f64,
    /// grad_norm above this many times its EMA is a spike (0 = off).
    pub grad_norm_spike: f64,
    pub auto_rollback: bool,
    /// Automatic rollbacks allowed before the run pauses with an alarm.
    pub max_rollbacks: u32,
    pub remedy: Remedy,
    /// LR multiplier of the lower_lr remedy.
    pub lr_factor: f64,
}

impl Default for HealthSection {
    fn default() -> Self {
        HealthSection {
            reward_drop: 0.0,
            reward_drop_steps: 5,
            reward_ema: 0.9,
            entropy_min: 0.0,
            entropy_max: 0.0,
            mismatch_kl_alarm: 1e-2,
            grad_norm_spike: 0.0,
            auto_rollback: true,
            max_rollbacks: 3,
            remedy: Remedy::SkipBatch,
            lr_factor: 0.5,
        }
    }
}

/// Fault injection for tests and drills.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DebugSection {
    /// Poison the loss with NaN at this RL step (only on the original batches:
    /// a run that skipped batches after a rollback does not see it again).
    pub inject_nan_at_step: Option<u64>,
}

impl RunConfig {
    /// Parse a config file.
    pub fn from_file(path: &Path) -> Result<RunConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::from_str_at(&text, &path.display().to_string(), &base)
    }

    /// The embedded default.
    pub fn tiny_arith() -> RunConfig {
        Self::from_str_at(
            TINY_ARITH_TOML,
            "<embedded tiny-arith>",
            Path::new("configs"),
        )
        .expect("the embedded config is valid")
    }

    /// Parse TOML text; `file` names it in errors, relative paths resolve against `base`.
    pub fn from_str_at(text: &str, file: &str, base: &Path) -> Result<RunConfig, ConfigError> {
        let de = toml::Deserializer::parse(text).map_err(|e| ConfigError::Parse {
            file: file.into(),
            path: "(syntax)".into(),
            message: e.to_string().trim().to_string(),
        })?;
        let mut cfg: RunConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            ConfigError::Parse {
                file: file.into(),
                path,
                message: first_line(&e.into_inner().to_string()),
            }
        })?;
        cfg.base_dir = base.to_path_buf();
        cfg.source = file.into();
        cfg.validate()?;
        Ok(cfg)
    }

    /// Resolve a path from the config against its folder.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }

    fn invalid(&self, field: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            file: self.source.clone(),
            field: field.into(),
            message: message.into(),
        }
    }

    /// Impossible values, each named by its field path.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let r = &self.rollout;
        let t = &self.train;
        let checks: [(bool, &str, &str); 18] = [
            (
                r.prompts_per_step == 0,
                "rollout.prompts_per_step",
                "must be at least 1",
            ),
            (
                r.group_size < 2,
                "rollout.group_size",
                "GRPO needs at least 2 samples per prompt",
            ),
            (
                r.max_new_tokens == 0,
                "rollout.max_new_tokens",
                "must be at least 1",
            ),
            (
                r.temperature.is_nan() || r.temperature < 0.0,
                "rollout.temperature",
                "must be >= 0",
            ),
            (
                !(r.top_p.is_finite() && r.top_p > 0.0 && r.top_p <= 1.0),
                "rollout.top_p",
                "must be in (0, 1]",
            ),
            (
                !(r.kv_cache_gib.is_finite() && r.kv_cache_gib >= 0.0),
                "rollout.kv_cache_gib",
                "must be a finite number >= 0 (0: room for max_batch full-length sequences)",
            ),
            (
                !(t.lr >= 0.0 && t.lr.is_finite()),
                "train.lr",
                "must be a finite number >= 0",
            ),
            (
                !(t.clip_low >= 0.0 && t.clip_low < 1.0),
                "train.clip_low",
                "must be in [0, 1)",
            ),
            (
                t.clip_high.is_nan() || t.clip_high < 0.0,
                "train.clip_high",
                "must be >= 0",
            ),
            (
                t.tis_cap.is_some_and(|c| c.is_nan() || c <= 0.0),
                "train.tis_cap",
                "must be > 0",
            ),
            (
                t.micro_batch == 0,
                "train.micro_batch",
                "must be at least 1",
            ),
            (
                t.mini_batches == 0,
                "train.mini_batches",
                "must be at least 1",
            ),
            (
                !(t.beta1 >= 0.0 && t.beta1 < 1.0),
                "train.beta1",
                "must be in [0, 1)",
            ),
            (
                !(t.beta2 >= 0.0 && t.beta2 < 1.0),
                "train.beta2",
                "must be in [0, 1)",
            ),
            (
                self.sft.steps > 0 && self.sft.batch == 0,
                "sft.batch",
                "must be at least 1",
            ),
            (
                self.run.eval_every == 0,
                "run.eval_every",
                "must be at least 1",
            ),
            (
                self.run.eval_pass_k > 64,
                "run.eval_pass_k",
                "must be at most 64 (samples per held-out problem)",
            ),
            (
                self.model.path.is_some() == self.model.random.is_some(),
                "model",
                "give exactly one of model.path and model.random",
            ),
        ];
        for (bad, field, msg) in checks {
            if bad {
                return Err(self.invalid(field, msg));
            }
        }
        if t.mini_batches > r.prompts_per_step * r.group_size {
            return Err(self.invalid(
                "train.mini_batches",
                "more mini-batches than samples per step",
            ));
        }
        if let Some(r) = &self.model.random {
            if r.arch().is_none() {
                return Err(self.invalid(
                    "model.random.arch",
                    format!("unknown architecture '{}' (llama, qwen2, qwen3)", r.arch),
                ));
            }
        }
        if self.run.device != "cpu" && self.run.device != "cuda" {
            return Err(self.invalid(
                "run.device",
                format!("unknown device '{}' (cpu or cuda)", self.run.device),
            ));
        }
        Ok(())
    }
}

fn first_line(s: &str) -> String {
    // toml's messages span several lines: "TOML parse error at line L, column C",
    // a source excerpt, then the reason. Keep the reason and the position.
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let reason = lines.last().copied().unwrap_or("");
    match lines
        .first()
        .and_then(|l| l.strip_prefix("TOML parse error at "))
    {
        Some(pos) if lines.len() > 1 => format!("{reason} ({pos})"),
        _ => reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded default with `line` added to its `[train]` table.
    fn with_train(line: &str) -> Result<RunConfig, ConfigError> {
        let text = TINY_ARITH_TOML.replacen("[train]\n", &format!("[train]\n{line}\n"), 1);
        RunConfig::from_str_at(&text, "test.toml", Path::new("configs"))
    }

    /// `train.micro_batch_tokens`: "auto" by default, a number (0: no bound) or
    /// "auto" where written; anything else an error naming the field; written
    /// back as read.
    #[test]
    fn micro_batch_tokens_is_a_number_or_auto() {
        assert_eq!(
            RunConfig::tiny_arith().train.micro_batch_tokens,
            MicroTokens::Auto
        );
        for (line, want) in [
            ("micro_batch_tokens = \"auto\"", MicroTokens::Auto),
            ("micro_batch_tokens = 0", MicroTokens::Max(0)),
            ("micro_batch_tokens = 16384", MicroTokens::Max(16384)),
        ] {
            let cfg = with_train(line).unwrap();
            assert_eq!(cfg.train.micro_batch_tokens, want, "{line}");
            let back = toml::to_string(&cfg.train).unwrap();
            let again: TrainSection = toml::from_str(&back).unwrap();
            assert_eq!(again.micro_batch_tokens, want, "{back}");
        }
        // The command line's form.
        assert_eq!("auto".parse::<MicroTokens>(), Ok(MicroTokens::Auto));
        assert_eq!("16384".parse::<MicroTokens>(), Ok(MicroTokens::Max(16384)));
        assert!("fast".parse::<MicroTokens>().is_err() && "-5".parse::<MicroTokens>().is_err());
        for line in [
            "micro_batch_tokens = \"fast\"",
            "micro_batch_tokens = -5",
            "micro_batch_tokens = 1.5",
        ] {
            let e = with_train(line).unwrap_err().to_string();
            assert!(
                e.contains("test.toml") && e.contains("train.micro_batch_tokens"),
                "{line}: {e}"
            );
        }
    }
}
