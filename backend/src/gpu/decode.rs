//! The KV cache on the GPU and the rollout's prefill and decode steps.
//!
//! A pool of pages of `PAGE_ROWS` rows ([`KvPages`]): per layer k and v
//! `[pages * PAGE_ROWS, nkv*hd]`, in BF16 for the tensor-core attention (the
//! values its training forward rounds k, v to) and in f32 for the per-row kernels
//! of the f32 flow. A sequence slot holds up to `capacity` rows in the pages it
//! took; prefill writes a prompt's rows (a repeated prompt's once, its full pages
//! shared), each decode step one row per unfinished sequence, taking a page when
//! the row opens one; finished sequences give their pages back and their slots
//! take the step's next prompts (continuous batching, `prefill_into`).

use cudarc::driver::{CudaSlice, DeviceRepr};
use jet_kernels::cuda::attention::attention_decode_paged;
use jet_kernels::cuda::flash::{
    flash_decode_paged, flash_scatter_kv16, flash_scatter_rows_dev, CacheRows, PAGE_ROWS,
};
use jet_kernels::cuda::tensor::{gather_rows, scatter_rows_dev};
use jet_kernels::cuda::vmm::{FixedRange, RangeView};
use jet_kernels::cuda::{CudaError, Gpu, Result};
use jet_kernels::GemmRole;

use super::forward::{pack, KvRows, PackedCausal};
use super::kv_pages::{KvPages, Shared};
use super::layers::{head, run_layers, AttnSaved, GpuAttention, RowsIn};
use super::model::GpuModel;

/// Each layer's k and v caches, in the precision the model's attention reads:
/// views of the cache's [`FixedRange`] (see [`KvLayout`]).
pub(super) enum KvLayers {
    F32(Vec<(RangeView<f32>, RangeView<f32>)>),
    Bf16(Vec<(RangeView<u16>, RangeView<u16>)>),
}

/// Where a cache's page table and each layer's k and v lie in its range:
/// the table first, then k and v of layer 0, 1, ... each `rows` rows of
/// `row_bytes`, every part starting at a multiple of `align` (the range's
/// mapping granularity, so that each part is mapped on its own). A range laid
/// out for more (a longer table, more rows) holds a smaller cache at the same
/// addresses, backing only the smaller cache's parts, so a captured decode
/// step made over it stays valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct KvLayout {
    /// Page-table entries (i32).
    pub table: usize,
    pub rows: usize,
    pub row_bytes: usize,
    pub layers: usize,
    pub align: usize,
}

impl KvLayout {
    fn of(model: &GpuModel, table: usize, rows: usize, align: usize) -> KvLayout {
        KvLayout {
            table,
            rows,
            row_bytes: GpuKvCache::row_bytes(model),
            layers: model.cfg.num_hidden_layers,
            align: align.max(256),
        }
    }
    fn round(&self, bytes: usize) -> usize {
        bytes.max(1).div_ceil(self.align) * self.align
    }
    fn table_bytes(&self) -> usize {
        self.round(self.table * 4)
    }
    fn layer_bytes(&self) -> usize {
        self.round(self.rows * self.row_bytes)
    }
    pub fn bytes(&self) -> usize {
        self.table_bytes() + 2 * self.layers * self.layer_bytes()
    }
    /// Byte offset of layer `l`'s k (`v` false) or v.
    fn kv_at(&self, l: usize, v: bool) -> usize {
        self.table_bytes() + (2 * l + usize::from(v)) * self.layer_bytes()
    }
    /// Whether a cache laid out as `need` fits this layout's places.
    pub fn holds(&self, need: &KvLayout) -> bool {
        (self.row_bytes, self.layers, self.align) == (need.row_bytes, need.layers, need.align)
            && need.table <= self.table
            && need.rows <= self.rows
    }
    /// The parts of this layout's range that a cache laid out as `need` uses
    /// (byte offset, length): its table, then each layer's k and v rows.
    fn parts(&self, need: &KvLayout) -> Vec<(usize, usize)> {
        let mut p = vec![(0, need.table_bytes())];
        for l in 0..self.layers {
            for v in [false, true] {
                p.push((self.kv_at(l, v), need.layer_bytes()));
            }
        }
        p
    }
}

