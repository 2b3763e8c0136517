//! A model's device weights prepared for one step in one precision flow: every
//! linear weight in the copies its GEMM roles read (in the `fp8` flow the
//! 128x128-block quantization, done once per step and read by rollout, the
//! training forward and DGrad alike), and the RoPE table.

use std::sync::Arc;

use jet_kernels::cuda::adamw::BlockTargets;
use jet_kernels::cuda::flash::flash_supported;
use jet_kernels::cuda::linear::{GpuWeight, Stacked};
use jet_kernels::cuda::ops::GpuRope;
use jet_kernels::cuda::part::Bf16View;
use jet_kernels::cuda::{CudaError, Gpu, Result};
use jet_kernels::ops::attention::AttnShape;
use jet_kernels::Flow;

use super::weights::{GpuWeights, Index};
use crate::model::ModelConfig;
use crate::transformer::rope_table;

/// One layer's seven projections.
pub struct GpuLayer {
    pub q: GpuWeight,
    pub k: GpuWeight,
    pub v: GpuWeight,
    pub o: GpuWeight,
    pub gate: GpuWeight,
    pub up: GpuWeight,
    pub down: GpuWeight,
    /// q's, k's and v's DGrad operands side by side, and gate's and up's, for one
    /// DGrad GEMM each (`GpuWeight::prepare_stacked`; the members hold their parts,
    /// which AdamW rewrites in place): in the fp8 flow their `W^T` blocks `[hidden,
    /// q + k + v]` (`[hidden, 2 intermediate]`), where DGrad is BF16 their BF16
    /// weights `[q + k + v][hidden]`. None where a member's width does not allow it
    /// (a multiple of 128 for FP8, of 16 for BF16) or `JET_DGRAD_STACK=0`.
    pub qkv_st: Option<Stacked>,
    pub gu_st: Option<Stacked>,
}

pub struct GpuModel<'w> {
    pub gpu: Arc<Gpu>,
    pub cfg: &'w ModelConfig,
    pub w: &'w GpuWeights,
    pub flow: Flow,
    pub layers: Vec<GpuLayer>,
    /// `[vocab, hidden]`: lm_head, or the embedding table when tied.
    pub lm_head: GpuWeight,
    /// cos/sin for every position (depends on the config only: shared by every
    /// preparation of a run's weights).
    pub rope: Arc<GpuRope>,
}

/// One prepared weight's copies an optimizer step rewrites (`GpuAdam::step_prepared`):
/// the weight's length `n k`, its BF16 copy and its FP8 blocks, each if it has it.
pub struct Rewrite<'a> {
    pub len: usize,
    pub bf16: Option<Bf16View<'a>>,
    pub blocks: Option<BlockTargets<'a>>,
}

impl<'a> Rewrite<'a> {
    fn of(w: &'a mut GpuWeight) -> Option<Rewrite<'a>> {
        let len = w.n * w.k;
        let (bf16, blocks) = w.rewritable_mut()?;
        Some(Rewrite { len, bf16, blocks })
    }
}

/// The parts of a [`GpuModel`] computed from the weights' values (what
/// "preparing" costs): kept between passes while the weights do not change.
pub struct PreparedParts {
    flow: Flow,
    layers: Vec<GpuLayer>,
    lm_head: GpuWeight,
    rope: Arc<GpuRope>,
}

impl PreparedParts {
    pub fn flow(&self) -> Flow {
        self.flow
    }

    /// Whether an optimizer step can rewrite these parts for the new weights
    /// ([`PreparedParts::targets`]).
    pub fn rewritable(&mut self, ix: &Index) -> bool {
        self.targets(ix).is_some()
    }

    /// Every prepared weight's copies with the index of the tensor they copy (the
    /// LM head's: the embedding's when tied), when each weight's are ones an
    /// optimizer step can rewrite from the new values
    /// ([`GpuWeight::rewritable_mut`]: BF16 copies whose rows have no padding,
    /// 128x128 FP8 blocks); None otherwise.
    pub fn targets(&mut self, ix: &Index) -> Option<Vec<(usize, Rewrite<'_>)>> {
        if self.layers.len() != ix.layers.len() {
            return None;
        }
        let mut out = Vec::with_capacity(self.layers.len() * 7 + 1);
        for (l, x) in self.layers.iter_mut().zip(&ix.layers) {
            for (w, i) in [
                (&mut l.q, x.q),
                (&mut l.k, x.k),
                (&mut l.v, x.v),
                (&mut l.o, x.o),
                (&mut l.gate, x.gate),
                (&mut l.up, x.up),
                (&mut l.down, x.down),
            ] {
                out.push((i, Rewrite::of(w)?));
            }
        }
        let head = ix.lm_head.unwrap_or(ix.embed);
        out.push((head, Rewrite::of(&mut self.lm_head)?));
        Some(out)
    }
    pub fn rope(&self) -> &Arc<GpuRope> {
        &self.rope
    }
}

impl<'w> GpuModel<'w> {
    /// A model over `w` from parts prepared earlier from the same weight values.
    pub fn reuse(
        gpu: &Arc<Gpu>,
        cfg: &'w ModelConfig,
        w: &'w GpuWeights,
        p: PreparedParts,
    ) -> GpuModel<'w> {
        GpuModel {
            gpu: gpu.clone(),
            cfg,
            w,
            flow: p.flow,
            layers: p.layers,
            lm_head: p.lm_head,
            rope: p.rope,
        }
    }

    /// Give the prepared parts back for a later [`GpuModel::reuse`].
    pub fn into_parts(self) -> PreparedParts {
        PreparedParts {
            flow: self.flow,
            layers: self.layers,
            lm_head: self.lm_head,
            rope: self.rope,
        }
    }

