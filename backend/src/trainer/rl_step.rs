//! One GRPO step: rollout, reward, advantages, the trainer's forward at the
//! rollout weights (mismatch metrics), the clipped-loss update(s).

use std::time::Instant;

use super::device::Which;
use super::pass::{Scored, TrainSeq};
use super::pass_loss::{LossStats, PassLoss, PolicyLoss};
use super::{stream, SetupError, StepMetrics, Trainer};
use crate::rl::advantage::group_advantages;
use crate::rl::by_length::by_length;
use crate::rl::loss::LossConfig;
use crate::rl::mismatch::mismatch;
use crate::rollout::engine::GenConfig;
use crate::rollout::sampler::SamplingParams;
use crate::tasks::{reward, Problem};

const ROLLOUT_STREAM: u64 = 1;
/// The greedy evaluation uses stream 99; pass@k its own.
const PASS_AT_K_STREAM: u64 = 98;

impl Trainer {
    fn gen_config(&self, sampling: SamplingParams) -> GenConfig {
        GenConfig {
            max_new_tokens: self.cfg.rollout.max_new_tokens,
            sampling,
            stop_token_ids: self.stop_tokens.clone(),
            stop_strings: self.cfg.rollout.stop_strings.clone(),
            max_batch: self.cfg.rollout.max_batch,
        }
    }

    fn loss_config(&self) -> LossConfig {
        let t = &self.cfg.train;
        LossConfig {
            clip_low: t.clip_low,
            clip_high: t.clip_high,
            tis_cap: t.tis_cap,
            kl_coef: t.kl_coef,
            entropy_coef: t.entropy_coef,
        }
    }

    /// Greedy accuracy on the first `eval_size` held-out problems.
    pub fn evaluate(&self) -> Result<f64, SetupError> {
        let n = self.cfg.run.eval_size.min(self.task.heldout_size());
        if n == 0 {
            return Ok(0.0);
        }
        let correct = self
            .greedy_responses(n)?
            .iter()
            .filter(|(p, r)| self.task.verify(p, r).correct)
            .count();
        Ok(correct as f64 / n as f64)
    }

