//! The decode step launched ahead of the host.
//!
//! Without it each token costs the GPU the host's whole turn: the draw comes
//! back, the engine checks the stop conditions, and only then are the next
//! step's inputs written and its graph launched (about 100 us idle a token on
//! an H100 at batch 64, 5% of a 0.6B rollout). Here the draw's copy back is
//! enqueued, then at once the next step, each row fed the token it drew (on
//! the device, `feed_tokens`); the host's turn runs beside that step.
//!
//! The step ahead assumes every row goes on; the host keeps it for the rows
//! that did ([`GpuDecoder::keep_ahead`]: `step` asked for a subsequence of its
//! rows, with the tokens they drew, at the lengths it ran). A row that stopped
//! ran one wasted row into its own released slot, past its length, where
//! nothing reads it. The kept rows' bits are those of a step of only them: each
//! row of the decode graph is computed from that row alone, with batch-invariant
//! GEMMs (the graph's padding already relies on it; with `run.batch_invariant`
//! off, cuBLASLt's order may depend on the bucket, as it does between batches). Their next draw skips the
//! dropped rows' seeds ([`super::generate::spread_seeds`]), so the run's RNG
//! stream is consumed as without it. Rows known to end at this draw (their
//! length limit, [`crate::rollout::engine::Decoder::ending`]) are left out of the step ahead.

use jet_kernels::cuda::pinned::{CopyLane, PinnedIn, PinnedOut};
use jet_kernels::cuda::sample::GpuSampled;
use jet_kernels::cuda::{CudaError, Gpu, Result};
use rand::RngCore;

use cudarc::driver::CudaSlice;

use super::decode_graph::{bucket_of, StepGraph};
use super::generate::{draw_tempered, spread_seeds, temper, GpuDecoder, Pending};
use crate::rollout::sampler::SamplingParams;

/// A step launched before the host asked for it.
pub struct Ahead {
    bucket: usize,
    /// The sequences of its rows, and each one's length when it ran.
    slots: Vec<usize>,
    lens: Vec<usize>,
    /// The token each row was fed.
    tokens: Vec<u32>,
}

/// The copies of the draws a step ahead follows, on a copy lane beside the
/// compute stream: seeds in, draws out.
pub struct DrawStage {
    rows: usize,
    lane: CopyLane,
    seeds_in: PinnedIn<u64>,
    /// Two taken in turn: the lane writes one while a draw may read the other.
    seeds: [CudaSlice<u64>; 2],
    turn: usize,
    out: PinnedOut<i32>,
}

impl DrawStage {
    /// Whether draws of `rows` rows fit.
    pub fn holds(&self, rows: usize) -> bool {
        self.rows >= rows
    }

    /// Made at `reserve` for the cache's largest bucket, or taken from the last
    /// decoder (its allocation waits for the stream).
    pub fn new(g: &Gpu, rows: usize) -> Result<DrawStage> {
        let stage = DrawStage {
            rows,
            lane: CopyLane::new(g)?,
            seeds_in: PinnedIn::new(g, rows)?,
            seeds: [g.zeros(rows)?, g.zeros(rows)?],
            turn: 0,
            out: PinnedOut::new(g, 2 * rows)?,
        };
        // The lane writes the seed buffers: their allocation (ordered on the
        // compute stream) must be done first. (A step graph's staged inputs
        // wait through `lane_ready` instead: a capture does not sync.)
        g.sync()?;
        Ok(stage)
    }
}

