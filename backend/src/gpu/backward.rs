//! The full backward on the GPU: from d loss / d logits to the gradients of
//! every weight, added into a gradient buffer (as `transformer::backward`).
//!
//! DGrad and WGrad of each linear layer run in the flow's precision; in the
//! low-precision flows every gradient passed between ops is rounded to BF16.

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::attention::attention_backward;
use jet_kernels::cuda::flash::flash_backward;
use jet_kernels::cuda::linear::{linear_backward_into, linear_bias_grad, GpuWeight};
use jet_kernels::cuda::ops::{
    embedding_backward, rmsnorm_backward, rope_backward_dev, swiglu_backward,
};
use jet_kernels::cuda::tensor::{add_into, round_bf16};
use jet_kernels::cuda::{CudaError, Gpu, Result};
use jet_kernels::GemmRole;

use super::forward::GpuActivations;
use super::layers::AttnSaved;
use super::model::GpuModel;
use super::weights::GpuWeights;

struct Ctx<'a> {
    model: &'a GpuModel<'a>,
    g: &'a Gpu,
    m: usize,
}

impl Ctx<'_> {
    /// Round a gradient to BF16 in the low-precision flows.
    fn lp(&self, mut v: CudaSlice<f32>) -> Result<CudaSlice<f32>> {
        if self.model.flow.low_precision() {
            let n = v.len();
            round_bf16(self.g, &mut v, n)?;
        }
        Ok(v)
    }

    /// Linear backward; adds dW (in the WGrad epilogue) and db into `grads`,
    /// returns dx `[m, k]`.
    fn linear(
        &self,
        dy: &CudaSlice<f32>,
        x: &CudaSlice<f32>,
        w: &GpuWeight,
        grads: &mut GpuWeights,
        dw: usize,
        db: Option<usize>,
    ) -> Result<CudaSlice<f32>> {
        let f = self.model.flow;
        let (dgrad, wgrad) = (f.precision(GemmRole::DGrad), f.precision(GemmRole::WGrad));
        let dx = linear_backward_into(
            self.g,
            (dy, x, self.m),
            w,
            (dgrad, wgrad),
            &mut grads.bufs[dw],
        )?;
        if let Some(db) = db {
            let gb = linear_bias_grad(self.g, dy, self.m, w.n, wgrad)?;
            add_into(self.g, &mut grads.bufs[db], &gb, w.n)?;
        }
        Ok(dx)
    }
}

