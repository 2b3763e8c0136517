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
//! Per step the host writes five `[bucket]` inputs (tokens, positions, cache
//! rows, each row's first cache row and its length) into the graph's buffers
//! and launches it; the logits land in the graph's `[bucket, vocab]` buffer.

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::flash::{flash_decode_dev, flash_scatter_rows_dev};
use jet_kernels::cuda::graph::Graph;
use jet_kernels::cuda::{CudaError, Result};
use jet_kernels::GemmRole;

use super::decode::{GpuKvCache, KvLayers};
use super::layers::{head, run_layers, AttnSaved, GpuAttention, RowsIn};
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

/// One captured decode step of `bucket` rows and the buffers it reads and writes.
pub struct StepGraph {
    graph: Graph,
    pub bucket: usize,
    rows: RowsIn,
    /// Cache row written by each row (`slot * capacity + position`), i64.
    cache_rows: CudaSlice<i64>,
    /// Each row's first cache row (`slot * capacity`) and length after the step.
    kv0: CudaSlice<i32>,
    len: CudaSlice<i32>,
    /// `[bucket, vocab]`: the next-token logits of the last replay.
    pub logits: CudaSlice<f32>,
}

/// The attention of a captured step: cache rows, offsets and lengths on the device.
struct DecodeDev<'a> {
    cache: &'a mut GpuKvCache,
    cache_rows: &'a CudaSlice<i64>,
    kv0: &'a CudaSlice<i32>,
    len: &'a CudaSlice<i32>,
    bucket: usize,
    model: &'a GpuModel<'a>,
}

impl GpuAttention for DecodeDev<'_> {
    fn attend(
        &mut self,
        layer: usize,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
    ) -> Result<(CudaSlice<f32>, Option<AttnSaved>)> {
        let g = &*self.model.gpu;
        let (kvd, b) = (self.cache.kvd, self.bucket);
        let KvLayers::Bf16(l) = &mut self.cache.layers else {
            return Err(CudaError::Invalid(
                "a captured decode step needs the BF16 cache of the tensor-core attention".into(),
            ));
        };
        let (kc, vc) = &mut l[layer];
        // Padding rows all write the scratch slot's row 0 with equal values.
        flash_scatter_rows_dev(g, kc, kvd, self.cache_rows, b, k)?;
        flash_scatter_rows_dev(g, vc, kvd, self.cache_rows, b, v)?;
        let shape = self.model.attn_shape();
        let o = flash_decode_dev(g, q, (kc, vc), (self.kv0, self.len), b, shape)?;
        Ok((o, None))
    }
}

impl StepGraph {
    /// Capture the decode step of `bucket` rows over `cache` (whose buffers it
    /// keeps reading: the graph lives no longer than the cache).
    pub fn capture(model: &GpuModel, cache: &mut GpuKvCache, bucket: usize) -> Result<StepGraph> {
        let g = &*model.gpu;
        let vocab = model.cfg.vocab_size;
        let mut rows = RowsIn {
            tokens: g.zeros(bucket)?,
            positions: g.zeros(bucket)?,
            m: bucket,
        };
        let (mut cache_rows, mut kv0, mut len) = (
            g.zeros::<i64>(bucket)?,
            g.zeros::<i32>(bucket)?,
            g.zeros::<i32>(bucket)?,
        );
        // Until the first step writes them: every row is padding.
        Self::write_padding(
            g,
            cache,
            bucket,
            &mut rows,
            (&mut cache_rows, &mut kv0, &mut len),
        )?;
        let mut logits = g.zeros::<f32>(bucket * vocab)?;
        let (graph, ()) = g.capture("decode step", || {
            let mut attn = DecodeDev {
                cache,
                cache_rows: &cache_rows,
                kv0: &kv0,
                len: &len,
                bucket,
                model,
            };
            let h = run_layers(model, &rows, GemmRole::RolloutForward, &mut attn, None)?;
            let out = head(model, &h, bucket, GemmRole::RolloutForward)?.2;
            g.copy_into(&out, &mut logits, bucket * vocab)
        })?;
        Ok(StepGraph {
            graph,
            bucket,
            rows,
            cache_rows,
            kv0,
            len,
            logits,
        })
    }

    fn write_padding(
        g: &jet_kernels::cuda::Gpu,
        cache: &GpuKvCache,
        bucket: usize,
        rows: &mut RowsIn,
        (cache_rows, kv0, len): (
            &mut CudaSlice<i64>,
            &mut CudaSlice<i32>,
            &mut CudaSlice<i32>,
        ),
    ) -> Result<()> {
        let scratch = (cache.scratch() * cache.capacity) as i64;
        g.write(cache_rows, &vec![scratch; bucket])?;
        g.write(kv0, &vec![scratch as i32; bucket])?;
        g.write(len, &vec![1; bucket])?;
        g.write(&mut rows.tokens, &vec![0; bucket])?;
        g.write(&mut rows.positions, &vec![0; bucket])
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
        cache.check_step(slots, tokens)?;
        let (b, vocab) = (slots.len(), model.cfg.vocab_size);
        if b > self.bucket {
            return Err(CudaError::Invalid(format!(
                "decode: {b} rows for a captured step of {}",
                self.bucket
            )));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(CudaError::Invalid(format!(
                "decode: token {t} is outside the vocabulary of {vocab}"
            )));
        }
        if let Some(&s) = slots
            .iter()
            .find(|&&s| cache.lens[s] >= model.rope.max_positions)
        {
            return Err(CudaError::Invalid(format!(
                "decode: position {} of sequence {s} is beyond the RoPE table's {}",
                cache.lens[s], model.rope.max_positions
            )));
        }
        let (cap, scratch) = (cache.capacity, cache.scratch() * cache.capacity);
        let pad = self.bucket - b;
        let at = |s: usize| (s * cap, cache.lens[s]);
        let tok: Vec<i32> = tokens
            .iter()
            .map(|&t| t as i32)
            .chain(vec![0; pad])
            .collect();
        let pos: Vec<i32> = slots
            .iter()
            .map(|&s| at(s).1 as i32)
            .chain(vec![0; pad])
            .collect();
        let rows: Vec<i64> = slots
            .iter()
            .map(|&s| (at(s).0 + at(s).1) as i64)
            .chain(vec![scratch as i64; pad])
            .collect();
        let kv0: Vec<i32> = slots
            .iter()
            .map(|&s| at(s).0 as i32)
            .chain(vec![scratch as i32; pad])
            .collect();
        let len: Vec<i32> = slots
            .iter()
            .map(|&s| at(s).1 as i32 + 1)
            .chain(vec![1; pad])
            .collect();
        let g = &*model.gpu;
        g.write(&mut self.rows.tokens, &tok)?;
        g.write(&mut self.rows.positions, &pos)?;
        g.write(&mut self.cache_rows, &rows)?;
        g.write(&mut self.kv0, &kv0)?;
        g.write(&mut self.len, &len)?;
        self.graph.launch(g)?;
        for &s in slots {
            cache.lens[s] += 1;
        }
        Ok(())
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
