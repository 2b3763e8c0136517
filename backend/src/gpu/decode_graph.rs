//! The decode step as a CUDA graph, one per batch-size bucket: the same
//! kernels as [`super::decode::decode_step`] with the same arguments, captured
//! once per rollout and replayed per token, so the ~35 launches a layer cost
//! one launch of host work instead of each its own.
//!
//! A step of B rows runs the graph of the smallest bucket >= B ([`bucket_of`]);
//! rows B.. are padding (token 0 at position 0 of the cache's scratch slot).
//! Every per-row kernel computes a row from that row alone, and the
//! batch-invariant GEMMs add a row's products in one order whatever the batch,
//! so the padding changes no bit of the real rows. (With `batch_invariant` off,
//! cuBLASLt's order may depend on the bucket, as it depends on the batch.)
//!
//! Per step the host writes five `[bucket]` inputs (tokens, positions, each
//! row's offset into the cache's page table, its length, and the page its new
//! row goes to, which the step writes into the table) into the graph's buffers
//! and launches it; the logits land in the graph's `[bucket, vocab]` buffer. The tokens may
//! instead come from the last draw on the device ([`StepGraph::step_drawn`]):
//! the rollout launches the next step before the host has read this one's.

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::flash::{
    decode_operand_fits, flash_append_decode_dev, flash_append_decode_operand_dev,
    flash_qkv_append_decode_operand_dev, KvAt, PAGE_ROWS,
};
use jet_kernels::cuda::graph::Graph;
use jet_kernels::cuda::linear::{QkvPartials, XOperand};
use jet_kernels::cuda::ops::{check_positions, check_tokens};
use jet_kernels::cuda::pinned::{CopyLane, PinnedIn};
use jet_kernels::cuda::quantize::FusedOperand;
use jet_kernels::cuda::sample::{feed_step, GpuSampled};
use jet_kernels::cuda::{CudaError, Gpu, Result};
use jet_kernels::{GemmPrecision, GemmRole};

use super::decode::{GpuKvCache, KvLayers};
use super::layers::{head_into, run_layers, Attended, AttnSaved, GpuAttention, RowsIn};
use super::model::GpuModel;

/// The bucket a step of `b` rows runs in: 1, 2, 4, 8, then 12, 16, 24, 32, 48,
/// 64, ... (at most a third of a bucket is padding past 8 rows).
pub fn bucket_of(b: usize) -> usize {
    let p = b.max(1).next_power_of_two();
    if b <= 8 || b > p / 4 * 3 {
        p
    } else {
        p / 4 * 3
    }
}

/// The per-step inputs of a captured decode step, `[bucket]` each: rows
/// `0..B` the step's sequences, the rest padding (token 0 at position 0 of the
/// cache's scratch slot, its page the scratch page). All five are staged in one
/// pinned copy, `[5][bucket]`,
/// then copied in by `feed_step` (which may take the tokens from the last
/// draw on the device): one upload a step, enqueued without waiting.
struct StepInputs {
    rows: RowsIn,
    /// Each row's offset into the page table (`slot * max_pages`) and length
    /// after the step: the row's own k and v go to the row of key `len - 1`.
    kv0: CudaSlice<i32>,
    len: CudaSlice<i32>,
    /// Two staged copies taken in turn: one is written (on the compute
    /// stream, or on the copy lane ahead of it) while the last `feed_step`
    /// may still read the other.
    staged: [CudaSlice<i32>; 2],
    staged_in: PinnedIn<i32>,
    turn: usize,
    /// Whether the lane may write a staged buffer without first waiting for
    /// the compute stream: not before it has waited once for the buffers'
    /// allocation (ordered on the compute stream), nor after a write on the
    /// compute stream (staged writes alternate: after a dropped step ahead
    /// and one compute-stream write, the lane's next write is to the buffer
    /// the dropped step's `feed_step` may still read).
    lane_ready: bool,
}

impl StepInputs {
    /// Inputs of `bucket` rows, staged through `spare` when it is one of the
    /// right length (page-locked memory is slow to allocate and to free: a
    /// rollout's graphs hand theirs to the next rollout's, [`StepGraph::into_stage`]).
    fn new(g: &Gpu, bucket: usize, spare: &mut Vec<PinnedIn<i32>>) -> Result<StepInputs> {
        let staged_in = match spare.iter().position(|p| p.len() == 5 * bucket) {
            Some(i) => spare.swap_remove(i),
            None => PinnedIn::new(g, 5 * bucket)?,
        };
        Ok(StepInputs {
            rows: RowsIn {
                tokens: g.zeros(bucket)?,
                positions: g.zeros(bucket)?,
                m: bucket,
            },
            kv0: g.zeros(bucket)?,
            len: g.zeros(bucket)?,
            staged: [g.zeros(5 * bucket)?, g.zeros(5 * bucket)?],
            staged_in,
            turn: 0,
            lane_ready: false,
        })
    }

