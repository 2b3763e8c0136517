//! Batched autoregressive generation with a KV cache.
//!
//! All samples of a step are generated together: the prompts are prefilled,
//! then every decode step appends one token to each unfinished sequence.
//! Sequences finish on a stop token (EOS), on a stop string, or at
//! `max_new_tokens`, and drop out of the batch. Sampling draws from one seeded
//! RNG in a fixed order, so a step's rollouts are a function of (weights, seed).

use jet_kernels::GemmRole;
use rand::Rng;
use serde::Serialize;

use super::sampler::{sample, SamplingParams};
use crate::transformer::{decode_step, prefill, PreparedModel};

#[derive(Clone, Debug, PartialEq)]
pub struct GenConfig {
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_token_ids: Vec<u32>,
    pub stop_strings: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    StopToken,
    StopString,
    Length,
}

/// One generated response.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub prompt_index: usize,
    /// Response tokens (the stop token included when it ended the sample).
    pub tokens: Vec<u32>,
    /// Rollout logprob of each response token.
    pub logprobs: Vec<f32>,
    pub finish: Finish,
}

/// Generate `n` samples for each prompt. `decode` turns response tokens into
/// text for stop-string checks (only called when there are stop strings).
pub fn generate(
    model: &PreparedModel,
    prompts: &[Vec<u32>],
    n: usize,
    cfg: &GenConfig,
    decode: &dyn Fn(&[u32]) -> String,
    rng: &mut impl Rng,
) -> Vec<Sample> {
    let vocab = model.cfg.vocab_size;
    let max_pos = model.cfg.max_position_embeddings;
    let mut samples: Vec<Sample> = (0..prompts.len() * n)
        .map(|i| Sample {
            prompt_index: i / n,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            finish: Finish::Length,
        })
        .collect();
    if samples.is_empty() || cfg.max_new_tokens == 0 {
        return samples;
    }
    let seqs: Vec<&[u32]> = samples
        .iter()
        .map(|s| prompts[s.prompt_index].as_slice())
        .collect();
    let (mut cache, mut logits) = prefill(model, &seqs, GemmRole::RolloutForward);
    let mut active: Vec<usize> = (0..samples.len()).collect();
    loop {
        // Sample one token for each active sequence, in order.
        let mut next_active = Vec::with_capacity(active.len());
        let mut next_tokens = Vec::with_capacity(active.len());
        for (r, &s) in active.iter().enumerate() {
            let (tok, lp) = sample(&logits[r * vocab..(r + 1) * vocab], &cfg.sampling, rng);
            let smp = &mut samples[s];
            smp.tokens.push(tok);
            smp.logprobs.push(lp);
            let total = prompts[smp.prompt_index].len() + smp.tokens.len();
            if cfg.stop_token_ids.contains(&tok) {
                smp.finish = Finish::StopToken;
            } else if !cfg.stop_strings.is_empty() && {
                let text = decode(&smp.tokens);
                cfg.stop_strings.iter().any(|st| text.contains(st.as_str()))
            } {
                smp.finish = Finish::StopString;
            } else if smp.tokens.len() >= cfg.max_new_tokens || total >= max_pos {
                smp.finish = Finish::Length;
            } else {
                next_active.push(s);
                next_tokens.push(tok);
                continue;
            }
            cache.release(s);
        }
        if next_active.is_empty() {
            return samples;
        }
        logits = decode_step(
            model,
            &mut cache,
            &next_active,
            &next_tokens,
            GemmRole::RolloutForward,
        );
        active = next_active;
    }
}
