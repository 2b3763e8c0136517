//! The trainer: a run's state and its SFT warm-up, RL and evaluation steps.

mod device;
pub mod metrics;
pub mod pass;
pub mod pass_loss;
mod rl_step;
mod setup;
mod sft;

use jet_kernels::Flow;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::config::RunConfig;
use crate::model::{ModelConfig, ModelWeights};
use crate::rl::optim::AdamW;
use crate::tasks::{Problem, Task};
use crate::tokenizer::Tokenizer;

pub use metrics::StepMetrics;
pub use setup::SetupError;

/// Where a run stands: with the weights and optimizer, everything needed to go
/// on bit for bit (RNG streams and data positions derive from these counters).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Progress {
    pub sft_steps_done: u64,
    pub rl_steps_done: u64,
    /// Batches skipped by rollback remedies: RL step s draws its problems and
    /// its sampling stream at position s + data_offset.
    pub data_offset: u64,
    /// Learning-rate multiplier applied by rollback remedies.
    pub lr_scale: f64,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            sft_steps_done: 0,
            rl_steps_done: 0,
            data_offset: 0,
            lr_scale: 1.0,
        }
    }
}

pub struct Trainer {
    pub cfg: RunConfig,
    pub model_cfg: ModelConfig,
    pub tokenizer: Tokenizer,
    pub task: Box<dyn Task>,
    pub flow: Flow,
    pub weights: ModelWeights,
    pub opt: AdamW,
    /// Frozen weights for the KL penalty (only when train.kl_coef > 0).
    pub reference: Option<ModelWeights>,
    pub progress: Progress,
    /// Tokens that end a response.
    pub stop_tokens: Vec<u32>,
    /// The most recent held-out accuracy.
    pub last_heldout: Option<f64>,
    /// The run's tensors on the GPU (`run.device = "cuda"`); `None` on the CPU.
    pub device: Option<crate::gpu::GpuState>,
}

/// Independent RNG stream for (seed, purpose, step).
pub(crate) fn stream(seed: u64, purpose: u64, step: u64) -> ChaCha8Rng {
    let mut r = ChaCha8Rng::seed_from_u64(seed ^ purpose.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    r.set_stream(step);
    r
}

impl Trainer {
    pub fn rl_total(&self) -> u64 {
        self.cfg.run.steps
    }
    pub fn sft_total(&self) -> u64 {
        self.cfg.sft.steps
    }

    /// Prompt tokens for a problem (through the chat template when the
    /// tokenizer has one).
    pub fn prompt_tokens(&self, p: &Problem) -> Result<Vec<u32>, SetupError> {
        let text = self
            .tokenizer
            .render_prompt_with(&p.prompt, self.cfg.model.enable_thinking)
            .map_err(|e| SetupError::Tokenizer(e.to_string()))?;
        let ids = self
            .tokenizer
            .encode(&text, true)
            .map_err(|e| SetupError::Tokenizer(e.to_string()))?;
        if ids.is_empty() {
            return Err(SetupError::Tokenizer(format!(
                "problem {} encodes to no tokens",
                p.id
            )));
        }
        let max = self.model_cfg.max_position_embeddings;
        if ids.len() >= max {
            return Err(SetupError::Tokenizer(format!(
                "problem {}: the prompt has {} tokens, the model's max_position_embeddings is {max}",
                p.id,
                ids.len()
            )));
        }
        Ok(ids)
    }

    /// The text of a response, without its stop token.
    pub fn response_text(&self, tokens: &[u32]) -> String {
        let body = match tokens.last() {
            Some(t) if self.stop_tokens.contains(t) => &tokens[..tokens.len() - 1],
            _ => tokens,
        };
        self.tokenizer.decode(body, true).unwrap_or_default()
    }

    /// One step of whichever phase comes next; `None` when the run is done.
    pub fn next_step(&mut self) -> Option<Result<StepMetrics, SetupError>> {
        if self.progress.sft_steps_done < self.sft_total() {
            return Some(self.sft_step());
        }
        if self.progress.rl_steps_done < self.rl_total() {
            return Some(self.rl_step());
        }
        None
    }
}
