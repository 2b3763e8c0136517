//! The KV cache on the GPU and the rollout's prefill and decode steps.
//!
//! One slot per sequence, `capacity` rows each: per layer k and v
//! `[slots, capacity, nkv*hd]`, in BF16 for the tensor-core attention (the values
//! its training forward rounds k, v to) and in f32 for the per-row kernels of the
//! f32 flow. Prefill writes a prompt's rows, each decode step one row per
//! unfinished sequence; finished sequences are not stepped, and their slots take
//! the step's next prompts (continuous batching, `prefill_into`).

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use jet_kernels::cuda::attention::attention_decode_at;
use jet_kernels::cuda::flash::{
    flash_decode_at, flash_scatter_kv16, flash_scatter_rows_dev, CacheRows,
};
use jet_kernels::cuda::tensor::{gather_rows, scatter_rows_dev};
use jet_kernels::cuda::{CudaError, Gpu, Result};
use jet_kernels::GemmRole;

use super::forward::{pack, KvRows, PackedCausal};
use super::layers::{head, run_layers, AttnSaved, GpuAttention, RowsIn};
use super::model::GpuModel;

/// Each layer's k and v caches, in the precision the model's attention reads.
pub(super) enum KvLayers {
    F32(Vec<(CudaSlice<f32>, CudaSlice<f32>)>),
    Bf16(Vec<(CudaSlice<u16>, CudaSlice<u16>)>),
}

impl KvLayers {
    fn new(model: &GpuModel, rows: usize) -> Result<KvLayers> {
        let (g, cfg) = (&*model.gpu, model.cfg);
        let n = rows * cfg.num_key_value_heads * cfg.head_dim;
        let l = cfg.num_hidden_layers;
        fn zeroed<T: DeviceRepr + ValidAsZeroBits>(
            g: &Gpu,
            layers: usize,
            n: usize,
        ) -> Result<Vec<(CudaSlice<T>, CudaSlice<T>)>> {
            (0..layers)
                .map(|_| Ok((g.zeros(n)?, g.zeros(n)?)))
                .collect()
        }
        Ok(match model.flash_attention() {
            true => KvLayers::Bf16(zeroed(g, l, n)?),
            false => KvLayers::F32(zeroed(g, l, n)?),
        })
    }

    /// Write k, v `[rows, kvd]` into cache rows `dev` (checked and uploaded
    /// once for every layer) of `layer`.
    fn write(
        &mut self,
        model: &GpuModel,
        layer: usize,
        kvd: usize,
        dev: &CacheRows,
        kv: KvRows<'_>,
    ) -> Result<()> {
        let g = &*model.gpu;
        match (self, kv) {
            (KvLayers::F32(l), KvRows::F32(k, v)) => {
                let (kc, vc) = &mut l[layer];
                scatter_rows_dev(g, kc, kvd, dev, k)?;
                scatter_rows_dev(g, vc, kvd, dev, v)
            }
            (KvLayers::Bf16(l), KvRows::F32(k, v)) => {
                let (kc, vc) = &mut l[layer];
                dev.fits("k", kc, kvd)?;
                dev.fits("v", vc, kvd)?;
                flash_scatter_rows_dev(g, kc, kvd, dev.idx(), dev.len(), k)?;
                flash_scatter_rows_dev(g, vc, kvd, dev.idx(), dev.len(), v)
            }
            (KvLayers::Bf16(l), KvRows::Bf16(k, v)) => {
                let (kc, vc) = &mut l[layer];
                flash_scatter_kv16(g, (kc, vc), kvd, dev, (k, v))
            }
            (KvLayers::F32(_), KvRows::Bf16(..)) => Err(CudaError::Invalid(
                "an f32 KV cache was handed BF16 k, v (the tensor-core attention's)".into(),
            )),
        }
    }
}

