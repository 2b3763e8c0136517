//! The full backward: from d loss / d logits to gradients of every weight.
//!
//! DGrad and WGrad of each linear layer run in the flow's precision; in the
//! low-precision flows every gradient passed between ops is rounded to BF16.

use jet_kernels::bf16;
use jet_kernels::ops::attention::attention_backward;
use jet_kernels::ops::embedding::embedding_backward;
use jet_kernels::ops::linear::{linear_backward, PreparedWeight};
use jet_kernels::ops::rmsnorm::rmsnorm_backward;
use jet_kernels::ops::rope::rope_backward;
use jet_kernels::ops::swiglu::swiglu_backward;
use jet_kernels::GemmRole;

use super::forward::Activations;
use super::prepared::PreparedModel;
use crate::model::ModelWeights;

struct Ctx<'a> {
    model: &'a PreparedModel<'a>,
    m: usize,
}

impl Ctx<'_> {
    fn lp(&self, mut v: Vec<f32>) -> Vec<f32> {
        if self.model.flow.low_precision() {
            bf16::round_slice(&mut v);
        }
        v
    }
    /// Linear backward; adds dW (and db) into the gradient buffers, returns dx.
    fn linear(
        &self,
        dy: &[f32],
        x: &[f32],
        w: &PreparedWeight<f32>,
        dw: &mut [f32],
        db: Option<&mut Vec<f32>>,
    ) -> Vec<f32> {
        let f = self.model.flow;
        let g = linear_backward(
            dy,
            x,
            self.m,
            w,
            db.is_some(),
            f.precision(GemmRole::DGrad),
            f.precision(GemmRole::WGrad),
        );
        add_into(dw, &g.dw);
        if let (Some(db), Some(gb)) = (db, g.db) {
            add_into(db, &gb);
        }
        g.dx
    }
}

