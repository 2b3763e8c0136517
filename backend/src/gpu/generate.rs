//! The rollout on the GPU: prefill, decode steps and sampling on the device.
//!
//! Decode steps replay a CUDA graph per batch-size bucket (`decode_graph`),
//! when the model runs the tensor-core attention and graphs are on (the
//! default); prefills run eagerly. The first prefill's bucket is captured
//! while the GPU runs that prefill; a bucket the batch shrinks into later is
//! captured at its first step (`JET_EAGER_STEPS` sets how many run launched
//! first), and the graphs are kept for the run's next rollouts (`kept`). Per decode
//! step only the sampled tokens and their logprobs come back to the host (the
//! stop conditions need them). Sampling runs on the device from one u64 seed per
//! row drawn from the run's RNG stream, so a step's rollouts stay a function of
//! (weights, seed): plain draws by inverse CDF over fixed-point masses
//! (`draw_logits`, the masses summed in the log-softmax stats pass); with top-k or
//! top-p, Gumbel-max over each row's kept set (`sample_top`, after the log-softmax
//! rows).
//!
//! While the host reads a step's draw, the next step already runs (`ahead`;
//! plain, greedy and top-k / top-p draws alike): the graph takes each row's
//! drawn token on the device, and the host's turn
//! (the copy back, the stop checks, the next inputs) overlaps it instead of
//! leaving the GPU idle. The host then keeps that step for the rows that went
//! on, or drops it; either way every row's bits are those of the step the
//! host would have launched itself, given batch-invariant GEMMs (the default)
//! (`JET_DECODE_AHEAD=0` turns it off).

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::flash::PAGE_ROWS;
use jet_kernels::cuda::logsoftmax::log_softmax_rows;
use jet_kernels::cuda::pinned::PinnedIn;
use jet_kernels::cuda::sample::{sample_logits_seeded, GpuSampled};
use jet_kernels::cuda::sample_top::sample_top_seeded;
use jet_kernels::cuda::tensor::{div_scalar, gather_rows};
use jet_kernels::cuda::{CudaError, Gpu, Result};
use jet_kernels::GemmRole;
use rand::RngCore;

use std::collections::HashMap;

use super::ahead::{Ahead, DrawStage};
use super::decode::{decode_step, prefill_into, GpuKvCache, KvUse};
use super::decode_graph::{bucket_of, StepGraph};
use super::kept::KeptSteps;
use super::model::GpuModel;
use crate::rollout::engine::Decoder;
use crate::rollout::sampler::SamplingParams;

/// Next-token logits waiting to be sampled: `[rows, vocab]`.
pub(super) enum Pending {
    Owned(CudaSlice<f32>, usize),
    /// A step graph's logits (keyed by its bucket): `slots` the sequences of
    /// its rows, of which rows `keep` (ascending) are wanted, in that order.
    /// A step launched ahead keeps only the rows that went on.
    Graph {
        bucket: usize,
        slots: Vec<usize>,
        keep: Vec<usize>,
    },
}

/// Steps a bucket the batch shrinks into runs launched before it is captured
/// (the first prefill's bucket is captured behind that prefill). A capture
/// costs about two launched steps of host work plus the instantiation; since
/// graphs are kept from one rollout to the next (`kept`), a run pays it once a
/// bucket, so capturing at the first step is the default. Before that, each
/// rollout captured anew and the third step won for few-token responses (the
/// arithmetic run: 8,600-10,800 tokens/s capturing at the first step, 12,900-16,200
/// at the third); with kept graphs, a bucket the batch passed in under three steps
/// was launched step by step in every rollout: capturing at the first, 0.6B
/// rollouts with responses of 1-64 tokens ran 15-20% more tokens/s (8B-4l 2-6%),
/// 1-512 tokens 0-1%, and the arithmetic run's RL rollouts were level (H100,
/// forty-first session).
const EAGER_STEPS: usize = 0;

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

/// Whether decode steps run ahead of the host: `JET_DECODE_AHEAD=0` turns it
/// off (read once), for measuring what it saves.
fn ahead_default() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| jet_kernels::cuda::switch_on("JET_DECODE_AHEAD"))
}