/// `slots` sequences of `capacity` rows, and one scratch slot after them (the
/// padding rows of a captured decode step write and read only that one).
pub struct GpuKvCache {
    pub(super) capacity: usize,
    pub(super) kvd: usize,
    pub(super) layers: KvLayers,
    /// Rows held per sequence slot (the scratch slot is not counted).
    pub(super) lens: Vec<usize>,
}

/// Cache rows of `(slot, position)` pairs: `slot * capacity + position`.
fn cache_rows(capacity: usize, it: impl Iterator<Item = (usize, usize)>) -> Vec<usize> {
    it.map(|(s, p)| s * capacity + p).collect()
}

impl GpuKvCache {
    /// A zeroed cache of `slots` sequences of `capacity` rows each (and the
    /// scratch slot).
    pub fn new(model: &GpuModel, slots: usize, capacity: usize) -> Result<GpuKvCache> {
        let cfg = model.cfg;
        Ok(GpuKvCache {
            capacity,
            kvd: cfg.num_key_value_heads * cfg.head_dim,
            layers: KvLayers::new(model, (slots + 1) * capacity)?,
            lens: vec![0; slots],
        })
    }

    /// Rows of each layer's k (and v) cache: every slot's and the scratch slot's.
    fn rows_held(&self) -> usize {
        (self.lens.len() + 1) * self.capacity
    }

    /// The scratch slot's index.
    pub(super) fn scratch(&self) -> usize {
        self.lens.len()
    }

    /// Check that `slots` can each take one more row of `tokens` (as many).
    pub(super) fn check_step(&self, slots: &[usize], tokens: &[u32]) -> Result<()> {
        if slots.len() != tokens.len() {
            return Err(CudaError::Invalid(format!(
                "decode: {} tokens for {} sequences",
                tokens.len(),
                slots.len()
            )));
        }
        self.check_slots(slots)
    }

    /// [`GpuKvCache::check_step`] without the tokens.
    pub(super) fn check_slots(&self, slots: &[usize]) -> Result<()> {
        match slots
            .iter()
            .find(|&&s| s >= self.lens.len() || self.lens[s] >= self.capacity)
        {
            Some(&s) => Err(CudaError::Invalid(format!(
                "decode: sequence {s} is unknown or its cache of {} rows is full",
                self.capacity
            ))),
            None => Ok(()),
        }
    }

    /// The sequence in `slot` finished: the slot holds nothing.
    pub fn forget(&mut self, slot: usize) {
        if let Some(l) = self.lens.get_mut(slot) {
            *l = 0;
        }
    }
}

/// Run the prompts through the model into a new cache of `capacity` rows per
/// sequence; returns the cache and the logits of each prompt's last position
/// `[B, vocab]`.
pub fn prefill(
    model: &GpuModel,
    prompts: &[&[u32]],
    capacity: usize,
    role: GemmRole,
) -> Result<(GpuKvCache, CudaSlice<f32>)> {
    let mut cache = GpuKvCache::new(model, prompts.len(), capacity)?;
    let slots: Vec<usize> = (0..prompts.len()).collect();
    let logits = prefill_into(model, &mut cache, &slots, prompts, role)?;
    Ok((cache, logits))
}