fn add_into(acc: &mut [f32], x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// Gradients of all weights given `dlogits` for a forward kept with `keep_acts`:
/// `[R, vocab]` for the forward's `head_rows` (every other row's logits have no
/// gradient), or `[M, vocab]`. The result has the layout of the weights (tied: the
/// LM head's gradient is added to the embedding's).
pub fn backward(model: &PreparedModel, acts: &Activations, dlogits: &[f32]) -> ModelWeights {
    let cfg = model.cfg;
    let (h, hd) = (cfg.hidden_size, cfg.head_dim);
    let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let m = acts.tokens.len();
    let cx = Ctx { model, m };
    let mut g = ModelWeights::zeros(cfg);
    let w = model.w;

    // Head: logits = normed[head_rows] lm_head^T; normed = rmsnorm(h_final). The
    // head's GEMMs run over its R rows; dn is 0 on the rows it did not read.
    let mut d_head = vec![0.0f32; cfg.vocab_size * h];
    let hx = Ctx {
        model,
        m: acts.normed.len() / h,
    };
    let dn = hx.linear(dlogits, &acts.normed, &model.lm_head, &mut d_head, None);
    let dn = match &acts.head_rows {
        Some(rows) => {
            let mut full = vec![0.0f32; m * h];
            for (j, &r) in rows.iter().enumerate() {
                full[r * h..(r + 1) * h].copy_from_slice(&dn[j * h..(j + 1) * h]);
            }
            full
        }
        None => dn,
    };
    match g.lm_head.as_mut() {
        Some(l) => add_into(l, &d_head),
        None => add_into(&mut g.embed_tokens, &d_head),
    }
    let (dh, dnorm) = rmsnorm_backward(&dn, &acts.h_final, &w.norm, &acts.rstd_final, m, h);
    add_into(&mut g.norm, &cx.lp(dnorm));
    let mut dx = cx.lp(dh);

    for li in (0..w.layers.len()).rev() {
        let (a, lw, lp, gl) = (
            &acts.layers[li],
            &w.layers[li],
            &model.layers[li],
            &mut g.layers[li],
        );
        // MLP: out = h_mid + down(swiglu(gate(b), up(b))), b = norm(h_mid).
        let dmm = cx.linear(&dx, &a.m, &lp.down, &mut gl.down_proj, None);
        let (dgate, dup) = swiglu_backward(&dmm, &a.gate, &a.up);
        let (dgate, dup) = (cx.lp(dgate), cx.lp(dup));
        let mut db = cx.linear(&dgate, &a.b, &lp.gate, &mut gl.gate_proj, None);
        add_into(
            &mut db,
            &cx.linear(&dup, &a.b, &lp.up, &mut gl.up_proj, None),
        );
        let (dh_mid, dw2) =
            rmsnorm_backward(&db, &a.h_mid, &lw.post_attention_layernorm, &a.rstd2, m, h);
        add_into(&mut gl.post_attention_layernorm, &cx.lp(dw2));
        let mut dh_mid = cx.lp(dh_mid);
        add_into(&mut dh_mid, &dx);

        // Attention: h_mid = x_in + o(attn(rope(norm(q(a))), rope(norm(k(a))), v(a))).
        let dattn = cx.linear(&dh_mid, &a.attn, &lp.o, &mut gl.o_proj, None);
        let shape = model.attn_shape();
        let (qd, kvd) = (nh * hd, nkv * hd);
        let (mut dq, mut dk, mut dv) = (
            vec![0.0f32; m * qd],
            vec![0.0f32; m * kvd],
            vec![0.0f32; m * kvd],
        );
        for (si, &(start, len)) in acts.spans.iter().enumerate() {
            let (q0, q1, k0, k1) = (
                start * qd,
                (start + len) * qd,
                start * kvd,
                (start + len) * kvd,
            );
            let (sq, sk, sv) = attention_backward(
                &dattn[q0..q1],
                &a.q[q0..q1],
                &a.k[k0..k1],
                &a.v[k0..k1],
                &a.probs[si],
                len,
                shape,
            );
            dq[q0..q1].copy_from_slice(&sq);
            dk[k0..k1].copy_from_slice(&sk);
            dv[k0..k1].copy_from_slice(&sv);
        }
        rope_backward(&mut dq, &acts.positions, nh, &model.rope);
        rope_backward(&mut dk, &acts.positions, nkv, &model.rope);
        let (mut dq, mut dk, dv) = (cx.lp(dq), cx.lp(dk), cx.lp(dv));
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            let (dqp, dqn) = rmsnorm_backward(&dq, &a.q_pre, qn, &a.q_rstd, m * nh, hd);
            let (dkp, dkn) = rmsnorm_backward(&dk, &a.k_pre, kn, &a.k_rstd, m * nkv, hd);
            add_into(gl.q_norm.as_mut().expect("q_norm grad"), &cx.lp(dqn));
            add_into(gl.k_norm.as_mut().expect("k_norm grad"), &cx.lp(dkn));
            (dq, dk) = (cx.lp(dqp), cx.lp(dkp));
        }
        let mut da = cx.linear(&dq, &a.a, &lp.q, &mut gl.q_proj, gl.q_bias.as_mut());
        add_into(
            &mut da,
            &cx.linear(&dk, &a.a, &lp.k, &mut gl.k_proj, gl.k_bias.as_mut()),
        );
        add_into(
            &mut da,
            &cx.linear(&dv, &a.a, &lp.v, &mut gl.v_proj, gl.v_bias.as_mut()),
        );
        let (dx_in, dw1) = rmsnorm_backward(&da, &a.x_in, &lw.input_layernorm, &a.rstd1, m, h);
        add_into(&mut gl.input_layernorm, &cx.lp(dw1));
        let mut dx_in = cx.lp(dx_in);
        add_into(&mut dx_in, &dh_mid);
        dx = dx_in;
    }
    embedding_backward(&mut g.embed_tokens, h, &acts.tokens, &dx);
    g
}
