//! The pages of the GPU's KV cache, on the host: which cache rows each sequence
//! holds.
//!
//! The cache is a pool of pages of [`PAGE_ROWS`] rows (one decode key tile, so a
//! tile is a page and paging moves where a tile is read, not what is read). A
//! sequence holds a list of pages, takes one more each time it grows past the
//! last, and gives them back when it finishes or is preempted. Page 0 is the
//! scratch page that a captured step's padding rows write and read; no sequence
//! holds it. The samples of one prompt share its full pages (reference counts);
//! each takes its own copy of a partly filled last page, where it appends its
//! own rows. The table `[slots + 1][max_pages]` maps page j of the sequence in a
//! slot to its page (the device's copy is what the decode kernels read; entries
//! a sequence does not hold name the scratch page); the last row is the scratch
//! slot's.

use std::collections::HashMap;

use jet_kernels::cuda::flash::PAGE_ROWS;
use jet_kernels::cuda::{CudaError, Result};

pub struct KvPages {
    /// Pages a sequence may hold: the table's row length.
    max_pages: usize,
    /// Free pages, taken from the end (never page 0).
    free: Vec<u32>,
    /// Holders of each page.
    refs: Vec<u32>,
    /// Each slot's pages in order (the scratch slot, last, holds none).
    held: Vec<Vec<u32>>,
    table: Vec<i32>,
    /// The table changed since [`KvPages::take_dirty`] last said so.
    dirty: bool,
    /// Most pages in use at once.
    peak: usize,
}

/// Pages of `len` rows.
pub fn pages_of(len: usize) -> usize {
    len.div_ceil(PAGE_ROWS)
}

impl KvPages {
    /// Pages enough for `slots` sequences of `max_len` rows each, and the scratch page.
    pub fn worst_case(slots: usize, max_len: usize) -> usize {
        slots * pages_of(max_len) + 1
    }

    /// A pool of `pages` pages (the scratch page included) for `slots` sequences
    /// of up to `max_len` rows; it must hold one such sequence.
    pub fn new(slots: usize, max_len: usize, pages: usize) -> Result<KvPages> {
        let max_pages = pages_of(max_len).max(1);
        // Cache rows and table entries are i32 on the device.
        let entries = (slots + 1).checked_mul(max_pages);
        if pages > i32::MAX as usize / PAGE_ROWS || entries.is_none_or(|e| e > i32::MAX as usize) {
            return Err(CudaError::Invalid(format!(
                "KV cache: {pages} pages for {slots} sequences of {max_len} rows is past the \
                 kernels' 32-bit row and table indices"
            )));
        }
        if pages < max_pages + 1 {
            return Err(CudaError::Invalid(format!(
                "KV cache: {pages} pages of {PAGE_ROWS} rows cannot hold one sequence of {max_len} \
                 rows (it needs {max_pages} and the scratch page)"
            )));
        }
        Ok(KvPages {
            max_pages,
            free: (1..pages as u32).rev().collect(),
            refs: vec![0; pages],
            held: vec![Vec::new(); slots + 1],
            table: vec![0; (slots + 1) * max_pages],
            dirty: true,
            peak: 0,
        })
    }

    /// Pages in the pool, the scratch page included.
    pub fn pages(&self) -> usize {
        self.refs.len()
    }

    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// Pages held by some sequence now, and at most so far.
    pub fn in_use(&self) -> usize {
        self.pages() - 1 - self.free.len()
    }

    pub fn peak(&self) -> usize {
        self.peak
    }

    pub fn max_pages(&self) -> usize {
        self.max_pages
    }

    /// The slot whose table row names only the scratch page.
    pub fn scratch_slot(&self) -> usize {
        self.held.len() - 1
    }

    /// Slot `slot`'s row of the table: its offset.
    pub fn offset(&self, slot: usize) -> usize {
        slot * self.max_pages
    }

    /// Rows the pages of `slot` hold.
    pub fn rows_held(&self, slot: usize) -> usize {
        self.held.get(slot).map_or(0, |h| h.len() * PAGE_ROWS)
    }

    /// The cache row of position `pos` of the sequence in `slot`, if it holds it.
    pub fn row(&self, slot: usize, pos: usize) -> Option<usize> {
        let page = *self.held.get(slot)?.get(pos / PAGE_ROWS)?;
        Some(page as usize * PAGE_ROWS + pos % PAGE_ROWS)
    }

