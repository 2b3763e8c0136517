//! The rollout on the GPU: prefill, decode steps and sampling on the device.
//!
//! Per decode step only the sampled tokens and their logprobs come back to the
//! host (the stop conditions need them). Plain tempered sampling and greedy run
//! on the device (Gumbel-max from one u64 seed per row drawn from the run's RNG
//! stream, so a step's rollouts stay a function of (weights, seed)); top-k and
//! top-p bring the log-probability rows to the host and use the CPU sampler.

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::logsoftmax::log_softmax_rows;
use jet_kernels::cuda::sample::sample_rows;
use jet_kernels::cuda::tensor::div_scalar;
use jet_kernels::cuda::{CudaError, Result};
use jet_kernels::GemmRole;
use rand::RngCore;

use super::decode::{decode_step, prefill_into, GpuKvCache};
use super::model::GpuModel;
use crate::rollout::engine::Decoder;
use crate::rollout::sampler::{sample_logprobs, SamplingParams};

pub struct GpuDecoder<'m, 'w> {
    model: &'m GpuModel<'w>,
    cache: Option<GpuKvCache>,
    /// Next-token logits of the pending rows: blocks `[rows, vocab]` (the last
    /// step's, then each prefill's since), sampled in order.
    logits: Vec<(CudaSlice<f32>, usize)>,
}

impl<'m, 'w> GpuDecoder<'m, 'w> {
    pub fn new(model: &'m GpuModel<'w>) -> Self {
        GpuDecoder {
            model,
            cache: None,
            logits: Vec::new(),
        }
    }

    fn cache(&mut self) -> Result<&mut GpuKvCache> {
        self.cache
            .as_mut()
            .ok_or_else(|| CudaError::Invalid("prefill or decode step before reserve".into()))
    }
}

impl Decoder for GpuDecoder<'_, '_> {
    fn reserve(&mut self, slots: usize, max_len: usize) -> Result<()> {
        self.logits.clear();
        self.cache = Some(GpuKvCache::new(self.model, slots, max_len)?);
        Ok(())
    }

    fn prefill(&mut self, slots: &[usize], seqs: &[&[u32]]) -> Result<()> {
        let model = self.model;
        let logits = prefill_into(model, self.cache()?, slots, seqs, GemmRole::RolloutForward)?;
        self.logits.push((logits, seqs.len()));
        Ok(())
    }

    fn sample(&mut self, p: &SamplingParams, rng: &mut dyn RngCore) -> Result<Vec<(u32, f32)>> {
        let mut out = Vec::new();
        for (mut logits, rows) in std::mem::take(&mut self.logits) {
            out.extend(self.sample_block(&mut logits, rows, p, rng)?);
        }
        Ok(out)
    }

    fn release(&mut self, slot: usize) {
        // The rows stay (the next prefill into the slot overwrites them); the
        // length goes, so a stray step of a free slot reads nothing stale.
        if let Some(c) = self.cache.as_mut() {
            c.forget(slot);
        }
    }

    fn step(&mut self, slots: &[usize], tokens: &[u32]) -> Result<()> {
        let model = self.model;
        let logits = decode_step(
            model,
            self.cache()?,
            slots,
            tokens,
            GemmRole::RolloutForward,
        )?;
        self.logits.push((logits, slots.len()));
        Ok(())
    }
}

impl GpuDecoder<'_, '_> {
    /// Sample each row of one block of logits `[rows, vocab]`.
    fn sample_block(
        &self,
        logits: &mut CudaSlice<f32>,
        rows: usize,
        p: &SamplingParams,
        mut rng: &mut dyn RngCore,
    ) -> Result<Vec<(u32, f32)>> {
        let g = &*self.model.gpu;
        let vocab = self.model.cfg.vocab_size;
        if p.temperature > 0.0 && p.temperature != 1.0 {
            div_scalar(g, logits, rows * vocab, p.temperature as f32)?;
        }
        let lp = log_softmax_rows(g, logits, rows, vocab)?;
        if !p.untruncated() {
            let host = g.download_n(&lp, rows * vocab)?;
            return Ok(host
                .chunks(vocab)
                .map(|row| sample_logprobs(row, p, &mut rng))
                .collect());
        }
        let seeds: Vec<u64> = (0..rows).map(|_| rng.next_u64()).collect();
        let s = sample_rows(g, &lp, rows, vocab, p.temperature <= 0.0, &seeds)?;
        let toks = g.download_n(&s.tokens, rows)?;
        let logp = g.download_n(&s.logp, rows)?;
        Ok(toks.into_iter().map(|t| t as u32).zip(logp).collect())
    }
}