impl KvLayers {
    /// `rows` rows a layer in `range`, placed by `at` (a layout that holds them).
    fn new(model: &GpuModel, range: &FixedRange, at: &KvLayout, rows: usize) -> Result<KvLayers> {
        let g = &*model.gpu;
        let n = rows * at.row_bytes;
        fn views<T: DeviceRepr>(
            g: &Gpu,
            range: &FixedRange,
            at: &KvLayout,
            n: usize,
        ) -> Result<Vec<(RangeView<T>, RangeView<T>)>> {
            let e = std::mem::size_of::<T>();
            (0..at.layers)
                .map(|l| {
                    let (k, v) = (at.kv_at(l, false), at.kv_at(l, true));
                    Ok((range.view(g, k, n / e)?, range.view(g, v, n / e)?))
                })
                .collect()
        }
        Ok(match model.flash_attention() {
            true => KvLayers::Bf16(views(g, range, at, n)?),
            false => KvLayers::F32(views(g, range, at, n)?),
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
                flash_scatter_rows_dev(g, kc, kvd, dev, k)?;
                flash_scatter_rows_dev(g, vc, kvd, dev, v)
            }
            (KvLayers::Bf16(l), KvRows::Bf16(k, v)) => {
                let (kc, vc) = &mut l[layer];
                flash_scatter_kv16(g, (&mut **kc, &mut **vc), kvd, dev, (k, v))
            }
            (KvLayers::F32(_), KvRows::Bf16(..)) => Err(CudaError::Invalid(
                "an f32 KV cache was handed BF16 k, v (the tensor-core attention's)".into(),
            )),
        }
    }
}

/// A cache's pages in use at most so far and in the pool (the scratch page
/// aside), and the prompt rows its prefills computed (a repeated prompt's once)
/// and were asked for.
#[derive(Clone, Copy, Debug)]
pub struct KvUse {
    pub pages_peak: usize,
    pub pages: usize,
    pub prefill_rows: usize,
    pub prefill_rows_asked: usize,
}

/// `slots` sequences of up to `capacity` rows each in a pool of pages
/// ([`KvPages`]; the scratch page is what a captured step's padding rows write
/// and read).
pub struct GpuKvCache {
    pub(super) capacity: usize,
    pub(super) kvd: usize,
    pub(super) layers: KvLayers,
    /// Rows held per sequence slot (the scratch slot is not counted).
    pub(super) lens: Vec<usize>,
    /// Which pages each sequence holds, and the device's copy of the table.
    pub(super) pages: KvPages,
    pub(super) table: RangeView<i32>,
    /// Prompt rows the prefills computed, and those they were asked for (the
    /// difference: the rows of repeated prompts, computed once).
    pub(super) prefilled_rows: (usize, usize),
    /// Whether the pool is smaller than every slot at full length.
    bounded: bool,
    /// The device memory the table and the layers' views lie in, and where.
    range: FixedRange,
    layout: KvLayout,
}

impl GpuKvCache {
    /// A zeroed cache of `slots` sequences of `capacity` rows each, in `pages`
    /// pages (None: enough for every slot at full length, so that no sequence
    /// ever waits for a page).
    pub fn new(
        model: &GpuModel,
        slots: usize,
        capacity: usize,
        pages: Option<usize>,
    ) -> Result<GpuKvCache> {
        Self::new_in(model, slots, capacity, pages, None)
    }

