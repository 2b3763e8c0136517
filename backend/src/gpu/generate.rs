//! The rollout on the GPU: prefill, decode steps and sampling on the device.
//!
//! Decode steps replay a CUDA graph per batch-size bucket (`decode_graph`),
//! captured at the bucket's third step (`JET_EAGER_STEPS` sets how many run
//! launched first), when the model runs the tensor-core
//! attention and graphs are on (the default); prefills run eagerly. Per decode
//! step only the sampled tokens and their logprobs come back to the host (the
//! stop conditions need them). Plain tempered sampling and greedy run on the
//! device (Gumbel-max from one u64 seed per row drawn from the run's RNG stream,
//! so a step's rollouts stay a function of (weights, seed)); top-k and top-p
//! bring the log-probability rows to the host and use the CPU sampler.

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::logsoftmax::log_softmax_rows;
use jet_kernels::cuda::sample::sample_logits;
use jet_kernels::cuda::tensor::div_scalar;
use jet_kernels::cuda::{CudaError, Result};
use jet_kernels::GemmRole;
use rand::RngCore;

use std::collections::HashMap;

use super::decode::{decode_step, prefill_into, GpuKvCache};
use super::decode_graph::{bucket_of, StepGraph};
use super::model::GpuModel;
use crate::rollout::engine::Decoder;
use crate::rollout::sampler::{sample_logprobs, SamplingParams};

/// Next-token logits waiting to be sampled: `[rows, vocab]`.
enum Pending {
    Owned(CudaSlice<f32>, usize),
    /// The first rows of a step graph's logits (keyed by its bucket).
    Graph(usize, usize),
}

/// Steps a bucket runs launched before it is captured: a capture costs about
/// two launched steps of host work plus the instantiation, which the short
/// rollouts of many RL tasks (a few tokens a response, the batch shrinking
/// through a bucket a step or two) do not win back (the arithmetic task's real
/// run: 8,600-10,800 tokens/s capturing at the first step, 12,900-16,200 at the
/// third). Long responses gain from capturing at once (0.6B, H100, 128-token
/// prompts: random lengths 1-128 +2-24% tokens/s, 128 tokens +0-2.5%; 2-token
/// responses 1-19% slower): `JET_EAGER_STEPS=0` for such workloads.
const EAGER_STEPS: usize = 2;

/// [`EAGER_STEPS`], or `JET_EAGER_STEPS` (read once; a value that is not a
/// whole number is named on stderr and the default kept).
fn eager_steps() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| match std::env::var("JET_EAGER_STEPS") {
        Err(_) => EAGER_STEPS,
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            eprintln!("JET_EAGER_STEPS={v:?} is not a whole number of steps; using {EAGER_STEPS}");
            EAGER_STEPS
        }),
    })
}

pub struct GpuDecoder<'m, 'w> {
    model: &'m GpuModel<'w>,
    /// Captured decode steps by bucket (dropped with the cache they read).
    graphs: HashMap<usize, StepGraph>,
    /// Launched steps per bucket so far (captured after [`EAGER_STEPS`]).
    launched: HashMap<usize, usize>,
    use_graphs: bool,
    cache: Option<GpuKvCache>,
    /// The last step's logits, then each prefill's since, sampled in order.
    logits: Vec<Pending>,
}

impl<'m, 'w> GpuDecoder<'m, 'w> {
    /// A decoder that replays decode steps as CUDA graphs where it can.
    pub fn new(model: &'m GpuModel<'w>) -> Self {
        GpuDecoder {
            model,
            graphs: HashMap::new(),
            launched: HashMap::new(),
            use_graphs: true,
            cache: None,
            logits: Vec::new(),
        }
    }

    /// Whether decode steps may run as CUDA graphs (`run.cuda_graphs`); off,
    /// every step launches its kernels one by one (same numbers, more host work).
    pub fn with_graphs(mut self, on: bool) -> Self {
        self.use_graphs = on;
        self
    }