/// Add the gradients of all weights, given `dlogits [M, vocab]` for a forward
/// kept with `keep_acts`, into `grads` (tied: the LM head's into the embedding's).
pub fn backward(
    model: &GpuModel,
    acts: &GpuActivations,
    dlogits: &CudaSlice<f32>,
    grads: &mut GpuWeights,
) -> Result<()> {
    let (cfg, w, g) = (model.cfg, model.w, &*model.gpu);
    let (h, hd) = (cfg.hidden_size, cfg.head_dim);
    let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let m = acts.tokens.len();
    let cx = Ctx { model, g, m };

    // Head: logits = normed lm_head^T; normed = rmsnorm(h_final).
    let head_ix = w.ix.lm_head.unwrap_or(w.ix.embed);
    let dn = cx.linear(dlogits, &acts.normed, &model.lm_head, grads, head_ix, None)?;
    let (dh, dnorm) = rmsnorm_backward(
        g,
        &dn,
        &acts.h_final,
        w.t(w.ix.norm),
        &acts.rstd_final,
        m,
        h,
    )?;
    add_into(g, &mut grads.bufs[w.ix.norm], &cx.lp(dnorm)?, h)?;
    let mut dx = cx.lp(dh)?;

    for li in (0..w.ix.layers.len()).rev() {
        let (a, lx, lp) = (&acts.layers[li], &w.ix.layers[li], &model.layers[li]);
        // MLP: out = h_mid + down(swiglu(gate(b), up(b))), b = norm(h_mid).
        let dmm = cx.linear(&dx, &a.m, &lp.down, grads, lx.down, None)?;
        let (dgate, dup) = swiglu_backward(g, &dmm, &a.gate, &a.up, m * cfg.intermediate_size)?;
        let (dgate, dup) = (cx.lp(dgate)?, cx.lp(dup)?);
        let mut db = cx.linear(&dgate, &a.b, &lp.gate, grads, lx.gate, None)?;
        let dbu = cx.linear(&dup, &a.b, &lp.up, grads, lx.up, None)?;
        add_into(g, &mut db, &dbu, m * h)?;
        let (dh_mid, dw2) = rmsnorm_backward(
            g,
            &db,
            &a.h_mid,
            w.t(lx.post_attention_layernorm),
            &a.rstd2,
            m,
            h,
        )?;
        add_into(
            g,
            &mut grads.bufs[lx.post_attention_layernorm],
            &cx.lp(dw2)?,
            h,
        )?;
        let mut dh_mid = cx.lp(dh_mid)?;
        add_into(g, &mut dh_mid, &dx, m * h)?;

        // Attention: h_mid = x_in + o(attn(rope(norm(q(a))), rope(norm(k(a))), v(a))).
        let dattn = cx.linear(&dh_mid, &a.attn, &lp.o, grads, lx.o, None)?;
        let shape = model.attn_shape();
        let (mut dq, mut dk, dv) = match (&a.saved, &acts.flash) {
            (AttnSaved::Flash(saved), Some(plan)) => {
                flash_backward(g, plan, &dattn, &a.attn, saved, shape)?
            }
            (AttnSaved::Probs(p), _) => {
                attention_backward(g, &dattn, &a.q, &a.k, &a.v, p, &acts.seq_lens, shape)?
            }
            (AttnSaved::Flash(_), None) => {
                return Err(CudaError::Invalid(
                    "attention backward: log-sum-exp kept but no tile plan".into(),
                ))
            }
        };
        rope_backward_dev(g, &mut dq, &acts.rows.positions, m, nh, &model.rope)?;
        rope_backward_dev(g, &mut dk, &acts.rows.positions, m, nkv, &model.rope)?;
        let (mut dq, mut dk, dv) = (cx.lp(dq)?, cx.lp(dk)?, cx.lp(dv)?);
        if let (Some(qn), Some(kn), Some((q_pre, k_pre, q_rstd, k_rstd))) =
            (lx.q_norm, lx.k_norm, a.qk_pre.as_ref())
        {
            let (dqp, dqn) = rmsnorm_backward(g, &dq, q_pre, w.t(qn), q_rstd, m * nh, hd)?;
            let (dkp, dkn) = rmsnorm_backward(g, &dk, k_pre, w.t(kn), k_rstd, m * nkv, hd)?;
            add_into(g, &mut grads.bufs[qn], &cx.lp(dqn)?, hd)?;
            add_into(g, &mut grads.bufs[kn], &cx.lp(dkn)?, hd)?;
            (dq, dk) = (cx.lp(dqp)?, cx.lp(dkp)?);
        }
        let mut da = cx.linear(&dq, &a.a, &lp.q, grads, lx.q, lx.q_bias)?;
        let dak = cx.linear(&dk, &a.a, &lp.k, grads, lx.k, lx.k_bias)?;
        add_into(g, &mut da, &dak, m * h)?;
        let dav = cx.linear(&dv, &a.a, &lp.v, grads, lx.v, lx.v_bias)?;
        add_into(g, &mut da, &dav, m * h)?;
        let (dx_in, dw1) =
            rmsnorm_backward(g, &da, &a.x_in, w.t(lx.input_layernorm), &a.rstd1, m, h)?;
        add_into(g, &mut grads.bufs[lx.input_layernorm], &cx.lp(dw1)?, h)?;
        let mut dx_in = cx.lp(dx_in)?;
        add_into(g, &mut dx_in, &dh_mid, m * h)?;
        dx = dx_in;
    }
    embedding_backward(
        g,
        &mut grads.bufs[w.ix.embed],
        cfg.vocab_size,
        h,
        &acts.tokens,
        &dx,
    )
}