pub struct GpuDecoder<'m, 'w> {
    pub(super) model: &'m GpuModel<'w>,
    /// Captured decode steps by bucket (dropped with the cache they read).
    pub(super) graphs: HashMap<usize, StepGraph>,
    /// Launched steps per bucket so far (captured after [`EAGER_STEPS`]).
    launched: HashMap<usize, usize>,
    use_graphs: bool,
    pub(super) cache: Option<GpuKvCache>,
    /// The last step's logits, then each prefill's since, sampled in order.
    pub(super) logits: Vec<Pending>,
    /// Whether steps may run ahead of the host.
    pub(super) run_ahead: bool,
    /// The step launched ahead of the host, until `step` keeps or drops it.
    pub(super) ahead: Option<Ahead>,
    /// Pinned staging of the step-ahead draws.
    pub(super) stage: Option<DrawStage>,
    /// Pending rows that end at their next draw whatever they draw.
    pub(super) ending: Vec<bool>,
    /// Steps launched ahead and kept, since the decoder was made.
    pub(super) kept_ahead: usize,
    /// Input staging of the last rollout's graphs, for this one's.
    pub(super) spare: Vec<PinnedIn<i32>>,
    /// Bytes the KV cache may take (None: room for every slot at full length).
    kv_bytes: Option<usize>,
    /// Sequences the engine preempted (each `shortfall` above 0 is one).
    preempted: usize,
    /// The last rollout's graphs and cache range, until `reserve` adopts them.
    pub(super) kept: Option<KeptSteps>,
    /// Graphs this decoder captured, and those it took from an earlier rollout.
    captured: usize,
    pub(super) graphs_reused: usize,
}

impl<'m, 'w> GpuDecoder<'m, 'w> {
    /// A decoder that replays decode steps as CUDA graphs where it can.
    pub fn new(model: &'m GpuModel<'w>) -> Self {
        let parked = model.gpu.take_parked::<Parked>();
        let (stage, spare, kept) =
            parked.map_or((None, Vec::new(), None), |p| (p.stage, p.spare, p.kept));
        GpuDecoder {
            model,
            graphs: HashMap::new(),
            launched: HashMap::new(),
            use_graphs: true,
            cache: None,
            logits: Vec::new(),
            run_ahead: ahead_default(),
            ahead: None,
            stage,
            ending: Vec::new(),
            kept_ahead: 0,
            spare,
            kv_bytes: None,
            preempted: 0,
            kept,
            captured: 0,
            graphs_reused: 0,
        }
    }

    /// Decode graphs this decoder captured, and those it adopted from an
    /// earlier rollout's decoder (`kept`: the same model and cache places).
    pub fn graphs_captured(&self) -> (usize, usize) {
        (self.captured, self.graphs_reused)
    }

    /// Sequences preempted for want of free pages (the engine preempts one for
    /// each `shortfall` answer above 0).
    pub fn preemptions(&self) -> usize {
        self.preempted
    }

    /// Bound the KV cache to `bytes` (`rollout.kv_cache_gib`; None: room for
    /// every slot at full length; too few bytes for one sequence is an error at
    /// the first rollout, naming the setting). Under it sequences take pages as they
    /// grow; where a step finds none free, the engine preempts the youngest
    /// sequences and prefills them again later (prompt and response so far: the
    /// same bits as the steps they missed).
    pub fn with_kv_cache_bytes(mut self, bytes: Option<usize>) -> Self {
        self.kv_bytes = bytes;
        self
    }

    /// What the cache holds and held (None before `reserve`).
    pub fn kv_use(&self) -> Option<KvUse> {
        self.cache.as_ref().map(|c| c.kv_use())
    }

    /// Decode steps that ran ahead of the host and were kept (for tests and
    /// logs: with graphs and plain sampling, most steps are).
    pub fn steps_kept_ahead(&self) -> usize {
        self.kept_ahead
    }

    /// Whether a decode step may run while the host reads the last one's draw
    /// (on by default; with batch-invariant GEMMs the samples are the same bits
    /// either way).
    pub fn with_step_ahead(mut self, on: bool) -> Self {
        self.run_ahead = on;
        self
    }

    /// Whether decode steps may run as CUDA graphs (`run.cuda_graphs`); off,
    /// every step launches its kernels one by one (same numbers, more host work).
    pub fn with_graphs(mut self, on: bool) -> Self {
        self.use_graphs = on;
        self
    }

    /// Make the draw stage, or a larger one, where it cannot take draws of
    /// `rows` rows (made at `reserve` for the cache's largest bucket).
    pub(super) fn grow_stage(&mut self, rows: usize) -> Result<()> {
        if self.stage.as_ref().is_none_or(|s| !s.holds(rows)) {
            self.stage = Some(DrawStage::new(&self.model.gpu, rows)?);
        }
        Ok(())
    }

    /// Graphs need the BF16 cache of the tensor-core attention.
    pub(super) fn graphs_apply(&self) -> bool {
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
        self.ahead = None;
        // An earlier generation's cache and graphs become this one's to adopt.
        self.retire()?;
        self.launched.clear();
        let page = GpuKvCache::page_bytes(self.model).max(1);
        let pages = self.kv_bytes.map(|b| b / page);
        let cache = self.adopt(slots, max_len, pages).map_err(|e| match self.kv_bytes {
            Some(b) => CudaError::Invalid(format!(
                "rollout.kv_cache_gib = {:.3} ({} pages of {page} bytes): {e}; one sequence of {max_len} \
                 rows needs at least {:.3} GiB",
                b as f64 / (1u64 << 30) as f64,
                b / page,
                ((max_len.div_ceil(PAGE_ROWS) + 1) * page) as f64 / (1u64 << 30) as f64
            )),
            None => e,
        })?;
        self.cache = Some(cache);
        if self.graphs_apply() && self.run_ahead {
            self.grow_stage(bucket_of(slots))?;
        }
        Ok(())
    }