    /// Graphs need the BF16 cache of the tensor-core attention.
    fn graphs_apply(&self) -> bool {
        self.use_graphs && self.model.flash_attention()
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
        self.graphs.clear();
        self.launched.clear();
        self.cache = Some(GpuKvCache::new(self.model, slots, max_len)?);
        Ok(())
    }

    fn prefill(&mut self, slots: &[usize], seqs: &[&[u32]]) -> Result<()> {
        let model = self.model;
        let logits = prefill_into(model, self.cache()?, slots, seqs, GemmRole::RolloutForward)?;
        self.logits.push(Pending::Owned(logits, seqs.len()));
        Ok(())
    }

    fn sample(&mut self, p: &SamplingParams, rng: &mut dyn RngCore) -> Result<Vec<(u32, f32)>> {
        let mut out = Vec::new();
        for pending in std::mem::take(&mut self.logits) {
            let (logits, rows) = match pending {
                Pending::Owned(mut l, rows) => {
                    out.extend(sample_block(self.model, &mut l, rows, p, rng)?);
                    continue;
                }
                Pending::Graph(bucket, rows) => match self.graphs.get_mut(&bucket) {
                    Some(sg) => (&mut sg.logits, rows),
                    None => {
                        return Err(CudaError::Invalid(format!(
                            "the decode graph of bucket {bucket} is gone"
                        )))
                    }
                },
            };
            out.extend(sample_block(self.model, logits, rows, p, rng)?);
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
        let bucket = bucket_of(slots.len());
        let eager = !self.graphs_apply() || slots.is_empty() || {
            let n = self.launched.entry(bucket).or_insert(0);
            *n += 1;
            *n <= eager_steps() && !self.graphs.contains_key(&bucket)
        };
        if eager {
            let logits = decode_step(
                model,
                self.cache()?,
                slots,
                tokens,
                GemmRole::RolloutForward,
            )?;
            self.logits.push(Pending::Owned(logits, slots.len()));
            return Ok(());
        }
        self.keep_pending(bucket)?;
        let cache = self
            .cache
            .as_mut()
            .ok_or_else(|| CudaError::Invalid("decode step before reserve".into()))?;
        let sg = match self.graphs.entry(bucket) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(StepGraph::capture(model, cache, bucket)?)
            }
        };
        sg.step(model, cache, slots, tokens)?;
        self.logits.push(Pending::Graph(bucket, slots.len()));
        Ok(())
    }
}

impl GpuDecoder<'_, '_> {
    /// Before a replay of `bucket`'s graph overwrites its logits, copy out any
    /// of them still waiting to be sampled.
    fn keep_pending(&mut self, bucket: usize) -> Result<()> {
        let vocab = self.model.cfg.vocab_size;
        for p in self.logits.iter_mut() {
            if let Pending::Graph(b, rows) = *p {
                if b == bucket {
                    let g = &*self.model.gpu;
                    let mut own = g.zeros::<f32>(rows * vocab)?;
                    g.copy_into(&self.graphs[&b].logits, &mut own, rows * vocab)?;
                    *p = Pending::Owned(own, rows);
                }
            }
        }
        Ok(())
    }
}

/// Sample each row of one block of logits `[rows, vocab]` (the first rows of `logits`).
fn sample_block(
    model: &GpuModel,
    logits: &mut CudaSlice<f32>,
    rows: usize,
    p: &SamplingParams,
    mut rng: &mut dyn RngCore,
) -> Result<Vec<(u32, f32)>> {
    let g = &*model.gpu;
    let vocab = model.cfg.vocab_size;
    if p.temperature > 0.0 && p.temperature != 1.0 {
        div_scalar(g, logits, rows * vocab, p.temperature as f32)?;
    }
    if !p.untruncated() {
        let lp = log_softmax_rows(g, logits, rows, vocab)?;
        let host = g.download_n(&lp, rows * vocab)?;
        return Ok(host
            .chunks(vocab)
            .map(|row| sample_logprobs(row, p, &mut rng))
            .collect());
    }
    let seeds: Vec<u64> = (0..rows).map(|_| rng.next_u64()).collect();
    sample_logits(g, logits, rows, vocab, p.temperature <= 0.0, &seeds)?.download(g)
}
