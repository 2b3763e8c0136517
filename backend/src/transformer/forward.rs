//! The full-sequence forward (training, scoring, rollout prefill).

use jet_kernels::ops::attention::attention_forward;
use jet_kernels::GemmRole;

use super::layers::{head, run_layers, Attention, LayerActs};
use super::prepared::PreparedModel;

/// Everything the backward needs, for sequences packed one after another.
pub struct Activations {
    pub tokens: Vec<u32>,
    /// `(start row, length)` of each sequence.
    pub spans: Vec<(usize, usize)>,
    pub positions: Vec<usize>,
    pub layers: Vec<LayerActs>,
    /// Residual stream entering the final norm, the normed rows and their rstd.
    pub h_final: Vec<f32>,
    pub normed: Vec<f32>,
    pub rstd_final: Vec<f32>,
}

pub struct ForwardOut {
    /// `[total tokens, vocab]`, sequence after sequence.
    pub logits: Vec<f32>,
    pub acts: Option<Activations>,
    /// Per layer, (k, v) after RoPE `[total tokens, kv*hd]`: what a KV cache holds.
    pub kv: Vec<(Vec<f32>, Vec<f32>)>,
}

/// Causal attention within each sequence of a packed batch.
pub(super) struct PackedCausal<'a> {
    pub spans: &'a [(usize, usize)],
    pub shape: jet_kernels::ops::attention::AttnShape,
    pub keep_kv: bool,
    pub kv: Vec<(Vec<f32>, Vec<f32>)>,
}

impl Attention for PackedCausal<'_> {
    fn attend(
        &mut self,
        _layer: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
    ) -> (Vec<f32>, Vec<Vec<f32>>) {
        let s = self.shape;
        let (qd, kvd) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
        let mut out = Vec::with_capacity(q.len());
        let mut probs = Vec::with_capacity(self.spans.len());
        for &(start, len) in self.spans {
            let (o, p) = attention_forward(
                &q[start * qd..(start + len) * qd],
                &k[start * kvd..(start + len) * kvd],
                &v[start * kvd..(start + len) * kvd],
                len,
                s,
            );
            out.extend_from_slice(&o);
            probs.push(p);
        }
        if self.keep_kv {
            self.kv.push((k.to_vec(), v.to_vec()));
        }
        (out, probs)
    }
}

/// Run `seqs` (each from position 0) through the model. `keep_acts` keeps what
/// the backward needs; `keep_kv` returns each layer's k and v.
pub fn forward(
    model: &PreparedModel,
    seqs: &[&[u32]],
    role: GemmRole,
    keep_acts: bool,
    keep_kv: bool,
) -> ForwardOut {
    let mut tokens = Vec::new();
    let mut positions = Vec::new();
    let mut spans = Vec::new();
    for s in seqs {
        spans.push((tokens.len(), s.len()));
        tokens.extend_from_slice(s);
        positions.extend(0..s.len());
    }
    let mut attn = PackedCausal {
        spans: &spans,
        shape: model.attn_shape(),
        keep_kv,
        kv: Vec::new(),
    };
    let mut layers = Vec::new();
    let h = run_layers(
        model,
        &tokens,
        &positions,
        role,
        &mut attn,
        keep_acts.then_some(&mut layers),
    );
    let (normed, rstd_final, logits) = head(model, &h, role);
    let kv = std::mem::take(&mut attn.kv);
    let acts = keep_acts.then_some(Activations {
        tokens,
        spans,
        positions,
        layers,
        h_final: h,
        normed,
        rstd_final,
    });
    ForwardOut { logits, acts, kv }
}