    /// [`GpuKvCache::new`] in `kept`'s range (unmapped, from [`GpuKvCache::into_range`])
    /// at its places where its layout holds this cache, else in a new range
    /// (`kept` dropped). [`GpuKvCache::layout`] tells which.
    pub(super) fn new_in(
        model: &GpuModel,
        slots: usize,
        capacity: usize,
        pages: Option<usize>,
        kept: Option<(FixedRange, KvLayout)>,
    ) -> Result<GpuKvCache> {
        let g = &*model.gpu;
        let worst = KvPages::worst_case(slots, capacity);
        let n = pages.map_or(worst, |p| p.min(worst));
        let pages = KvPages::new(slots, capacity, n)?;
        let rows = n * PAGE_ROWS;
        let need = KvLayout::of(model, pages.table().len(), rows, g.range_granularity()?);
        let (mut range, layout) = match kept {
            Some((r, at)) if at.holds(&need) => (r, at),
            _ => (g.reserve_range(need.bytes())?, need),
        };
        range.map(g, &layout.parts(&need))?;
        let mut table = range.view(g, 0, need.table.max(1))?;
        g.write(&mut table, pages.table())?;
        Ok(GpuKvCache {
            capacity,
            kvd: model.cfg.num_key_value_heads * model.cfg.head_dim,
            layers: KvLayers::new(model, &range, &layout, rows)?,
            lens: vec![0; slots],
            pages,
            table,
            prefilled_rows: (0, 0),
            bounded: n < worst,
            range,
            layout,
        })
    }

    /// Where the table and layers lie in the cache's range.
    pub(super) fn layout(&self) -> KvLayout {
        self.layout
    }

    /// The cache's range, its memory given back once `g`'s queued work is done
    /// (the addresses stay reserved for [`GpuKvCache::new_in`]).
    pub(super) fn into_range(self, g: &Gpu) -> Result<(FixedRange, KvLayout)> {
        let GpuKvCache {
            layers,
            table,
            mut range,
            layout,
            ..
        } = self;
        drop((layers, table));
        range.unmap(g)?;
        Ok((range, layout))
    }

    /// Bytes of one cache row of one layer's k (or v): BF16 for the
    /// tensor-core attention, f32 for the per-row kernels.
    fn row_bytes(model: &GpuModel) -> usize {
        let cfg = model.cfg;
        let elem = if model.flash_attention() { 2 } else { 4 };
        cfg.num_key_value_heads * cfg.head_dim * elem
    }

    /// Bytes of one page over every layer's k and v.
    pub fn page_bytes(model: &GpuModel) -> usize {
        PAGE_ROWS * Self::row_bytes(model) * 2 * model.cfg.num_hidden_layers
    }

    /// Rows of each layer's k (and v) cache.
    fn rows_held(&self) -> usize {
        self.pages.pages() * PAGE_ROWS
    }

    /// The scratch slot's index.
    pub(super) fn scratch(&self) -> usize {
        self.lens.len()
    }