    /// `[5][bucket]`: `first` (tokens or draw rows, padded with `pad`) then
    /// each of `slots`' position, page-table offset, length after the step and
    /// the page of its new row (checked against the cache and the RoPE table;
    /// taken now where the row opens a page), padded.
    fn staged_values(
        &self,
        model: &GpuModel,
        cache: &mut GpuKvCache,
        slots: &[usize],
        first: Vec<i32>,
        pad: i32,
    ) -> Result<Vec<i32>> {
        let bucket = self.rows.m;
        if slots.len() > bucket || first.len() != slots.len() {
            return Err(CudaError::Invalid(format!(
                "decode: {} rows ({} tokens) for a captured step of {bucket}",
                slots.len(),
                first.len()
            )));
        }
        cache.check_slots(slots)?;
        let positions: Vec<usize> = slots.iter().map(|&s| cache.lens[s]).collect();
        check_positions(&positions, &model.rope)?;
        let pages = cache.grow(slots)?;
        let stride = cache.pages.max_pages();
        let scratch = cache.pages.offset(cache.scratch());
        let padded = |v: Vec<i32>, with: i32| {
            let n = v.len();
            v.into_iter().chain(std::iter::repeat_n(with, bucket - n))
        };
        let pos = positions.iter().map(|&p| p as i32).collect();
        let kv0 = slots.iter().map(|&s| (s * stride) as i32).collect();
        let len = positions.iter().map(|&p| p as i32 + 1).collect();
        let page = pages.iter().map(|&p| p as i32).collect();
        Ok(padded(first, pad)
            .chain(padded(pos, 0))
            .chain(padded(kv0, scratch as i32))
            .chain(padded(len, 1))
            .chain(padded(page, 0))
            .collect())
    }

    /// Write `tokens[i]` appended to sequence `slots[i]` (checked against the
    /// cache, the vocabulary and the RoPE table), padding after them.
    fn write(
        &mut self,
        model: &GpuModel,
        cache: &mut GpuKvCache,
        slots: &[usize],
        tokens: &[u32],
    ) -> Result<()> {
        check_tokens("decode", tokens, model.cfg.vocab_size)?;
        let tok = tokens.iter().map(|&t| t as i32).collect();
        let all = self.staged_values(model, cache, slots, tok, 0)?;
        let g = &*model.gpu;
        self.lane_ready = false;
        self.turn ^= 1;
        let staged = &mut self.staged[self.turn];
        self.staged_in.upload(g.stream(), &all, 0, staged)?;
        self.feed(g, None, cache)
    }

    /// Stage on `lane` the step that appends to sequence `slots[i]` the token
    /// the next draw gives row `keep[i]`; [`StepInputs::feed`] copies it in.
    fn stage_drawn(
        &mut self,
        model: &GpuModel,
        cache: &mut GpuKvCache,
        slots: &[usize],
        keep: &[usize],
        lane: &CopyLane,
    ) -> Result<()> {
        let rows = keep.iter().map(|&r| r as i32).collect();
        let all = self.staged_values(model, cache, slots, rows, -1)?;
        if !self.lane_ready {
            lane.wait_compute(&model.gpu)?;
            self.lane_ready = true;
        }
        self.turn ^= 1;
        lane.upload(&mut self.staged_in, &all, 0, &mut self.staged[self.turn])
    }

    /// Copy the staged step in, its tokens from `drawn` (rows `keep`, as
    /// staged: the compute stream has joined the lane since) or as staged.
    fn feed(
        &mut self,
        g: &Gpu,
        drawn: Option<(&GpuSampled, &[usize])>,
        cache: &mut GpuKvCache,
    ) -> Result<()> {
        let r = &mut self.rows;
        let staged = &self.staged[self.turn];
        let (tok, pos) = (&mut r.tokens, &mut r.positions);
        let pages = (&mut *cache.table, PAGE_ROWS);
        feed_step(
            g,
            drawn,
            staged,
            tok,
            pos,
            &mut self.kv0,
            &mut self.len,
            pages,
        )
    }
}

