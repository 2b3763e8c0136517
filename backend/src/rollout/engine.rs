//! Batched autoregressive generation with a KV cache, on any device.
//!
//! All samples of a step are generated together: the prompts are prefilled,
//! then every decode step appends one token to each unfinished sequence.
//! Sequences finish on a stop token (EOS), on a stop string, or at
//! `max_new_tokens`, and drop out of the batch. Sampling draws from one seeded
//! RNG in a fixed order, so a step's rollouts are a function of (weights, seed).
//! The device does prefill, decode and sampling behind [`Decoder`]; this loop
//! owns the stop conditions (the only thing that needs the tokens on the host).

use jet_kernels::cuda::CudaError;
use jet_kernels::GemmRole;
use rand::RngCore;
use serde::Serialize;

use super::sampler::{sample, SamplingParams};
use crate::transformer::{decode_step, prefill, KvCache, PreparedModel};

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

/// A device's side of generation.
pub trait Decoder {
    /// Prefill the sequences (prompt after prompt); `max_len` is the longest a
    /// sequence can grow (prompt plus response).
    fn prefill(&mut self, seqs: &[&[u32]], max_len: usize) -> Result<(), CudaError>;
    /// Sample the next token of each sequence stepped last (all of them after
    /// prefill), in order: (token, logprob under log_softmax(logits / T)).
    fn sample(
        &mut self,
        p: &SamplingParams,
        rng: &mut dyn RngCore,
    ) -> Result<Vec<(u32, f32)>, CudaError>;
    /// Sequence `seq` finished: its cache may go.
    fn release(&mut self, seq: usize);
    /// Append `tokens[i]` to sequence `seqs[i]`.
    fn step(&mut self, seqs: &[usize], tokens: &[u32]) -> Result<(), CudaError>;
}

/// The CPU reference decoder.
pub struct CpuDecoder<'m, 'w> {
    model: &'m PreparedModel<'w>,
    cache: Option<KvCache>,
    logits: Vec<f32>,
}

impl<'m, 'w> CpuDecoder<'m, 'w> {
    pub fn new(model: &'m PreparedModel<'w>) -> Self {
        CpuDecoder {
            model,
            cache: None,
            logits: Vec::new(),
        }
    }
}

impl Decoder for CpuDecoder<'_, '_> {
    fn prefill(&mut self, seqs: &[&[u32]], _max_len: usize) -> Result<(), CudaError> {
        let (cache, logits) = prefill(self.model, seqs, GemmRole::RolloutForward);
        self.cache = Some(cache);
        self.logits = logits;
        Ok(())
    }
    fn sample(
        &mut self,
        p: &SamplingParams,
        mut rng: &mut dyn RngCore,
    ) -> Result<Vec<(u32, f32)>, CudaError> {
        let vocab = self.model.cfg.vocab_size;
        Ok(self
            .logits
            .chunks(vocab)
            .map(|row| sample(row, p, &mut rng))
            .collect())
    }
    fn release(&mut self, seq: usize) {
        if let Some(c) = self.cache.as_mut() {
            c.release(seq);
        }
    }
    fn step(&mut self, seqs: &[usize], tokens: &[u32]) -> Result<(), CudaError> {
        let cache = self
            .cache
            .as_mut()
            .ok_or_else(|| CudaError::Invalid("decode step before prefill".into()))?;
        self.logits = decode_step(self.model, cache, seqs, tokens, GemmRole::RolloutForward);
        Ok(())
    }
}

/// Generate `n` samples for each prompt on the CPU.
pub fn generate(
    model: &PreparedModel,
    prompts: &[Vec<u32>],
    n: usize,
    cfg: &GenConfig,
    decode: &dyn Fn(&[u32]) -> String,
    rng: &mut dyn RngCore,
) -> Vec<Sample> {
    generate_with(
        &mut CpuDecoder::new(model),
        model.cfg.max_position_embeddings,
        prompts,
        n,
        cfg,
        decode,
        rng,
    )
    .expect("the CPU decoder does not fail")
}

/// Generate `n` samples for each prompt with `dec`. `decode` turns response
/// tokens into text for stop-string checks (only called when there are stop
/// strings); `max_pos` is the model's context length.
pub fn generate_with(
    dec: &mut dyn Decoder,
    max_pos: usize,
    prompts: &[Vec<u32>],
    n: usize,
    cfg: &GenConfig,
    decode: &dyn Fn(&[u32]) -> String,
    rng: &mut dyn RngCore,
) -> Result<Vec<Sample>, CudaError> {
    let mut samples: Vec<Sample> = (0..prompts.len() * n)
        .map(|i| Sample {
            prompt_index: i / n,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            finish: Finish::Length,
        })
        .collect();
    if samples.is_empty() || cfg.max_new_tokens == 0 {
        return Ok(samples);
    }
    let seqs: Vec<&[u32]> = samples
        .iter()
        .map(|s| prompts[s.prompt_index].as_slice())
        .collect();
    let longest = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
    dec.prefill(&seqs, (longest + cfg.max_new_tokens).min(max_pos))?;
    let mut active: Vec<usize> = (0..samples.len()).collect();
    loop {
        // One token for each active sequence, in order.
        let drawn = dec.sample(&cfg.sampling, rng)?;
        let mut next_active = Vec::with_capacity(active.len());
        let mut next_tokens = Vec::with_capacity(active.len());
        for (&s, &(tok, lp)) in active.iter().zip(&drawn) {
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
            dec.release(s);
        }
        if next_active.is_empty() {
            return Ok(samples);
        }
        dec.step(&next_active, &next_tokens)?;
        active = next_active;
    }
}
