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
//! seed, max_batch). A decoder whose cache is smaller than max_batch full-length
//! sequences ([`Decoder::room`], [`Decoder::shortfall`]: the GPU's paged cache
//! under `rollout.kv_cache_gib`) admits only what fits and, where a step would
//! not fit, the youngest sequences are preempted: they give their cache back and
//! are prefilled again later, prompt and response so far, ahead of new samples.
//! Each token's logits are the same bits either way (a prefill's rows and a
//! decode step's are the training forward's); the order of the draws, so the
//! samples drawn, then also depend on the cache's size. The device does prefill,
//! decode and sampling behind [`Decoder`]; this loop owns the stop conditions and
//! the slots (the only things that need the tokens on the host).

use std::borrow::Cow;
use std::collections::VecDeque;

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
    /// The sequence in `slot` finished (or was preempted): its cache may go.
    fn release(&mut self, slot: usize);
    /// How many of `seqs` (the next sequences to prefill, in order) the cache
    /// can take now beside what it holds; the others wait for room. A decoder
    /// whose cache holds every slot at full length takes all (the default).
    fn room(&mut self, seqs: &[&[u32]]) -> usize {
        seqs.len()
    }
    /// Cache pages a step of the sequences in `slots` would need beyond the
    /// free ones: the engine preempts the youngest sequences until it is 0
    /// (the default: never short).
    fn shortfall(&mut self, _slots: &[usize]) -> usize {
        0
    }
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
        waiting: VecDeque::new(),
        admitted: vec![0; total],
        serial: 0,
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
            sl.make_room(dec, &mut next_rows, &mut next_tokens)?;
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
            if !sl.waiting.is_empty() || sl.next < total {
                return Err(CudaError::Invalid(format!(
                    "generation: {} samples wait and the KV cache takes none of them",
                    sl.waiting.len() + total - sl.next
                )));
            }
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
    /// Preempted samples waiting to be prefilled again (prompt and response so
    /// far), oldest admission first; they go before new samples.
    waiting: VecDeque<usize>,
    /// Each sample's admission number (the youngest is preempted first).
    admitted: Vec<u64>,
    serial: u64,
}

impl Slots {
    /// Prefill the waiting samples, then the next ones, into the free slots, as
    /// many as the cache has room for; their rows join `rows`.
    fn admit(
        &mut self,
        dec: &mut dyn Decoder,
        prompts: &[Vec<u32>],
        samples: &[Sample],
        rows: &mut Vec<usize>,
    ) -> Result<(), CudaError> {
        let n = self.free.len();
        let mut cand: Vec<usize> = self.waiting.iter().take(n).copied().collect();
        cand.extend((self.next..samples.len()).take(n - cand.len()));
        if cand.is_empty() {
            return Ok(());
        }
        // A preempted sample runs its prompt and response so far: the same
        // rows (each row of a prefill depends on its own sequence alone), and
        // its next draw reads the logits of its last token.
        let seqs: Vec<Cow<[u32]>> = cand
            .iter()
            .map(|&s| {
                let (p, t) = (&prompts[samples[s].prompt_index], &samples[s].tokens);
                match t.is_empty() {
                    true => Cow::Borrowed(p.as_slice()),
                    false => Cow::Owned(p.iter().chain(t).copied().collect()),
                }
            })
            .collect();
        let seqs: Vec<&[u32]> = seqs.iter().map(|c| c.as_ref()).collect();
        let k = dec.room(&seqs).min(cand.len());
        if k == 0 {
            return Ok(());
        }
        let mut at = Vec::with_capacity(k);
        for &s in &cand[..k] {
            // A preempted sample keeps its first admission's place: it is the
            // older for it, so the newer go first if the cache runs short again.
            match self.waiting.front() == Some(&s) {
                true => drop(self.waiting.pop_front()),
                false => {
                    self.next += 1;
                    self.admitted[s] = self.serial;
                    self.serial += 1;
                }
            }
            let slot = self.free.pop().expect("a free slot for each candidate");
            self.slot_of[s] = slot;
            at.push(slot);
        }
        dec.prefill(&at, &seqs[..k])?;
        rows.extend_from_slice(&cand[..k]);
        Ok(())
    }

    /// Preempt the youngest of `rows` (with their `tokens`) until the cache
    /// holds the step of the others: each goes back to its slot's pool and
    /// waits, its last draw kept (the re-prefill runs it).
    fn make_room(
        &mut self,
        dec: &mut dyn Decoder,
        rows: &mut Vec<usize>,
        tokens: &mut Vec<u32>,
    ) -> Result<(), CudaError> {
        loop {
            let at: Vec<usize> = rows.iter().map(|&s| self.slot_of[s]).collect();
            if dec.shortfall(&at) == 0 {
                return Ok(());
            }
            if rows.len() <= 1 {
                return Err(CudaError::Invalid(
                    "generation: the KV cache cannot hold the step of one sequence".into(),
                ));
            }
            let j = (0..rows.len())
                .max_by_key(|&j| self.admitted[rows[j]])
                .expect("rows is not empty");
            let s = rows.remove(j);
            tokens.remove(j);
            dec.release(self.slot_of[s]);
            self.free.push(self.slot_of[s]);
            let pos = self
                .waiting
                .partition_point(|&w| self.admitted[w] < self.admitted[s]);
            self.waiting.insert(pos, s);
        }
    }
}