/// A layer's k and v caches.
type Caches<'a> = (&'a mut CudaSlice<u16>, &'a mut CudaSlice<u16>);

/// One captured decode step of `bucket` rows and the buffers it reads and writes.
pub struct StepGraph {
    graph: Graph,
    pub bucket: usize,
    inputs: StepInputs,
    /// `[bucket, vocab]`: the next-token logits of the last replay.
    pub logits: CudaSlice<f32>,
}

/// The attention of a captured step: cache rows, offsets and lengths on the device.
struct DecodeDev<'a> {
    cache: &'a mut GpuKvCache,
    inputs: &'a StepInputs,
    model: &'a GpuModel<'a>,
}

impl DecodeDev<'_> {
    /// Layer `layer`'s BF16 k and v caches, and where the step's rows' keys lie
    /// in them (their page-table offsets and lengths, and the table).
    fn caches(&mut self, layer: usize) -> Result<(Caches<'_>, KvAt<'_>)> {
        let GpuKvCache { layers, table, .. } = &mut *self.cache;
        let KvLayers::Bf16(l) = layers else {
            return Err(CudaError::Invalid(
                "a captured decode step needs the BF16 cache of the tensor-core attention".into(),
            ));
        };
        let (kc, vc) = &mut l[layer];
        let at = KvAt {
            kv0: &self.inputs.kv0,
            len: &self.inputs.len,
            pages: Some(&**table),
        };
        Ok(((&mut **kc, &mut **vc), at))
    }

    /// `Some(fp8)` where the attention at `prec` makes the o projection's operand
    /// of its output (not in f32; FP8's where a head holds whole 1x128 groups).
    fn operand(&self, prec: GemmPrecision) -> Option<bool> {
        let fp8 = prec == GemmPrecision::Fp8;
        let fits = decode_operand_fits(self.model.attn_shape(), fp8);
        (prec != GemmPrecision::F32 && fits).then_some(fp8)
    }

    /// The attention's output with the operand its launch made.
    fn with_operand(&self, (o, op): (CudaSlice<f32>, FusedOperand)) -> Attended {
        let shape = self.model.attn_shape();
        let b = self.inputs.rows.m;
        (
            o,
            None,
            XOperand::fused(b, shape.n_heads * shape.head_dim, op),
        )
    }
}

impl GpuAttention for DecodeDev<'_> {
    fn attend(
        &mut self,
        layer: usize,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
    ) -> Result<(CudaSlice<f32>, Option<AttnSaved>)> {
        let (g, model, x) = (&*self.model.gpu, self.model, self.inputs);
        // The kernel writes each row's k and v to the row of key len - 1 itself;
        // padding rows all write the scratch page's row 0 with equal values, and
        // each block reads its own copy of that row.
        let (b, shape) = (x.rows.m, model.attn_shape());
        let (cache, at) = self.caches(layer)?;
        let o = flash_append_decode_dev(g, q, (k, v), cache, at, b, shape)?;
        Ok((o, None))
    }

    /// The same launch also makes the o projection's operand of its output.
    fn attend_operand(
        &mut self,
        layer: usize,
        (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
        prec: GemmPrecision,
    ) -> Result<Attended> {
        let Some(fp8) = self.operand(prec) else {
            let (o, saved) = self.attend(layer, q, k, v)?;
            return Ok((o, saved, XOperand::default()));
        };
        let (g, model, x) = (&*self.model.gpu, self.model, self.inputs);
        let (b, shape) = (x.rows.m, model.attn_shape());
        let (cache, at) = self.caches(layer)?;
        let out = flash_append_decode_operand_dev(g, q, (k, v), cache, at, b, shape, fp8)?;
        Ok(self.with_operand(out))
    }

    /// The q, k, v projections' epilogue (their q/k norms and RoPE) inside the
    /// same launch, where it makes the operand.
    fn attend_qkv(
        &mut self,
        layer: usize,
        qkv: &QkvPartials,
        prec: GemmPrecision,
    ) -> Result<Option<Attended>> {
        let Some(fp8) = self.operand(prec) else {
            return Ok(None);
        };
        let (g, model, x) = (&*self.model.gpu, self.model, self.inputs);
        let (b, shape) = (x.rows.m, model.attn_shape());
        let (cache, at) = self.caches(layer)?;
        let out = flash_qkv_append_decode_operand_dev(g, qkv, cache, at, b, shape, fp8)?;
        Ok(Some(self.with_operand(out)))
    }
}