    /// [`KvPages::row`], or an error naming the slot where it holds no such row.
    pub fn cache_row(&self, slot: usize, pos: usize) -> Result<usize> {
        self.row(slot, pos)
            .ok_or_else(|| CudaError::Invalid(format!("KV cache: slot {slot} holds no row {pos}")))
    }

    /// Whether writing position `pos` of `slot` takes a new page.
    pub fn opens_page(&self, slot: usize, pos: usize) -> bool {
        pos >= self.rows_held(slot)
    }

    /// Pages a step of the sequences `(slot, length)` must take beyond the free
    /// ones (0: it fits): one for each whose next row opens a page.
    pub fn shortfall(&self, rows: impl IntoIterator<Item = (usize, usize)>) -> usize {
        let need = rows
            .into_iter()
            .filter(|&(s, l)| self.opens_page(s, l))
            .count();
        need.saturating_sub(self.free())
    }

    /// The page that holds position `pos` of `slot`, taking a new one when `pos`
    /// is the first row past the pages held. A full pool, a gap or a sequence
    /// longer than the table allows is an error naming the slot.
    pub fn grow(&mut self, slot: usize, pos: usize) -> Result<u32> {
        if slot >= self.scratch_slot() {
            return Err(CudaError::Invalid(format!(
                "KV cache: no sequence slot {slot} (of {})",
                self.scratch_slot()
            )));
        }
        let held = self.held[slot].len();
        if pos / PAGE_ROWS < held {
            return Ok(self.held[slot][pos / PAGE_ROWS]);
        }
        if pos != held * PAGE_ROWS || held >= self.max_pages {
            return Err(CudaError::Invalid(format!(
                "KV cache: slot {slot} holds {} rows, position {pos} is not the next (at most {})",
                held * PAGE_ROWS,
                self.max_pages * PAGE_ROWS
            )));
        }
        let Some(page) = self.free.pop() else {
            return Err(CudaError::Invalid(format!(
                "KV cache: no free page for the sequence in slot {slot} (all {} pages of {PAGE_ROWS} \
                 rows are in use; a larger rollout.kv_cache_gib, or a smaller max_batch, leaves room)",
                self.pages() - 1
            )));
        };
        self.refs[page as usize] = 1;
        self.held[slot].push(page);
        self.table[slot * self.max_pages + held] = page as i32;
        self.dirty = true;
        self.peak = self.peak.max(self.in_use());
        Ok(page)
    }

    /// `to` (holding nothing) takes the first `n` pages of `from` as its own
    /// first pages, shared.
    pub fn share(&mut self, from: usize, to: usize, n: usize) -> Result<()> {
        if from == to || to >= self.scratch_slot() || !self.held[to].is_empty() {
            return Err(CudaError::Invalid(format!(
                "KV cache: slot {to} cannot share slot {from}'s pages"
            )));
        }
        let pages: Vec<u32> = match self.held.get(from) {
            Some(h) if h.len() >= n => h[..n].to_vec(),
            _ => {
                return Err(CudaError::Invalid(format!(
                    "KV cache: slot {from} holds fewer than {n} pages"
                )))
            }
        };
        for (j, &p) in pages.iter().enumerate() {
            self.refs[p as usize] += 1;
            self.table[to * self.max_pages + j] = p as i32;
        }
        self.held[to] = pages;
        self.dirty = true;
        Ok(())
    }

    /// The sequence in `slot` is gone: its pages go back once nothing else holds them.
    pub fn release(&mut self, slot: usize) {
        let Some(held) = self.held.get_mut(slot) else {
            return;
        };
        for p in std::mem::take(held) {
            let r = &mut self.refs[p as usize];
            *r -= 1;
            if *r == 0 {
                self.free.push(p);
            }
        }
        // The table row keeps naming the old pages: no step reads a free slot
        // (a step run ahead of the host that did was queued before any reuse).
    }

