//! Batched autoregressive generation with a KV cache, on any device.
//!
//! A step's samples are generated together, at most `max_batch` at a time: the
//! first ones are prefilled, then every decode step appends one token to each
//! unfinished sequence. Sequences finish on a stop token (EOS), on a stop string,
//! or at `max_new_tokens`, and drop out of the batch; their cache slots take the
//! step's next samples (continuous batching: RL responses end at very different
//! lengths, and the cache holds `max_batch` sequences, not all of them).
//! Sampling draws from one seeded RNG in a fixed order (the rows stepped, then
//! the rows just prefilled), so a step's rollouts are a function of (weights,
//! seed, max_batch). The device does prefill, decode and sampling behind
//! [`Decoder`]; this loop owns the stop conditions and the slots (the only things
//! that need the tokens on the host).

use jet_kernels::cuda::CudaError;
use jet_kernels::GemmRole;
use rand::RngCore;
use serde::Serialize;

use super::sampler::{sample, SamplingParams};
use crate::transformer::{decode_step, prefill_into, KvCache, PreparedModel};

#[derive(Clone, Debug, PartialEq)]
pub struct GenConfig {
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_token_ids: Vec<u32>,
    pub stop_strings: Vec<String>,
    /// Most sequences in the batch at once (0: all of them).
    pub max_batch: usize,
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

/// A device's side of generation. Sequences live in cache slots `0..slots`.
pub trait Decoder {
    /// Make a cache of `slots` sequences of up to `max_len` tokens (prompt plus
    /// response); called once, before the first prefill.
    fn reserve(&mut self, slots: usize, max_len: usize) -> Result<(), CudaError>;
    /// Prefill `seqs` into the free cache slots `slots`; their next-token rows
    /// are sampled after the rows of the last step.
    fn prefill(&mut self, slots: &[usize], seqs: &[&[u32]]) -> Result<(), CudaError>;
    /// Sample the next token of each pending row (the sequences stepped last,
    /// then those prefilled since), in order: (token, logprob under
    /// log_softmax(logits / T)).
    fn sample(
        &mut self,
        p: &SamplingParams,
        rng: &mut dyn RngCore,
    ) -> Result<Vec<(u32, f32)>, CudaError>;
    /// Which pending rows (in [`Decoder::sample`]'s order) end at their next
    /// draw whatever they draw (their length limit); called before each
    /// `sample`. A decoder that launches the next step before the host reads
    /// the draw leaves these rows out of it.
    fn ending(&mut self, _rows: &[bool]) {}
    /// The sequence in `slot` finished: its cache may go.
    fn release(&mut self, slot: usize);
    /// Append `tokens[i]` to the sequence in slot `slots[i]`.
    fn step(&mut self, slots: &[usize], tokens: &[u32]) -> Result<(), CudaError>;
}

/// The CPU reference decoder.
pub struct CpuDecoder<'m, 'w> {
    model: &'m PreparedModel<'w>,
    cache: Option<KvCache>,
    /// Pending rows' logits `[rows, vocab]`.
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

