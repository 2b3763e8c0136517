//! The layer stack shared by training and rollout.

use jet_kernels::ops::embedding::embedding_forward;
use jet_kernels::ops::linear::linear_forward;
use jet_kernels::ops::rmsnorm::rmsnorm_forward;
use jet_kernels::ops::rope::rope_forward;
use jet_kernels::ops::swiglu::swiglu_forward;
use jet_kernels::GemmRole;

use super::prepared::PreparedModel;

/// What one layer's backward needs. Row counts: M tokens.
pub struct LayerActs {
    /// Residual stream entering the layer `[M, hidden]`.
    pub x_in: Vec<f32>,
    /// input_layernorm output `[M, hidden]` and its rstd `[M]`.
    pub a: Vec<f32>,
    pub rstd1: Vec<f32>,
    /// q, k before the per-head norm `[M, heads*hd]`, `[M, kv*hd]` and the norms' rstd (Qwen3).
    pub q_pre: Vec<f32>,
    pub k_pre: Vec<f32>,
    pub q_rstd: Vec<f32>,
    pub k_rstd: Vec<f32>,
    /// q, k after norm and RoPE, and v: the attention inputs.
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Softmax probabilities, one `[heads, len, len]` array per sequence.
    pub probs: Vec<Vec<f32>>,
    /// Attention output `[M, heads*hd]` (o_proj input).
    pub attn: Vec<f32>,
    /// Residual after attention `[M, hidden]`.
    pub h_mid: Vec<f32>,
    /// post_attention_layernorm output and rstd.
    pub b: Vec<f32>,
    pub rstd2: Vec<f32>,
    /// MLP gate and up projections `[M, inter]` and swiglu output.
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub m: Vec<f32>,
}

/// The attention of one layer for all M rows: given q `[M, heads*hd]` and k, v
/// `[M, kv*hd]` (after norm and RoPE), return the output `[M, heads*hd]` and,
/// when training, the probabilities per sequence.
pub trait Attention {
    fn attend(
        &mut self,
        layer: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
    ) -> (Vec<f32>, Vec<Vec<f32>>);
}

fn add_into(acc: &mut [f32], x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// Embed `tokens` and run every layer; returns the residual stream before the
/// final norm `[M, hidden]`. Row r sits at position `positions[r]`.
pub fn run_layers(
    model: &PreparedModel,
    tokens: &[u32],
    positions: &[usize],
    role: GemmRole,
    attn: &mut dyn Attention,
    mut acts: Option<&mut Vec<LayerActs>>,
) -> Vec<f32> {
    let cfg = model.cfg;
    let (m, h, hd) = (tokens.len(), cfg.hidden_size, cfg.head_dim);
    let prec = model.flow.precision(role);
    let mut x = embedding_forward(&model.w.embed_tokens, h, tokens);
    for (li, (lw, lp)) in model.w.layers.iter().zip(&model.layers).enumerate() {
        let (a, rstd1) = rmsnorm_forward(&x, &lw.input_layernorm, m, h, cfg.rms_norm_eps);
        let mut q = linear_forward(&a, m, &lp.q, lw.q_bias.as_deref(), prec);
        let mut k = linear_forward(&a, m, &lp.k, lw.k_bias.as_deref(), prec);
        let v = linear_forward(&a, m, &lp.v, lw.v_bias.as_deref(), prec);
        let (q_pre, k_pre) = (q.clone(), k.clone());
        let (mut q_rstd, mut k_rstd) = (Vec::new(), Vec::new());
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            (q, q_rstd) =
                rmsnorm_forward(&q, qn, m * cfg.num_attention_heads, hd, cfg.rms_norm_eps);
            (k, k_rstd) =
                rmsnorm_forward(&k, kn, m * cfg.num_key_value_heads, hd, cfg.rms_norm_eps);
        }
        rope_forward(&mut q, positions, cfg.num_attention_heads, &model.rope);
        rope_forward(&mut k, positions, cfg.num_key_value_heads, &model.rope);
        let (o, probs) = attn.attend(li, &q, &k, &v);
        let mut h_mid = linear_forward(&o, m, &lp.o, None, prec);
        add_into(&mut h_mid, &x);
        let (b, rstd2) =
            rmsnorm_forward(&h_mid, &lw.post_attention_layernorm, m, h, cfg.rms_norm_eps);
        let gate = linear_forward(&b, m, &lp.gate, None, prec);
        let up = linear_forward(&b, m, &lp.up, None, prec);
        let mm = swiglu_forward(&gate, &up);
        let mut out = linear_forward(&mm, m, &lp.down, None, prec);
        add_into(&mut out, &h_mid);
        let x_in = std::mem::replace(&mut x, out);
        if let Some(acts) = acts.as_deref_mut() {
            acts.push(LayerActs {
                x_in,
                a,
                rstd1,
                q_pre,
                k_pre,
                q_rstd,
                k_rstd,
                q,
                k,
                v,
                probs,
                attn: o,
                h_mid,
                b,
                rstd2,
                gate,
                up,
                m: mm,
            });
        }
    }
    x
}

/// Final norm and LM head: `h [M, hidden]` -> (the head's input, rstd `[M]`,
/// logits): over every row (normed `[M, hidden]`, logits `[M, vocab]`), or over the
/// normed rows `rows` alone (`[R, hidden]`, `[R, vocab]`).
pub fn head(
    model: &PreparedModel,
    h: &[f32],
    role: GemmRole,
    rows: Option<&[usize]>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let cfg = model.cfg;
    let hs = cfg.hidden_size;
    let m = h.len() / hs;
    let (n, rstd) = rmsnorm_forward(h, &model.w.norm, m, hs, cfg.rms_norm_eps);
    let n = match rows {
        Some(rows) => rows
            .iter()
            .flat_map(|&r| &n[r * hs..(r + 1) * hs])
            .copied()
            .collect(),
        None => n,
    };
    let logits = linear_forward(
        &n,
        n.len() / hs,
        &model.lm_head,
        None,
        model.flow.precision(role),
    );
    (n, rstd, logits)
}