    /// The table `[slots + 1][max_pages]`, and whether it changed since last asked.
    pub fn table(&self) -> &[i32] {
        &self.table
    }

    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// How many of `seqs` (in order) a prefill can take now beside the live
    /// sequences `(slot, length)` (the table's rows, `max_pages * PAGE_ROWS`, are
    /// the most a sequence holds): each distinct prompt's pages once and each
    /// further copy's own partly filled last page, leaving a page for every
    /// sequence whose next row opens one and a sixteenth of the pool spare (so
    /// that an admission does not preempt at once what it admitted). With
    /// nothing live the first sequence is taken whenever its rows and its next
    /// one fit.
    pub fn admissible(&self, live: &[(usize, usize)], seqs: &[&[u32]]) -> usize {
        let opening = live.iter().filter(|&&(s, l)| self.opens_page(s, l)).count();
        let mut need = opening + self.pages() / 16;
        let free = self.free();
        let mut seen = std::collections::HashSet::new();
        let mut k = 0;
        for q in seqs {
            need += match seen.insert(*q) {
                true => pages_of(q.len()),
                false => usize::from(!q.len().is_multiple_of(PAGE_ROWS)),
            };
            need += usize::from(q.len().is_multiple_of(PAGE_ROWS));
            if need > free {
                break;
            }
            k += 1;
        }
        match (k, seqs.first()) {
            // Its next row only where it may have one.
            (0, Some(q)) if live.is_empty() => {
                let rows = (q.len() + 1).min(self.max_pages * PAGE_ROWS);
                usize::from(pages_of(rows) <= free)
            }
            _ => k,
        }
    }
}

/// A prefill's prompts grouped by content: `groups[u]` the indices of the
/// prompts equal to distinct prompt u (first one first), `of[i]` the group of
/// prompt i.
pub struct Shared {
    pub groups: Vec<Vec<usize>>,
    pub of: Vec<usize>,
}