    /// The device's page table, brought up to date with the host's (stream-ordered:
    /// work queued before reads the table as it was).
    pub(super) fn sync_table(&mut self, g: &Gpu) -> Result<()> {
        if self.pages.take_dirty() {
            g.write(&mut self.table, self.pages.table())?;
        }
        Ok(())
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

    /// The page each of `slots` writes its next row into, taken now where that
    /// row opens a page.
    pub(super) fn grow(&mut self, slots: &[usize]) -> Result<Vec<u32>> {
        self.check_slots(slots)?;
        slots
            .iter()
            .map(|&s| self.pages.grow(s, self.lens[s]))
            .collect()
    }

    /// Pages a step of `slots` must take beyond the free ones (0: it fits).
    pub fn shortfall(&self, slots: &[usize]) -> usize {
        let rows = slots.iter().filter_map(|&s| Some((s, *self.lens.get(s)?)));
        self.pages.shortfall(rows)
    }

    /// How many of `seqs` (in order) a prefill can take now beside the
    /// sequences held ([`KvPages::admissible`]; all of them where the pool holds
    /// every slot at full length).
    pub fn room(&self, seqs: &[&[u32]]) -> usize {
        if !self.bounded {
            return seqs.len();
        }
        let live: Vec<(usize, usize)> = (0..self.lens.len())
            .filter(|&s| self.lens[s] > 0)
            .map(|s| (s, self.lens[s]))
            .collect();
        self.pages.admissible(&live, seqs)
    }

    /// What the cache holds and held.
    pub fn kv_use(&self) -> KvUse {
        KvUse {
            pages_peak: self.pages.peak(),
            pages: self.pages.pages() - 1,
            prefill_rows: self.prefilled_rows.0,
            prefill_rows_asked: self.prefilled_rows.1,
        }
    }

    /// The sequence in `slot` finished: the slot holds nothing and its pages go
    /// back to the pool (once no other sample of its prompt holds them).
    pub fn forget(&mut self, slot: usize) {
        if let Some(l) = self.lens.get_mut(slot) {
            *l = 0;
            self.pages.release(slot);
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
    let mut cache = GpuKvCache::new(model, prompts.len(), capacity, None)?;
    let slots: Vec<usize> = (0..prompts.len()).collect();
    let logits = prefill_into(model, &mut cache, &slots, prompts, role)?;
    Ok((cache, logits))
}

/// Run the prompts through the model into cache slots `slots` (replacing what
/// they held: a finished sequence's slot takes a new one) and return the logits
/// of each prompt's last position `[B, vocab]`. Equal prompts (a GRPO group's
/// samples) run once: their slots share the prompt's full pages and each takes
/// its own copy of a partly filled last one, and their logits rows are that
/// run's (the same bits: each row of the packed forward depends on its own
/// sequence alone).
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
    let distinct: std::collections::HashSet<&usize> = slots.iter().collect();
    if slots.len() != prompts.len()
        || distinct.len() != slots.len()
        || slots.iter().any(|&s| s >= cache.lens.len())
    {
        return Err(CudaError::Invalid(format!(
            "prefill: {} prompts for slots {slots:?} of a cache of {} slots",
            prompts.len(),
            cache.lens.len()
        )));
    }
    for &s in slots {
        cache.forget(s);
    }
    let n = prompts.len();
    let shared = Shared::of(prompts);
    let firsts: Vec<&[u32]> = shared.groups.iter().map(|grp| prompts[grp[0]]).collect();
    // Pages: each distinct prompt's in its first slot, shared by the others,
    // which take their own copy of a partly filled last page. On a full pool
    // nothing is left half taken.
    let taken = (|| -> Result<()> {
        for grp in &shared.groups {
            let (s0, len) = (slots[grp[0]], prompts[grp[0]].len());
            for pos in (0..len).step_by(PAGE_ROWS) {
                cache.pages.grow(s0, pos)?;
            }
            let full = len / PAGE_ROWS;
            for &i in &grp[1..] {
                cache.pages.share(s0, slots[i], full)?;
                if len % PAGE_ROWS != 0 {
                    cache.pages.grow(slots[i], full * PAGE_ROWS)?;
                }
            }
        }
        Ok(())
    })();
    if let Err(e) = taken {
        for &s in slots {
            cache.forget(s);
        }
        return Err(e);
    }
    let (tokens, seq_lens, positions) = pack(&firsts);
    // Each computed row to its first slot's cache row, and the rows of a partly
    // filled last page to each further slot's own copy.
    let (mut dst, mut src) = (Vec::new(), Vec::new());
    let mut start = 0;
    for (grp, &len) in shared.groups.iter().zip(&seq_lens) {
        let full = len / PAGE_ROWS * PAGE_ROWS;
        for (k, &i) in grp.iter().enumerate() {
            let from = if k == 0 { 0 } else { full };
            for p in from..len {
                dst.push(cache.pages.cache_row(slots[i], p)?);
                src.push(start + p);
            }
        }
        start += len;
    }
    cache.prefilled_rows.0 += start;
    cache.prefilled_rows.1 += prompts.iter().map(|p| p.len()).sum::<usize>();
    let kvd = cache.kvd;
    // Checked and uploaded once for every layer.
    let dev = match shared.groups.len() == n {
        true => CacheRows::new(g, &dst, cache.rows_held())?,
        false => CacheRows::gathered(g, &dst, &src, cache.rows_held())?,
    };
    cache.sync_table(g)?;
    let layers = &mut cache.layers;
    let mut keep =
        |layer: usize, kv: KvRows<'_>| -> Result<()> { layers.write(model, layer, kvd, &dev, kv) };
    let rows_in = RowsIn::upload(model, &tokens, &positions)?;
    let mut attn = PackedCausal::new(model, &seq_lens, false, Some(&mut keep))?;
    let h = run_layers(model, &rows_in, role, &mut attn, None)?;
    // Only each prompt's last row goes through the head, once a distinct prompt.
    let mut last = Vec::with_capacity(firsts.len());
    let mut start = 0;
    for &l in &seq_lens {
        last.push(start + l - 1);
        start += l;
    }
    let h_last = gather_rows(g, &h, cfg.hidden_size, &last)?;
    let logits = head(model, &h_last, firsts.len(), role, None)?.2;
    for (&s, p) in slots.iter().zip(prompts) {
        cache.lens[s] = p.len();
    }
    match firsts.len() == n {
        true => Ok(logits),
        false => gather_rows(g, &logits, cfg.vocab_size, &shared.of),
    }
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
        let (shape, stride) = (self.model.attn_shape(), c.pages.max_pages());
        let table = (&*c.table, stride);
        let o = match &c.layers {
            KvLayers::Bf16(l) => flash_decode_paged(
                g,
                q,
                (&*l[layer].0, &*l[layer].1),
                table,
                self.slots,
                lens,
                shape,
            )?,
            KvLayers::F32(l) => attention_decode_paged(
                g,
                q,
                (&*l[layer].0, &*l[layer].1),
                table,
                self.slots,
                lens,
                shape,
            )?,
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
    cache.grow(slots)?;
    let rows = slots
        .iter()
        .zip(&positions)
        .map(|(&s, &p)| cache.pages.cache_row(s, p))
        .collect::<Result<Vec<usize>>>()?;
    let dev = CacheRows::new(&model.gpu, &rows, cache.rows_held())?;
    cache.sync_table(&model.gpu)?;
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
    Ok(head(model, &h, tokens.len(), role, None)?.2)
}

#[cfg(test)]
mod tests {
    use super::KvLayout;

    /// Every part starts 256-byte aligned, the parts do not overlap, and a
    /// layout holds exactly the caches of its rows and row width that need no
    /// longer a table and no more rows (so a graph over it keeps its places).
    #[test]
    fn kv_layout_places_and_holds() {
        let at = KvLayout {
            table: 37,
            rows: 640,
            row_bytes: 2048,
            layers: 3,
            align: 1 << 21,
        };
        let (t, l) = (at.table_bytes(), at.layer_bytes());
        assert_eq!((t, l), (1 << 21, 1 << 21));
        assert_eq!(at.bytes(), t + 6 * l);
        let fit = |table, rows| KvLayout { table, rows, ..at };
        assert!(at.holds(&at) && at.holds(&fit(10, 64)));
        assert!(!at.holds(&fit(38, 64)) && !at.holds(&fit(37, 641)));
        assert!(!at.holds(&KvLayout {
            row_bytes: 4096,
            ..fit(1, 1)
        }));
        assert!(!at.holds(&KvLayout {
            layers: 4,
            ..fit(1, 1)
        }));
        assert!(!at.holds(&KvLayout {
            align: 256,
            ..fit(1, 1)
        }));
        // A smaller cache's parts: at the layout's places, its own lengths,
        // aligned and apart.
        let big = KvLayout { rows: 4096, ..at };
        let small = KvLayout { rows: 64, ..at };
        let parts = big.parts(&small);
        assert_eq!(parts.len(), 1 + 2 * 3);
        assert_eq!(parts[1], (big.table_bytes(), small.layer_bytes()));
        assert_eq!(parts[2].0, big.table_bytes() + big.layer_bytes());
        assert!(parts
            .iter()
            .all(|&(o, n)| o % at.align == 0 && n % at.align == 0));
        assert!(parts.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0));
        assert_eq!(
            big.parts(&big).last().map(|&(o, n)| o + n),
            Some(big.bytes())
        );
        let odd = KvLayout {
            table: 65,
            rows: 3,
            row_bytes: 100,
            layers: 1,
            align: 256,
        };
        assert_eq!((odd.table_bytes(), odd.layer_bytes()), (512, 512));
    }
}