    pub fn new(
        gpu: &Arc<Gpu>,
        cfg: &'w ModelConfig,
        w: &'w GpuWeights,
        flow: Flow,
    ) -> Result<GpuModel<'w>> {
        let rope = Arc::new(GpuRope::new(gpu, &rope_table(cfg))?);
        Self::with_rope(gpu, cfg, w, flow, rope)
    }

    /// [`GpuModel::new`] with a RoPE table made earlier for the same config (the
    /// table covers max_position_embeddings positions: 40960 x 64 pairs for
    /// Qwen3, tens of milliseconds on the host).
    pub fn with_rope(
        gpu: &Arc<Gpu>,
        cfg: &'w ModelConfig,
        w: &'w GpuWeights,
        flow: Flow,
        rope: Arc<GpuRope>,
    ) -> Result<GpuModel<'w>> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let (qd, kvd) = (
            cfg.num_attention_heads * cfg.head_dim,
            cfg.num_key_value_heads * cfg.head_dim,
        );
        // Every weight in one list (each layer's seven, then the LM head), prepared
        // at once: the FP8 blocks of all of them are one launch.
        let mut ws = Vec::with_capacity(w.ix.layers.len() * 7 + 1);
        for l in &w.ix.layers {
            ws.extend([
                (w.t(l.q), qd, h),
                (w.t(l.k), kvd, h),
                (w.t(l.v), kvd, h),
                (w.t(l.o), h, qd),
                (w.t(l.gate), i, h),
                (w.t(l.up), i, h),
                (w.t(l.down), h, i),
            ]);
        }
        ws.push((w.lm_head(), cfg.vocab_size, h));
        // q, k, v and gate, up of each layer: their W^T stacked for one DGrad each.
        // Not q/k/v with biases: their backward reads dy in f32 (one GEMM each).
        let groups: Vec<(usize, usize)> = (w.ix.layers.iter().enumerate())
            .flat_map(|(l, x)| {
                let biased = x.q_bias.is_some() || x.k_bias.is_some() || x.v_bias.is_some();
                [(7 * l, if biased { 1 } else { 3 }), (7 * l + 4, 2)]
            })
            .collect();
        let (prepared, stacks) = GpuWeight::prepare_stacked(gpu, &ws, flow, &groups)?;
        let mut prepared = prepared.into_iter();
        let mut stacks = stacks.into_iter();
        let mut next = || {
            prepared
                .next()
                .ok_or_else(|| CudaError::Invalid("a weight was not prepared".into()))
        };
        let mut layers = Vec::with_capacity(w.ix.layers.len());
        for _ in &w.ix.layers {
            layers.push(GpuLayer {
                q: next()?,
                k: next()?,
                v: next()?,
                o: next()?,
                gate: next()?,
                up: next()?,
                down: next()?,
                qkv_st: stacks.next().flatten(),
                gu_st: stacks.next().flatten(),
            });
        }
        let lm_head = next()?;
        Ok(GpuModel {
            gpu: gpu.clone(),
            cfg,
            w,
            flow,
            layers,
            lm_head,
            rope,
        })
    }

    /// Whether the FP8 and BF16 forward GEMMs are batch-invariant (the default; see
    /// `GpuWeight::batch_invariant`): rollout and training logprobs agree bit for
    /// bit. Off, training's and prefill's forward GEMMs use cuBLASLt.
    pub fn set_batch_invariant(&mut self, on: bool) {
        for l in &mut self.layers {
            for w in [
                &mut l.q,
                &mut l.k,
                &mut l.v,
                &mut l.o,
                &mut l.gate,
                &mut l.up,
                &mut l.down,
            ] {
                w.batch_invariant = on;
            }
        }
        self.lm_head.batch_invariant = on;
    }

    /// What a captured decode step reads of the model and what picked its
    /// kernels: the device addresses of every weight copy, the master weights
    /// and the RoPE tables, the flow, and a hash of the whole config and the
    /// weights' names. A graph kept from an
    /// earlier rollout replays only where this is equal (the optimizer rewrites
    /// the copies in place, so a run's rollouts share one).
    pub fn fingerprint(&self) -> Vec<u64> {
        let g = &*self.gpu;
        // The flow and the attention kernels it picks, then the whole config
        // (shapes, the architecture's switches) and which tensor is which,
        // hashed.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&format!("{:?}", self.cfg), &mut h);
        std::hash::Hash::hash(&self.w.names, &mut h);
        let mut out = vec![
            self.flow as u64,
            self.flash_attention() as u64,
            std::hash::Hasher::finish(&h),
        ];
        out.extend(self.w.bufs.iter().map(|b| g.device_ptr(b)));
        for l in &self.layers {
            for w in [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down] {
                w.fingerprint(g, &mut out);
            }
        }
        self.lm_head.fingerprint(g, &mut out);
        out.extend(self.rope.fingerprint(g));
        out
    }

    /// Whether attention runs on the tensor-core kernels (`cuda::flash`, BF16
    /// operands): every flow but `f32`, which keeps the exact per-row kernels as
    /// the parity path. Training, prefill and decode all follow this one choice,
    /// so a decoded row equals the training forward's row bit for bit.
    pub fn flash_attention(&self) -> bool {
        self.flow != Flow::F32 && flash_supported(self.attn_shape())
    }

    pub fn attn_shape(&self) -> AttnShape {
        AttnShape {
            n_heads: self.cfg.num_attention_heads,
            n_kv_heads: self.cfg.num_key_value_heads,
            head_dim: self.cfg.head_dim,
        }
    }
}