    fn prefill(&mut self, slots: &[usize], seqs: &[&[u32]]) -> Result<()> {
        // A prefill may refill a slot the step ahead ran: drop the step.
        self.ahead = None;
        let model = self.model;
        let logits = prefill_into(model, self.cache()?, slots, seqs, GemmRole::RolloutForward)?;
        self.logits.push(Pending::Owned(logits, seqs.len()));
        // The generation's first prefill: capture its rows' decode step now,
        // while the GPU runs the prefill (the capture is host work, about 9 ms
        // at 0.6B on an H200, which otherwise leaves the GPU idle), so the
        // first steps need no launched warm-up.
        let bucket = bucket_of(seqs.len());
        if self.graphs_apply() && !self.graphs.contains_key(&bucket) && self.launched.is_empty() {
            let Some(cache) = self.cache.as_mut() else {
                return Err(CudaError::Invalid("prefill before reserve".into()));
            };
            let sg = StepGraph::capture(model, cache, bucket, &mut self.spare)?;
            self.graphs.insert(bucket, sg);
            self.captured += 1;
        }
        Ok(())
    }

    fn ending(&mut self, rows: &[bool]) {
        self.ending = rows.to_vec();
    }

    fn sample(&mut self, p: &SamplingParams, rng: &mut dyn RngCore) -> Result<Vec<(u32, f32)>> {
        // A step ahead not kept by now is stale.
        self.ahead = None;
        let ending = std::mem::take(&mut self.ending);
        let mut pending = std::mem::take(&mut self.logits);
        if self.run_ahead && matches!(pending[..], [Pending::Graph { .. }]) {
            if let Some(Pending::Graph {
                bucket,
                slots,
                keep,
            }) = pending.pop()
            {
                return self.sample_ahead(bucket, &slots, &keep, &ending, p, rng);
            }
        }
        let mut out = Vec::new();
        for pending in pending {
            let (logits, rows, keep) = match pending {
                Pending::Owned(mut l, rows) => {
                    let keep: Vec<usize> = (0..rows).collect();
                    out.extend(sample_block(self.model, &mut l, rows, &keep, p, rng)?);
                    continue;
                }
                Pending::Graph {
                    bucket,
                    slots,
                    keep,
                } => match self.graphs.get_mut(&bucket) {
                    Some(sg) => (&mut sg.logits, slots.len(), keep),
                    None => {
                        return Err(CudaError::Invalid(format!(
                            "the decode graph of bucket {bucket} is gone"
                        )))
                    }
                },
            };
            out.extend(sample_block(self.model, logits, rows, &keep, p, rng)?);
        }
        Ok(out)
    }

    fn release(&mut self, slot: usize) {
        // The pages go back to the pool (a step run ahead that wrote past the
        // sequence's end was queued before any later owner's writes).
        if let Some(c) = self.cache.as_mut() {
            c.forget(slot);
        }
    }

    fn room(&mut self, seqs: &[&[u32]]) -> usize {
        self.cache.as_ref().map_or(seqs.len(), |c| c.room(seqs))
    }

    fn shortfall(&mut self, slots: &[usize]) -> usize {
        let short = self.cache.as_ref().map_or(0, |c| c.shortfall(slots));
        self.preempted += usize::from(short > 0);
        short
    }

    fn step(&mut self, slots: &[usize], tokens: &[u32]) -> Result<()> {
        if self.keep_ahead(slots, tokens) {
            return Ok(());
        }
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
                self.captured += 1;
                e.insert(StepGraph::capture(model, cache, bucket, &mut self.spare)?)
            }
        };
        sg.step(model, cache, slots, tokens)?;
        self.logits.push(Pending::Graph {
            bucket,
            slots: slots.to_vec(),
            keep: (0..slots.len()).collect(),
        });
        Ok(())
    }
}

/// What a decoder hands to the next one through [`jet_kernels::cuda::Gpu::park`]:
/// its page-locked staging (2-3 ms of allocations and frees a rollout otherwise),
/// and its graphs with the range their cache lay in ([`super::kept`]).
struct Parked {
    stage: Option<DrawStage>,
    spare: Vec<PinnedIn<i32>>,
    kept: Option<KeptSteps>,
}

