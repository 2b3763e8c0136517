//! The SFT warm-up: cross-entropy on the task's demonstrations, in the run's
//! training precision.

use std::time::Instant;

use super::device::Which;
use super::pass::TrainSeq;
use super::pass_loss::PassLoss;
use super::{SetupError, StepMetrics, Trainer};
use crate::rl::optim::{OptimConfig, Schedule};

/// SFT draws its problems from this far into the training stream, so RL sees
/// fresh prompts.
const SFT_OFFSET: u64 = 1 << 40;

impl Trainer {
    pub(super) fn sft_step(&mut self) -> Result<StepMetrics, SetupError> {
        let t0 = Instant::now();
        let step = self.progress.sft_steps_done;
        let b = self.cfg.sft.batch;
        let eos = *self
            .stop_tokens
            .first()
            .ok_or_else(|| SetupError::Tokenizer("no EOS token".into()))?;
        let mut seqs = Vec::with_capacity(b);
        for i in 0..b as u64 {
            let p = self.task.train_problem(SFT_OFFSET + step * b as u64 + i);
            let mut tokens = self.prompt_tokens(&p)?;
            let prompt_len = tokens.len();
            let demo = self
                .tokenizer
                .encode(&p.demonstration, false)
                .map_err(|e| SetupError::Tokenizer(e.to_string()))?;
            tokens.extend(demo);
            tokens.push(eos);
            if tokens.len() > self.model_cfg.max_position_embeddings {
                return Err(SetupError::Tokenizer(format!(
                    "problem {}: prompt and demonstration take {} tokens, more than max_position_embeddings {}",
                    p.id,
                    tokens.len(),
                    self.model_cfg.max_position_embeddings
                )));
            }
            seqs.push(TrainSeq { tokens, prompt_len });
        }
        let n_tokens: usize = seqs.iter().map(|s| s.response_len()).sum();
        let total_tokens: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        let inv = 1.0 / n_tokens as f64;
        // The cross-entropy -mean logp: a constant gradient (on the device), the
        // loss summed from the scored logprobs in token order.
        let ce = PassLoss::Const {
            dlogp: -inv,
            dentropy: 0.0,
        };
        let (pending, grads) = self.pass(Which::Policy, &seqs, 1.0, Some(ce))?;
        let oc = OptimConfig {
            lr: self.cfg.sft.lr,
            warmup_steps: self.cfg.sft.warmup_steps,
            schedule: Schedule::Constant,
            ..self.cfg.train.optim()
        };
        let lr = oc.lr_at(step, self.sft_total());
        let grads =
            grads.ok_or_else(|| SetupError::Device("the pass returned no gradients".into()))?;
        let grad_norm = self.apply(grads, &oc, lr, false)?;
        // The scores come to the host once the optimizer step is queued behind the pass.
        let scored = pending.wait()?;
        let mut loss = 0.0;
        for lp in scored.logp.iter().flatten() {
            loss -= lp * inv;
        }
        self.progress.sft_steps_done += 1;
        if self.progress.sft_steps_done == self.sft_total() {
            // RL starts with fresh optimizer moments, and the reference policy is
            // the warmed-up model.
            self.sync_host()?;
            self.opt = crate::rl::optim::AdamW::new(&self.model_cfg);
            if self.reference.is_some() {
                self.reference = Some(self.weights.clone());
            }
            self.host_changed()?;
        }
        let dt = t0.elapsed().as_secs_f64();
        Ok(StepMetrics {
            phase: "sft".into(),
            step,
            flow: self.flow.name().into(),
            loss,
            grad_norm,
            lr,
            train_s: dt,
            step_s: dt,
            train_tokens_per_s: total_tokens as f64 / dt.max(1e-9),
            ..Default::default()
        })
    }
}
