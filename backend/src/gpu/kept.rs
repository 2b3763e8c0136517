//! Decode graphs kept from one rollout to the next.
//!
//! A rollout captures a decode graph for each batch-size bucket it passes
//! through: with responses of random length, every bucket from the batch down
//! to 1, each capture ~9 ms of host work at 0.6B (the GPU idle meanwhile, and
//! no step launched ahead of the host around it) after two launched steps. A
//! run's rollouts use one model whose prepared copies the optimizer rewrites
//! in place, so the graphs stay valid if the KV cache keeps its addresses too:
//! it lives in a reserved address range ([`FixedRange`]) that is backed by
//! memory only during a rollout. When a decoder ends, its graphs, the range
//! (its memory given back) and the model's [`GpuModel::fingerprint`] are parked
//! on the device; the next decoder adopts the graphs where the fingerprint is
//! equal and its cache fits the range's layout, else it drops them (and keeps
//! the range where the cache fits).

use std::collections::HashMap;

use jet_kernels::cuda::pinned::PinnedIn;
use jet_kernels::cuda::vmm::FixedRange;
use jet_kernels::cuda::Result;

use super::decode::{GpuKvCache, KvLayout};
use super::decode_graph::StepGraph;
use super::generate::GpuDecoder;

/// A finished rollout's graphs and the unmapped range their cache lay in.
pub(super) struct KeptSteps {
    fingerprint: Vec<u64>,
    range: FixedRange,
    layout: KvLayout,
    graphs: HashMap<usize, StepGraph>,
}

/// Drop `graphs`, keeping their page-locked input staging in `spare` for
/// later captures.
pub(super) fn shelve(spare: &mut Vec<PinnedIn<i32>>, graphs: HashMap<usize, StepGraph>) {
    spare.extend(graphs.into_values().map(StepGraph::into_stage));
}

impl KeptSteps {
    /// Drop the graphs (their staging to `spare`) and keep the range.
    fn drop_graphs(self, spare: &mut Vec<PinnedIn<i32>>) -> (FixedRange, KvLayout) {
        shelve(spare, self.graphs);
        (self.range, self.layout)
    }
}

impl GpuDecoder<'_, '_> {
    /// End the cache in use: wait for the stream, give its memory back, and
    /// keep its range with the graphs captured over it (an error drops both:
    /// the next cache is made anew). The decoder holds no graph afterwards.
    pub(super) fn retire(&mut self) -> Result<()> {
        let graphs: HashMap<usize, StepGraph> = self.graphs.drain().collect();
        let Some(cache) = self.cache.take() else {
            shelve(&mut self.spare, graphs);
            return Ok(());
        };
        match cache.into_range(&self.model.gpu) {
            Ok((range, layout)) => {
                let old = self.kept.replace(KeptSteps {
                    fingerprint: self.model.fingerprint(),
                    range,
                    layout,
                    graphs,
                });
                if let Some(k) = old {
                    k.drop_graphs(&mut self.spare);
                }
                Ok(())
            }
            Err(e) => {
                shelve(&mut self.spare, graphs);
                Err(e)
            }
        }
    }

    /// A cache of `slots` x `capacity` rows in `pages` pages, in the kept range
    /// where it fits, with the kept graphs where the model is the one they were
    /// captured for (counted in `graphs_reused`).
    pub(super) fn adopt(
        &mut self,
        slots: usize,
        capacity: usize,
        pages: Option<usize>,
    ) -> Result<GpuKvCache> {
        let kept = self.kept.take();
        let (range, graphs) = match kept {
            Some(k) if self.graphs_apply() && k.fingerprint == self.model.fingerprint() => {
                (Some((k.range, k.layout)), k.graphs)
            }
            Some(k) => (Some(k.drop_graphs(&mut self.spare)), HashMap::new()),
            None => (None, HashMap::new()),
        };
        let at = range.as_ref().map(|(_, l)| *l);
        let cache = match GpuKvCache::new_in(self.model, slots, capacity, pages, range) {
            Ok(c) => c,
            Err(e) => {
                shelve(&mut self.spare, graphs);
                return Err(e);
            }
        };
        if at == Some(cache.layout()) {
            self.graphs_reused += graphs.len();
            self.graphs = graphs
                .into_iter()
                .map(|(b, mut sg)| {
                    sg.kept();
                    (b, sg)
                })
                .collect();
        } else {
            shelve(&mut self.spare, graphs);
        }
        Ok(cache)
    }
}