impl GpuDecoder<'_, '_> {
    /// Sample the one pending block, a step graph's rows `keep` of `slots`;
    /// before reading the draw, launch the next step of the rows that may go on.
    /// On the compute stream: the draw, then (the step's inputs fed from it)
    /// the step; on the lane, before: the seeds and the step's inputs, after:
    /// the draw's copy back.
    pub(super) fn sample_ahead(
        &mut self,
        bucket: usize,
        slots: &[usize],
        keep: &[usize],
        ending: &[bool],
        p: &SamplingParams,
        rng: &mut dyn RngCore,
    ) -> Result<Vec<(u32, f32)>> {
        let model = self.model;
        let g = &*model.gpu;
        let vocab = model.cfg.vocab_size;
        let rows = slots.len();
        self.grow_stage(rows)?;
        let (Some(stage), Some(cache)) = (self.stage.as_mut(), self.cache.as_mut()) else {
            return Err(CudaError::Invalid("decode step before reserve".into()));
        };

        // The next step: the kept rows not ending here, fed their draws.
        let next: Vec<usize> = match ending.len() == keep.len() {
            true => (0..keep.len()).filter(|&j| !ending[j]).collect(),
            false => (0..keep.len()).collect(),
        };
        let feed: Vec<usize> = next.iter().map(|&j| keep[j]).collect();
        let next_slots: Vec<usize> = feed.iter().map(|&r| slots[r]).collect();
        let nb = bucket_of(next_slots.len());

        // On the lane: the seeds and the next step's inputs.
        let greedy = p.temperature <= 0.0;
        let seeds = spread_seeds(rows, keep, rng);
        stage.turn ^= 1;
        if !greedy {
            let dst = &mut stage.seeds[stage.turn];
            stage.lane.upload(&mut stage.seeds_in, &seeds, 0, dst)?;
        }
        // A step that cannot be staged (a row whose cache is full, no graph
        // for its bucket yet) is not launched ahead: `step` launches it itself
        // and reports what is wrong with it.
        let launch = !next_slots.is_empty()
            && match self.graphs.get_mut(&nb) {
                Some(sg) => sg
                    .stage_drawn(model, cache, &next_slots, &feed, &stage.lane)
                    .is_ok(),
                None => false,
            };
        stage.lane.join(g)?;

        // The draw, its copy back, and the step fed from it.
        let Some(sg) = self.graphs.get_mut(&bucket) else {
            return Err(CudaError::Invalid(format!(
                "the decode graph of bucket {bucket} is gone"
            )));
        };
        temper(g, &mut sg.logits, rows * vocab, p)?;
        // sample_block's draws, with the seeds staged above (none for greedy).
        let dseeds = (!greedy).then_some(&stage.seeds[stage.turn]);
        let drawn = draw_tempered(g, &sg.logits, rows, vocab, p, dseeds)?;
        stage.lane.download(g, drawn.buffer(), &mut stage.out)?;
        let fed = match (launch, self.graphs.get_mut(&nb)) {
            (true, Some(sg)) => sg.step_drawn(g, cache, &drawn, &feed),
            _ => Ok(()),
        };
        // The copy back must be over before `drawn` is freed, even on an error.
        let host = stage.out.wait();
        fed?;
        let all = GpuSampled::unpack(host?, rows)?;
        let out: Vec<(u32, f32)> = keep.iter().map(|&r| all[r]).collect();
        if launch {
            self.ahead = Some(Ahead {
                bucket: nb,
                lens: next_slots.iter().map(|&s| cache.lens[s]).collect(),
                tokens: next.iter().map(|&j| out[j].0).collect(),
                slots: next_slots,
            });
        }
        Ok(out)
    }

    /// Keep the step ahead as the step of `tokens` appended to `slots`, if it
    /// ran them: `slots` a subsequence of its rows, each at the length it ran
    /// and with the token it was fed. Otherwise it is dropped (the caller
    /// launches the step itself; the rows it writes are the ones the dropped
    /// step wrote).
    pub(super) fn keep_ahead(&mut self, slots: &[usize], tokens: &[u32]) -> bool {
        let (Some(a), Some(cache)) = (self.ahead.take(), self.cache.as_mut()) else {
            return false;
        };
        if slots.len() != tokens.len() {
            return false;
        }
        let mut keep = Vec::with_capacity(slots.len());
        let mut from = 0;
        for (&s, &t) in slots.iter().zip(tokens) {
            let Some(i) = a.slots[from..].iter().position(|&x| x == s) else {
                return false;
            };
            let r = from + i;
            if a.tokens[r] != t || cache.lens.get(s) != Some(&a.lens[r]) {
                return false;
            }
            keep.push(r);
            from = r + 1;
        }
        StepGraph::commit(cache, slots);
        self.kept_ahead += 1;
        self.logits.push(Pending::Graph {
            bucket: a.bucket,
            slots: a.slots,
            keep,
        });
        true
    }
}
