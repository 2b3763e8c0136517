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
    /// Residual stream entering the final norm `[M, hidden]` and its rstd `[M]`.
    pub h_final: Vec<f32>,
    pub rstd_final: Vec<f32>,
    /// The LM head's input: the normed rows at `head_rows` `[R, hidden]`, or all
    /// `M` of them when `head_rows` is None.
    pub normed: Vec<f32>,
    pub head_rows: Option<Vec<usize>>,
}

pub struct ForwardOut {
    /// `[R, vocab]`: the logits of the rows asked for (`head_rows`), or of every
    /// row `[total tokens, vocab]`, sequence after sequence.
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

/// The LM head's rows: distinct rows of the `m` packed rows (their gradients are
/// scattered back into place). The CPU and GPU forwards both check them so.
pub fn check_head_rows(rows: &[usize], m: usize) -> Result<(), String> {
    let mut seen = vec![false; m];
    for (j, &r) in rows.iter().enumerate() {
        match seen.get_mut(r) {
            None => {
                return Err(format!(
                    "LM head rows: entry {j} is row {r} of a batch of {m}"
                ))
            }
            Some(true) => {
                return Err(format!(
                    "LM head rows: row {r} appears more than once (entry {j})"
                ))
            }
            Some(x) => *x = true,
        }
    }
    Ok(())
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
    forward_rows(model, seqs, role, (keep_acts, keep_kv), None)
}

/// [`forward`] with the LM head over the packed rows `head_rows` only (distinct rows
/// whose logits are read: a trainer's scored rows), in that order; every row
/// still runs through the layers and the final norm. A row's logits are the same
/// bits either way (the head's GEMM and the norm work row by row).
pub fn forward_rows(
    model: &PreparedModel,
    seqs: &[&[u32]],
    role: GemmRole,
    (keep_acts, keep_kv): (bool, bool),
    head_rows: Option<&[usize]>,
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
    if let Some(rows) = head_rows {
        if let Err(e) = check_head_rows(rows, tokens.len()) {
            panic!("{e}");
        }
    }
    let (normed, rstd_final, logits) = head(model, &h, role, head_rows);
    let kv = std::mem::take(&mut attn.kv);
    let acts = keep_acts.then_some(Activations {
        tokens,
        spans,
        positions,
        layers,
        h_final: h,
        rstd_final,
        normed,
        head_rows: head_rows.map(<[usize]>::to_vec),
    });
    ForwardOut { logits, acts, kv }
}