impl StepGraph {
    /// Capture the decode step of `bucket` rows over `cache` (whose buffers it
    /// keeps reading: the graph lives no longer than the cache).
    ///
    /// The capture does not wait for the stream: work queued before it (the
    /// prefill) runs while the host captures.
    /// Its input staging comes from `spare` where one fits.
    pub fn capture(
        model: &GpuModel,
        cache: &mut GpuKvCache,
        bucket: usize,
        spare: &mut Vec<PinnedIn<i32>>,
    ) -> Result<StepGraph> {
        let g = &*model.gpu;
        let vocab = model.cfg.vocab_size;
        let mut inputs = StepInputs::new(g, bucket, spare)?;
        // Until the first step writes them: every row is padding.
        inputs.write(model, cache, &[], &[])?;
        let mut logits = g.zeros::<f32>(bucket * vocab)?;
        let (graph, ()) = g.capture_behind("decode step", || {
            let mut attn = DecodeDev {
                cache,
                inputs: &inputs,
                model,
            };
            let h = run_layers(
                model,
                &inputs.rows,
                GemmRole::RolloutForward,
                &mut attn,
                None,
            )?;
            head_into(model, &h, bucket, GemmRole::RolloutForward, &mut logits)
        })?;
        Ok(StepGraph {
            graph,
            bucket,
            inputs,
            logits,
        })
    }

    /// Append `tokens[i]` to sequence `slots[i]` (at most `bucket` of them) and
    /// replay: afterwards `logits` holds their next-token logits in rows
    /// `0..slots.len()`.
    pub fn step(
        &mut self,
        model: &GpuModel,
        cache: &mut GpuKvCache,
        slots: &[usize],
        tokens: &[u32],
    ) -> Result<()> {
        self.inputs.write(model, cache, slots, tokens)?;
        self.graph.launch(&model.gpu)?;
        Self::commit(cache, slots);
        Ok(())
    }

    /// Stage on `lane` the step that appends to sequence `slots[i]` the token
    /// the next draw gives row `keep[i]`; [`StepGraph::step_drawn`] runs it.
    pub fn stage_drawn(
        &mut self,
        model: &GpuModel,
        cache: &mut GpuKvCache,
        slots: &[usize],
        keep: &[usize],
        lane: &CopyLane,
    ) -> Result<()> {
        self.inputs.stage_drawn(model, cache, slots, keep, lane)
    }

    /// Replay the step staged last, fed from `drawn` (rows `keep`, as staged),
    /// and leave the cache's lengths as they are: the step's k and v rows lie
    /// one past each sequence's length, where nothing reads them until
    /// [`StepGraph::commit`] counts them (a step the host then does not want is
    /// dropped, and the next write of those rows wins).
    pub fn step_drawn(
        &mut self,
        g: &Gpu,
        cache: &mut GpuKvCache,
        drawn: &GpuSampled,
        keep: &[usize],
    ) -> Result<()> {
        self.inputs.feed(g, Some((drawn, keep)), cache)?;
        self.graph.launch(g)
    }

    /// Ready a graph kept from an earlier rollout ([`super::kept`]): the copy
    /// lane waits for the compute stream once before it stages into it again.
    pub fn kept(&mut self) {
        self.inputs.lane_ready = false;
    }

    /// The graph's page-locked input staging, for a later capture to reuse.
    pub fn into_stage(self) -> PinnedIn<i32> {
        self.inputs.staged_in
    }

    /// Count a replayed step's new row in each of `slots`.
    pub fn commit(cache: &mut GpuKvCache, slots: &[usize]) {
        for &s in slots {
            cache.lens[s] += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::bucket_of;

    #[test]
    fn buckets_hold_the_batch_with_at_most_a_third_padding_past_8() {
        let want = [
            (0, 1),
            (1, 1),
            (3, 4),
            (8, 8),
            (9, 12),
            (12, 12),
            (13, 16),
            (17, 24),
            (25, 32),
            (33, 48),
            (64, 64),
            (65, 96),
            (200, 256),
        ];
        for (b, bucket) in want {
            assert_eq!(bucket_of(b), bucket, "bucket of {b}");
        }
        for b in 1..2000 {
            let k = bucket_of(b);
            assert!(k >= b, "bucket {k} < {b}");
            if b > 8 {
                assert!(3 * (k - b) <= k, "bucket {k} of {b}: too much padding");
            }
        }
    }
}