    fn cache(&mut self) -> Result<&mut KvCache, CudaError> {
        self.cache
            .as_mut()
            .ok_or_else(|| CudaError::Invalid("prefill or decode step before reserve".into()))
    }
}

impl Decoder for CpuDecoder<'_, '_> {
    fn reserve(&mut self, slots: usize, _max_len: usize) -> Result<(), CudaError> {
        self.logits.clear();
        self.cache = Some(KvCache::with_slots(self.model, slots));
        Ok(())
    }
    fn prefill(&mut self, slots: &[usize], seqs: &[&[u32]]) -> Result<(), CudaError> {
        let model = self.model;
        let l = prefill_into(model, self.cache()?, slots, seqs, GemmRole::RolloutForward);
        self.logits.extend_from_slice(&l);
        Ok(())
    }
    fn sample(
        &mut self,
        p: &SamplingParams,
        mut rng: &mut dyn RngCore,
    ) -> Result<Vec<(u32, f32)>, CudaError> {
        let vocab = self.model.cfg.vocab_size;
        let rows = std::mem::take(&mut self.logits);
        Ok(rows
            .chunks(vocab)
            .map(|row| sample(row, p, &mut rng))
            .collect())
    }
    fn release(&mut self, slot: usize) {
        if let Some(c) = self.cache.as_mut() {
            c.release(slot);
        }
    }
    fn step(&mut self, slots: &[usize], tokens: &[u32]) -> Result<(), CudaError> {
        let model = self.model;
        let l = decode_step(
            model,
            self.cache()?,
            slots,
            tokens,
            GemmRole::RolloutForward,
        );
        self.logits.extend_from_slice(&l);
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
    let total = samples.len();
    let slots = match cfg.max_batch {
        0 => total,
        b => b.min(total),
    };
    let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    dec.reserve(slots, (longest + cfg.max_new_tokens).min(max_pos))?;
    let mut sl = Slots {
        free: (0..slots).rev().collect(),
        next: 0,
        slot_of: vec![usize::MAX; total],
    };
    // The samples whose next token is pending, in the decoder's row order.
    let mut rows = Vec::new();
    sl.admit(dec, prompts, &samples, &mut rows)?;
    loop {
        // One token for each pending row, in order.
        let ending: Vec<bool> = rows
            .iter()
            .map(|&s| {
                let smp = &samples[s];
                let total = prompts[smp.prompt_index].len() + smp.tokens.len() + 1;
                smp.tokens.len() + 1 >= cfg.max_new_tokens || total >= max_pos
            })
            .collect();
        dec.ending(&ending);
        let drawn = dec.sample(&cfg.sampling, rng)?;
        if drawn.len() != rows.len() {
            return Err(CudaError::Invalid(format!(
                "the decoder sampled {} rows for {} sequences",
                drawn.len(),
                rows.len()
            )));
        }
        let mut next_rows = Vec::with_capacity(rows.len());
        let mut next_tokens = Vec::with_capacity(rows.len());
        for (&s, &(tok, lp)) in rows.iter().zip(&drawn) {
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
                next_rows.push(s);
                next_tokens.push(tok);
                continue;
            }
            dec.release(sl.slot_of[s]);
            sl.free.push(sl.slot_of[s]);
        }
        if !next_rows.is_empty() {
            let at: Vec<usize> = next_rows.iter().map(|&s| sl.slot_of[s]).collect();
            dec.step(&at, &next_tokens)?;
        }
        rows = next_rows;
        // Admit when an eighth of the slots are free (or nothing is left to
        // step): each prefill is a forward pass of its own, a weight read, so
        // one or two prompts a step would double the rollout's weight traffic.
        if rows.is_empty() || sl.free.len() >= slots.div_ceil(8) {
            sl.admit(dec, prompts, &samples, &mut rows)?;
        }
        if rows.is_empty() {
            return Ok(samples);
        }
    }
}

/// The cache slots of one generation.
struct Slots {
    /// Free slots, taken from the end: 0, 1, ... at the start, then the slot
    /// freed last.
    free: Vec<usize>,
    /// The next sample to admit.
    next: usize,
    /// Each admitted sample's slot.
    slot_of: Vec<usize>,
}

impl Slots {
    /// Prefill the next samples into the free slots; their rows join `rows`.
    fn admit(
        &mut self,
        dec: &mut dyn Decoder,
        prompts: &[Vec<u32>],
        samples: &[Sample],
        rows: &mut Vec<usize>,
    ) -> Result<(), CudaError> {
        let mut new = Vec::new();
        while self.next < samples.len() {
            let Some(slot) = self.free.pop() else { break };
            self.slot_of[self.next] = slot;
            new.push(self.next);
            self.next += 1;
        }
        if new.is_empty() {
            return Ok(());
        }
        let seqs: Vec<&[u32]> = new
            .iter()
            .map(|&s| prompts[samples[s].prompt_index].as_slice())
            .collect();
        let at: Vec<usize> = new.iter().map(|&s| self.slot_of[s]).collect();
        dec.prefill(&at, &seqs)?;
        rows.extend(new);
        Ok(())
    }
}