    /// The first `n` held-out problems (at most the task's held-out size) with
    /// the greedy response to each: what `evaluate` judges, for callers that
    /// want to look closer (format, partial credit).
    pub fn greedy_responses(
        &self,
        n: usize,
    ) -> Result<Vec<(crate::tasks::Problem, String)>, SetupError> {
        let n = n.min(self.task.heldout_size());
        let greedy = SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
        };
        let gen = self.gen_config(greedy);
        let mut out = Vec::with_capacity(n);
        let mut rng = stream(self.cfg.run.seed, 99, 0);
        for start in (0..n).step_by(64) {
            let (problems, prompts) = self.heldout_batch(start..(start + 64).min(n))?;
            let (samples, _) = self.rollout(&prompts, 1, &gen, &mut rng)?;
            let mut texts = vec![String::new(); problems.len()];
            for s in &samples {
                texts[s.prompt_index] = self.response_text(&s.tokens);
            }
            out.extend(problems.into_iter().zip(texts));
        }
        Ok(out)
    }

    /// Held-out problems `range` and their prompt tokens.
    fn heldout_batch(
        &self,
        range: std::ops::Range<usize>,
    ) -> Result<(Vec<Problem>, Vec<Vec<u32>>), SetupError> {
        let problems: Vec<_> = range.map(|i| self.task.heldout_problem(i as u64)).collect();
        let prompts = problems
            .iter()
            .map(|p| self.prompt_tokens(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((problems, prompts))
    }

    /// pass@k on the first `eval_size` held-out problems: the share with at
    /// least one correct answer among `k` samples at the rollout's sampling
    /// settings. Its random stream is a function of (seed, step), so a resumed
    /// run evaluates as an uninterrupted one does.
    pub fn evaluate_pass_at_k(&self, k: usize, step: u64) -> Result<f64, SetupError> {
        let n = self.cfg.run.eval_size.min(self.task.heldout_size());
        if n == 0 || k == 0 {
            return Ok(0.0);
        }
        let gen = self.gen_config(self.cfg.rollout.sampling());
        let mut solved = 0usize;
        let mut rng = stream(self.cfg.run.seed, PASS_AT_K_STREAM, step);
        // Batches of about 64 sequences, as the greedy evaluation.
        let per = (64 / k).max(1);
        for start in (0..n).step_by(per) {
            let (problems, prompts) = self.heldout_batch(start..(start + per).min(n))?;
            let (samples, _) = self.rollout(&prompts, k, &gen, &mut rng)?;
            let mut any = vec![false; problems.len()];
            for s in &samples {
                let v = self
                    .task
                    .verify(&problems[s.prompt_index], &self.response_text(&s.tokens));
                any[s.prompt_index] |= v.correct;
            }
            solved += any.iter().filter(|a| **a).count();
        }
        Ok(solved as f64 / n as f64)
    }

    pub(super) fn rl_step(&mut self) -> Result<StepMetrics, SetupError> {
        let t0 = Instant::now();
        let step = self.progress.rl_steps_done;
        // Position in the problem stream (moved on by skip-batch remedies).
        let pos = step + self.progress.data_offset;
        let (np, g) = (
            self.cfg.rollout.prompts_per_step,
            self.cfg.rollout.group_size,
        );
        let temperature = self.cfg.rollout.temperature;

        // 1-2. Quantize once; roll out.
        let problems: Vec<_> = (0..np as u64)
            .map(|i| self.task.train_problem(pos * np as u64 + i))
            .collect();
        let prompts = problems
            .iter()
            .map(|p| self.prompt_tokens(p))
            .collect::<Result<Vec<_>, _>>()?;
        let mut rng = stream(self.cfg.run.seed, ROLLOUT_STREAM, pos);
        let (samples, kv) = self.rollout(
            &prompts,
            g,
            &self.gen_config(self.cfg.rollout.sampling()),
            &mut rng,
        )?;
        let rollout_s = t0.elapsed().as_secs_f64();
        let gen_tokens: usize = samples.iter().map(|s| s.tokens.len()).sum();

        // 3. Rewards and advantages.
        let t1 = Instant::now();
        let mut rewards = Vec::with_capacity(samples.len());
        let mut correct = Vec::with_capacity(samples.len());
        for s in &samples {
            let v = self
                .task
                .verify(&problems[s.prompt_index], &self.response_text(&s.tokens));
            correct.push(v.correct);
            rewards.push(reward(v, &self.cfg.reward));
        }
        let n_correct = correct.iter().filter(|&&c| c).count();
        let (adv, zero_std) = group_advantages(&rewards, g, self.cfg.train.scale_adv_by_std);
        let seqs = TrainSeq::of_samples(&prompts, &samples);
        let rollout_lp: Vec<Vec<f64>> = samples
            .iter()
            .map(|s| s.logprobs.iter().map(|&x| x as f64).collect())
            .collect();
        let n_resp: usize = seqs.iter().map(|s| s.response_len()).sum();

        // Reference logprobs for the KL penalty.
        let ref_lp = match self.reference.is_some() {
            true => Some(
                self.pass(Which::Reference, &seqs, temperature, None)?
                    .0
                    .wait()?
                    .logp,
            ),
            false => None,
        };

        // 4. Train. With one mini-batch, the forward at the rollout weights is
        // also the gradient pass (ratio 1); with more, it is a separate pass and
        // later mini-batches see the ratio move.
        let lc = self.loss_config();
        let mb = self.cfg.train.mini_batches;
        let mut total_tokens = 0usize;
        let mut old: Option<Scored> = None;
        if mb > 1 {
            old = Some(
                self.pass(Which::Policy, &seqs, temperature, None)?
                    .0
                    .wait()?,
            );
            total_tokens += seqs.iter().map(|s| s.tokens.len()).sum::<usize>();
        }
        // The loss's statistics over every mini-batch, token after token.
        let mut stats = LossStats::default();
        let (mut grad_norm, mut lr) = (0.0, 0.0);
        let mut first: Option<Scored> = None;
        let per = seqs.len().div_ceil(mb);
        let opt_cfg = self.cfg.train.optim();
        for (j, part) in seqs.chunks(per).enumerate() {
            let base = j * per;
            let part_tokens: usize = part.iter().map(|s| s.response_len()).sum();
            // On the GPU the loss runs on the device, with no host round trip
            // inside the pass; on the CPU it is `token_loss` per token as well.
            let pl = PolicyLoss {
                cfg: lc,
                n_tokens: part_tokens.max(1),
                base,
                logp_old: old.as_ref().map(|o| o.logp.as_slice()),
                logp_rollout: &rollout_lp,
                logp_ref: ref_lp.as_deref(),
                advantage: &adv,
            };
            let loss = Some(PassLoss::Policy(pl));
            let (pending, grads) = self.pass(Which::Policy, part, temperature, loss)?;
            total_tokens += part.iter().map(|s| s.tokens.len()).sum::<usize>();
            lr = opt_cfg.lr_at(step * mb as u64 + j as u64, self.rl_total() * mb as u64)
                * self.progress.lr_scale;
            let grads =
                grads.ok_or_else(|| SetupError::Device("the pass returned no gradients".into()))?;
            // Fault injection: this batch "explodes" and poisons the weights.
            let poison =
                self.cfg.debug.inject_nan_at_step == Some(step) && self.progress.data_offset == 0;
            grad_norm = self.apply(grads, &opt_cfg, lr, poison)?;
            // The pass's scores come to the host once the optimizer step is queued
            // behind it (on the GPU, the step's one wait for the host).
            let scored = pending.wait()?;
            stats.add(&scored.terms);
            if poison {
                stats.loss = f64::NAN;
            }
            if j == 0 && mb == 1 {
                first = Some(scored);
            }
        }
        let at_rollout = old.or(first).expect("a pass at the rollout weights");
        let flat = |v: &[Vec<f64>]| v.iter().flatten().copied().collect::<Vec<f64>>();
        let mm = mismatch(&flat(&at_rollout.logp), &flat(&rollout_lp));
        let mm_by_length = by_length(&at_rollout.logp, &rollout_lp, &correct);
        let entropy = flat(&at_rollout.entropy).iter().sum::<f64>() / n_resp.max(1) as f64;
        let train_s = t1.elapsed().as_secs_f64();

        self.progress.rl_steps_done += 1;
        let last = self.progress.rl_steps_done == self.rl_total();
        let heldout = if step.is_multiple_of(self.cfg.run.eval_every) || last {
            Some(self.evaluate()?)
        } else {
            None
        };
        if heldout.is_some() {
            self.last_heldout = heldout;
        }
        let k = self.cfg.run.eval_pass_k;
        let pass_at_k = match (heldout, k) {
            (Some(_), 1..) => Some(self.evaluate_pass_at_k(k, step)?),
            _ => None,
        };
        let n = rewards.len() as f64;
        let rmean = rewards.iter().sum::<f64>() / n;
        let rstd = (rewards.iter().map(|r| (r - rmean).powi(2)).sum::<f64>() / n).sqrt();
        let step_s = t0.elapsed().as_secs_f64();
        Ok(StepMetrics {
            phase: "rl".into(),
            step,
            flow: self.flow.name().into(),
            loss: stats.loss,
            grad_norm,
            lr,
            accuracy: Some(n_correct as f64 / n),
            heldout_accuracy: heldout,
            heldout_pass_at_k: pass_at_k,
            heldout_pass_k: pass_at_k.map(|_| k as u64),
            reward_mean: Some(rmean),
            reward_std: Some(rstd),
            frac_reward_zero_std: Some(zero_std as f64 / np as f64),
            response_len_mean: Some(n_resp as f64 / n),
            entropy: Some(entropy),
            clip_frac: Some(stats.clipped as f64 / n_resp.max(1) as f64),
            kl_ref: self
                .reference
                .is_some()
                .then_some(stats.kl / n_resp.max(1) as f64),
            mismatch_kl: Some(mm.mismatch_kl),
            mismatch_abs_prob_diff_mean: Some(mm.mismatch_abs_prob_diff_mean),
            mismatch_abs_prob_diff_max: Some(mm.mismatch_abs_prob_diff_max),
            token_mult_prob_error: Some(mm.token_mult_prob_error),
            is_ratio_min: Some(mm.is_ratio_min),
            is_ratio_mean: Some(mm.is_ratio_mean),
            is_ratio_max: Some(mm.is_ratio_max),
            mismatch_by_length: mm_by_length,
            rollout_s: Some(rollout_s),
            train_s,
            step_s,
            rollout_tokens_per_s: Some(gen_tokens as f64 / rollout_s.max(1e-9)),
            train_tokens_per_s: total_tokens as f64 / train_s.max(1e-9),
            kv_peak_gib: kv.map(|k| gib(k.peak_bytes)),
            kv_pool_gib: kv.map(|k| gib(k.pool_bytes)),
            rollout_preemptions: kv.map(|k| k.preemptions as u64),
        })
    }
}

/// Bytes as GiB.
fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}