/// Run the prompts through the model into cache slots `slots` (replacing what
/// they held: a finished sequence's slot takes a new one) and return the logits
/// of each prompt's last position `[B, vocab]`.
pub fn prefill_into(
    model: &GpuModel,
    cache: &mut GpuKvCache,
    slots: &[usize],
    prompts: &[&[u32]],
    role: GemmRole,
) -> Result<CudaSlice<f32>> {
    let g = &*model.gpu;
    let cfg = model.cfg;
    let capacity = cache.capacity;
    if let Some(p) = prompts.iter().find(|p| p.is_empty() || p.len() > capacity) {
        return Err(CudaError::Invalid(format!(
            "prefill: a prompt of {} tokens does not fit a cache of {capacity} rows",
            p.len()
        )));
    }
    if slots.len() != prompts.len() || slots.iter().any(|&s| s >= cache.lens.len()) {
        return Err(CudaError::Invalid(format!(
            "prefill: {} prompts for slots {slots:?} of a cache of {} slots",
            prompts.len(),
            cache.lens.len()
        )));
    }
    let n = prompts.len();
    let (tokens, seq_lens, positions) = pack(prompts);
    let rows = cache_rows(
        capacity,
        seq_lens
            .iter()
            .zip(slots)
            .flat_map(|(&l, &s)| (0..l).map(move |p| (s, p))),
    );
    let kvd = cache.kvd;
    // Checked and uploaded once for every layer.
    let dev = CacheRows::new(g, &rows, cache.rows_held())?;
    let layers = &mut cache.layers;
    let mut keep =
        |layer: usize, kv: KvRows<'_>| -> Result<()> { layers.write(model, layer, kvd, &dev, kv) };
    let rows_in = RowsIn::upload(model, &tokens, &positions)?;
    let mut attn = PackedCausal::new(model, &seq_lens, false, Some(&mut keep))?;
    let h = run_layers(model, &rows_in, role, &mut attn, None)?;
    // Only each prompt's last row goes through the head.
    let mut last = Vec::with_capacity(n);
    let mut start = 0;
    for &l in &seq_lens {
        last.push(start + l - 1);
        start += l;
    }
    let h_last = gather_rows(g, &h, cfg.hidden_size, &last)?;
    let logits = head(model, &h_last, n, role)?.2;
    for (&s, &l) in slots.iter().zip(&seq_lens) {
        cache.lens[s] = l;
    }
    Ok(logits)
}

struct Decode<'a> {
    cache: &'a mut GpuKvCache,
    slots: &'a [usize],
    model: &'a GpuModel<'a>,
    /// The step's cache rows (checked and uploaded once for every layer) and
    /// each sequence's length after it.
    rows: CacheRows,
    lens: Vec<usize>,
}

impl GpuAttention for Decode<'_> {
    fn attend(
        &mut self,
        layer: usize,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
    ) -> Result<(CudaSlice<f32>, Option<AttnSaved>)> {
        let g = &*self.model.gpu;
        let (c, lens) = (&mut *self.cache, &self.lens);
        c.layers
            .write(self.model, layer, c.kvd, &self.rows, KvRows::F32(k, v))?;
        // The same kernel family as the training forward (see GpuModel::flash_attention).
        let (cap, shape) = (c.capacity, self.model.attn_shape());
        let o = match &c.layers {
            KvLayers::Bf16(l) => {
                flash_decode_at(g, q, &l[layer].0, &l[layer].1, cap, self.slots, lens, shape)?
            }
            KvLayers::F32(l) => {
                attention_decode_at(g, q, &l[layer].0, &l[layer].1, cap, self.slots, lens, shape)?
            }
        };
        Ok((o, None))
    }
}

/// Append `tokens[i]` to sequence `slots[i]` and return their next-token logits
/// `[B, vocab]`.
pub fn decode_step(
    model: &GpuModel,
    cache: &mut GpuKvCache,
    slots: &[usize],
    tokens: &[u32],
    role: GemmRole,
) -> Result<CudaSlice<f32>> {
    cache.check_step(slots, tokens)?;
    let positions: Vec<usize> = slots.iter().map(|&s| cache.lens[s]).collect();
    let rows = cache_rows(
        cache.capacity,
        slots.iter().zip(&positions).map(|(&s, &p)| (s, p)),
    );
    let dev = CacheRows::new(&model.gpu, &rows, cache.rows_held())?;
    let mut attn = Decode {
        lens: positions.iter().map(|p| p + 1).collect(),
        cache,
        slots,
        model,
        rows: dev,
    };
    let rows = RowsIn::upload(model, tokens, &positions)?;
    let h = run_layers(model, &rows, role, &mut attn, None)?;
    for &s in slots {
        cache.lens[s] += 1;
    }
    Ok(head(model, &h, tokens.len(), role)?.2)
}