impl Shared {
    pub fn of(seqs: &[&[u32]]) -> Shared {
        let mut first: HashMap<&[u32], usize> = HashMap::with_capacity(seqs.len());
        let (mut groups, mut of) = (Vec::<Vec<usize>>::new(), Vec::with_capacity(seqs.len()));
        for (i, s) in seqs.iter().enumerate() {
            let u = *first.entry(s).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[u].push(i);
            of.push(u);
        }
        Shared { groups, of }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_taken_as_a_sequence_grows_and_given_back() {
        let mut p = KvPages::new(2, 200, 9).unwrap();
        assert_eq!((p.pages(), p.free(), p.max_pages()), (9, 8, 4));
        for pos in 0..130 {
            let page = p.grow(0, pos).unwrap();
            assert_ne!(page, 0, "the scratch page is never handed out");
            assert_eq!(
                p.row(0, pos),
                Some(page as usize * PAGE_ROWS + pos % PAGE_ROWS)
            );
        }
        assert_eq!(p.in_use(), 3);
        assert!(p.opens_page(0, 192) && !p.opens_page(0, 191));
        // A gap, and a sequence past the table's row, are errors.
        assert!(p.grow(1, 5).is_err());
        p.grow(0, 130).unwrap();
        for pos in 131..256 {
            p.grow(0, pos).unwrap();
        }
        let e = p.grow(0, 256).unwrap_err().to_string();
        assert!(e.contains("slot 0"), "{e}");
        assert_eq!(p.peak(), 4);
        p.release(0);
        assert_eq!((p.free(), p.in_use(), p.peak()), (8, 0, 4));
        let tab = p.table();
        assert_eq!(tab.len(), 3 * 4);
        assert!(
            tab[8..].iter().all(|&e| e == 0),
            "the scratch slot names page 0"
        );
    }

    #[test]
    fn a_full_pool_is_an_error_and_a_release_makes_room() {
        let mut p = KvPages::new(3, 64, 3).unwrap();
        p.grow(0, 0).unwrap();
        p.grow(1, 0).unwrap();
        let e = p.grow(2, 0).unwrap_err().to_string();
        assert!(e.contains("no free page") && e.contains("slot 2"), "{e}");
        p.release(1);
        p.grow(2, 0).unwrap();
        assert!(KvPages::new(1, 65, 2).is_err(), "one sequence must fit");
    }

    #[test]
    fn shared_pages_outlive_every_holder_but_the_last() {
        let mut p = KvPages::new(3, 256, 13).unwrap();
        for pos in 0..100 {
            p.grow(0, pos).unwrap();
        }
        p.share(0, 1, 1).unwrap();
        p.share(0, 2, 1).unwrap();
        assert_eq!(p.row(1, 10), p.row(0, 10));
        assert!(
            p.share(0, 1, 1).is_err(),
            "a slot that holds pages shares none"
        );
        // Each sample's own copy of the partly filled page.
        p.grow(1, 64).unwrap();
        p.grow(2, 64).unwrap();
        assert_ne!(p.row(1, 64), p.row(0, 64));
        assert_ne!(p.row(1, 64), p.row(2, 64));
        assert_eq!(p.in_use(), 4);
        p.release(0);
        assert_eq!(p.in_use(), 3, "page 0 of slot 0 is still held by 1 and 2");
        p.release(1);
        p.release(2);
        assert_eq!(p.in_use(), 0);
        let t = p.table();
        assert_eq!(
            t[p.offset(2)],
            t[p.offset(0)],
            "the table names the shared page"
        );
    }

    #[test]
    fn a_prefill_counts_each_distinct_prompt_once() {
        let a: Vec<u32> = (0..100).collect();
        let b: Vec<u32> = (0..128).collect();
        let seqs: Vec<&[u32]> = vec![&a, &b, &a, &a, &b];
        let s = Shared::of(&seqs);
        assert_eq!(s.groups, vec![vec![0, 2, 3], vec![1, 4]]);
        assert_eq!(s.of, vec![0, 1, 0, 0, 1]);
        // 32 pages (2 spare), 31 free: a takes 2, b 2 and one for its next row
        // (128 opens a page), each further a its own last page, the further b
        // its next row's page: 2 + 2 + 3 + 1 + 1 + 1 = 10 for all five.
        let p = KvPages::new(8, 256, 32).unwrap();
        assert_eq!(p.admissible(&[], &seqs), 5);
        // 10 pages (no spare, 9 free): 2, 5, 6, 7, 8.
        let p = KvPages::new(8, 256, 10).unwrap();
        assert_eq!(p.admissible(&[], &seqs), 5);
        // 8 pages (7 free): the fifth would make 8.
        let p = KvPages::new(8, 256, 8).unwrap();
        assert_eq!(p.admissible(&[], &seqs), 4);
    }

    #[test]
    fn admission_leaves_the_live_sequences_their_next_pages() {
        let mut p = KvPages::new(4, 256, 6).unwrap();
        for pos in 0..64 {
            p.grow(0, pos).unwrap();
        }
        let q: Vec<u32> = (0..10).collect();
        // 4 free, slot 0's next row (64) opens a page: the new sequence takes 1.
        assert_eq!(p.admissible(&[(0, 64)], &[&q, &q, &q]), 3);
        assert_eq!(
            p.admissible(&[(0, 64)], &[&q, &[1, 2][..], &[3][..], &[4][..]]),
            3
        );
        for pos in 64..128 {
            p.grow(0, pos).unwrap();
        }
        for pos in 0..64 * 3 {
            p.grow(1, pos).unwrap();
        }
        assert_eq!(p.free(), 0);
        assert_eq!(p.admissible(&[(0, 128), (1, 192)], &[&q]), 0);
        p.release(0);
        p.release(1);
        let long: Vec<u32> = (0..255).collect();
        assert_eq!(p.admissible(&[], &[&long, &q]), 2, "4 + 1 of 5 free");
        // Nothing live: the first sequence whenever its rows and next row fit,
        // the spare (a sixteenth of 17 pages) aside.
        let p = KvPages::new(1, 1024, 17).unwrap();
        let long: Vec<u32> = (0..1000).collect();
        assert_eq!(p.admissible(&[], &[&long]), 1);
        assert_eq!(p.admissible(&[(0, 5)], &[&long]), 0);
        // A prompt as long as a sequence may be (it takes no next row) fits the
        // smallest pool.
        let p = KvPages::new(1, 128, 3).unwrap();
        let full: Vec<u32> = (0..128).collect();
        assert_eq!(p.admissible(&[], &[&full]), 1);
        let e = KvPages::new(1 << 20, 1 << 20, 1 << 20)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("32-bit"), "{e}");
    }
}