impl Drop for GpuDecoder<'_, '_> {
    fn drop(&mut self) {
        // Retiring takes the cache and its graphs; a cache that cannot be
        // retired (its stream failed) is dropped, its graphs' staging kept,
        // and the next decoder makes its own.
        let _ = self.retire();
        let spare = std::mem::take(&mut self.spare);
        let stage = self.stage.take();
        let kept = self.kept.take();
        self.model.gpu.park(Parked { stage, spare, kept });
    }
}

impl GpuDecoder<'_, '_> {
    /// Before a replay of `bucket`'s graph overwrites its logits, copy out any
    /// of them still waiting to be sampled.
    fn keep_pending(&mut self, bucket: usize) -> Result<()> {
        let vocab = self.model.cfg.vocab_size;
        for p in self.logits.iter_mut() {
            if let Pending::Graph {
                bucket: b, keep, ..
            } = p
            {
                if *b == bucket {
                    // The wanted rows, in order, as a block of their own.
                    let own = gather_rows(&self.model.gpu, &self.graphs[b].logits, vocab, keep)?;
                    *p = Pending::Owned(own, keep.len());
                }
            }
        }
        Ok(())
    }
}

/// Sample rows `keep` (ascending) of one block of logits `[rows, vocab]` (the
/// first rows of `logits`), in order; the other rows are drawn and dropped (a
/// step ahead's rows that did not go on), and take no seed from `rng`.
pub(super) fn sample_block(
    model: &GpuModel,
    logits: &mut CudaSlice<f32>,
    rows: usize,
    keep: &[usize],
    p: &SamplingParams,
    rng: &mut dyn RngCore,
) -> Result<Vec<(u32, f32)>> {
    if rows == 0 {
        return Ok(vec![]);
    }
    let g = &*model.gpu;
    let vocab = model.cfg.vocab_size;
    temper(g, logits, rows * vocab, p)?;
    let seeds = spread_seeds(rows, keep, rng);
    // Greedy rows never read their seed: no upload.
    let dseeds = match p.temperature <= 0.0 {
        true => None,
        false => Some(g.upload(&seeds)?),
    };
    let all = draw_tempered(g, logits, rows, vocab, p, dseeds.as_ref())?.download(g)?;
    Ok(keep.iter().map(|&r| all[r]).collect())
}

/// The draws of tempered `logits [rows, vocab]` with one seed a row already on
/// the device (`seeds [>= rows]`; `None` only for greedy draws): the inverse-CDF
/// draw (`sample_logits_seeded`), or with top-k / top-p each log-softmax row's kept
/// set and its draw (`sample_top_seeded`). [`sample_block`] and the steps run
/// ahead of the host (`ahead.rs`) both draw through it.
pub(super) fn draw_tempered(
    g: &Gpu,
    logits: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
    p: &SamplingParams,
    seeds: Option<&CudaSlice<u64>>,
) -> Result<GpuSampled> {
    if p.untruncated() {
        return sample_logits_seeded(g, logits, rows, vocab, seeds);
    }
    let seeds = seeds.ok_or_else(|| {
        CudaError::Invalid("a top-k / top-p draw needs one seed a row on the device".into())
    })?;
    let lp = log_softmax_rows(g, logits, rows, vocab)?;
    sample_top_seeded(g, &lp, rows, vocab, seeds, p.top_k, p.top_p)
}

/// Divide the first `n` logits by the sampling temperature in place (none at
/// 1, nor for greedy draws).
pub(super) fn temper(
    g: &Gpu,
    logits: &mut CudaSlice<f32>,
    n: usize,
    p: &SamplingParams,
) -> Result<()> {
    if p.temperature > 0.0 && p.temperature != 1.0 {
        div_scalar(g, logits, n, p.temperature as f32)?;
    }
    Ok(())
}

/// One seed a row: the wanted rows `keep` take the next seeds of `rng` in
/// order (as many as a block of only them would), the others 0.
pub(super) fn spread_seeds(rows: usize, keep: &[usize], rng: &mut dyn RngCore) -> Vec<u64> {
    let mut seeds = vec![0; rows];
    for &r in keep {
        seeds[r] = rng.next_u64();
    }
    seeds
}

#[cfg(test)]
mod tests {
    use rand::{RngCore, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::spread_seeds;

    /// The kept rows take the seeds a block of only them would, in order, and
    /// the dropped rows take none from the stream.
    #[test]
    fn kept_rows_take_the_seeds_of_a_block_of_only_them() {
        let mut a = ChaCha8Rng::seed_from_u64(7);
        let mut b = ChaCha8Rng::seed_from_u64(7);
        let seeds = spread_seeds(6, &[1, 2, 5], &mut a);
        let alone: Vec<u64> = (0..3).map(|_| b.next_u64()).collect();
        assert_eq!(seeds, vec![0, alone[0], alone[1], 0, 0, alone[2]]);
        assert_eq!(a.next_u64(), b.next_u64(), "the streams stay in step");
    }
}
