//! The full backward on the GPU: from d loss / d logits to the gradients of
//! every weight, added into a gradient buffer (as `transformer::backward`).
//!
//! DGrad and WGrad of each linear layer run in the flow's precision; in the
//! low-precision flows every gradient passed between ops is rounded to BF16.

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::act::ActRef;
use jet_kernels::cuda::attention::attention_backward;
use jet_kernels::cuda::flash::{
    flash_backward, flash_backward_operand, flash_backward_operand_at, Dout,
};
use jet_kernels::cuda::linear::{
    linear_backward_into, linear_backward_raw, linear_bias_grad_acc, linear_dgrad_bf16_part,
    linear_dgrad_bf16_stacked, linear_dgrad_fp8_raw, linear_dgrad_fp8_stacked, stacked_dy_bf16,
    wgrad_bf16_stacked, wgrad_fp8_stacked, Dy, GemmOut, GpuWeight, Stacked, XIn, XOperand,
};
use jet_kernels::cuda::ops::{
    embedding_backward_into, qk_norm_rope_backward_pair, qk_norm_rope_backward_pair_stacked,
    rmsnorm_backward_acc, rmsnorm_backward_acc_operand, rmsnorm_backward_acc_operand_sum,
    rope_backward_dev, swiglu_backward, swiglu_backward_bf16, swiglu_backward_bf16_stacked,
    QkNormGrad, SwigluDh,
};
use jet_kernels::cuda::quantize::{
    quantize_dual_multi, quantize_dual_stacked, swiglu_backward_fp8, swiglu_backward_fp8_stacked,
    DualFp8, DualIn, DualRows, Fp8Quantized,
};
use jet_kernels::cuda::tensor::{round_bf16, scatter_rows};
use jet_kernels::cuda::{CudaError, Gpu, Result};
use jet_kernels::{GemmPrecision, GemmRole};

use super::forward::GpuActivations;
use super::grads::GpuGrads;
use super::layers::AttnSaved;
use super::model::GpuModel;

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

    /// Whether gradients between ops are rounded to BF16 (the low-precision flows);
    /// the producing kernels round as they store.
    fn round(&self) -> bool {
        self.model.flow.low_precision()
    }

    /// The flow's DGrad and WGrad precisions.
    fn precs(&self) -> (GemmPrecision, GemmPrecision) {
        let f = self.model.flow;
        (f.precision(GemmRole::DGrad), f.precision(GemmRole::WGrad))
    }

    /// db += the column sums of dy (rounded as the WGrad), when the layer has a bias.
    fn bias(&self, dy: Dy, w: &GpuWeight, grads: &mut GpuGrads, db: Option<usize>) -> Result<()> {
        if let Some(db) = db {
            let wgrad = self.precs().1;
            let dy = dy.f32(wgrad)?;
            linear_bias_grad_acc(self.g, dy, (self.m, w.n), wgrad, grads.acc(self.g, db)?)?;
        }
        Ok(())
    }

    /// [`Ctx::linear`] with DGrad's output as the GEMM wrote it, for a consumer
    /// that reads it (or sums several) where it reads dx.
    fn linear_raw(
        &self,
        dy: Dy,
        (x, xin): (XIn, &mut XOperand),
        w: &GpuWeight,
        grads: &mut GpuGrads,
        (dw, db): (usize, Option<usize>),
    ) -> Result<GemmOut> {
        let dwb = &mut grads.bufs[dw];
        let out = linear_backward_raw(self.g, (dy, x, self.m), w, self.precs(), dwb, xin)?;
        self.bias(dy, w, grads, db)?;
        Ok(out)
    }

    /// The norm backward of an input read by several projections, given their DGrad
    /// outputs in order: their BF16 values summed by the norm's kernels where each
    /// output is BF16 without padding (no epilogue launches, no f32 dy), else
    /// summed into f32 first. Returns dx and, with `bf16`, its BF16 operand.
    fn norm_of_sum(
        &self,
        outs: &[&GemmOut],
        (x, w, rstd): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
        (dim, res): (usize, Option<&CudaSlice<f32>>),
        dw: &mut CudaSlice<f32>,
        bf16: bool,
    ) -> Result<(CudaSlice<f32>, Option<CudaSlice<u16>>)> {
        let (g, m, round) = (self.g, self.m, self.round());
        let parts: Option<Vec<&CudaSlice<u16>>> = outs.iter().map(|o| o.bf16_rows(dim)).collect();
        if let Some(parts) = parts {
            return rmsnorm_backward_acc_operand_sum(
                g,
                &parts,
                (x, w, rstd),
                (m, dim),
                (round, res),
                dw,
                bf16,
            );
        }
        let dy = GemmOut::finish_sum(outs, g, (m, dim), self.precs().0)?;
        rmsnorm_backward_acc_operand(g, (&dy, x, w, rstd), (m, dim), (round, res), dw, bf16)
    }

    /// Linear backward; adds dW (held as its BF16 output, or by the WGrad epilogue:
    /// `GradAcc::add_bf16`) and db into `grads`,
    /// returns dx `[m, k]`. `xin`: x's WGrad operand, kept for the projections
    /// that read x after this one.
    fn linear(
        &self,
        dy: Dy,
        (x, xin): (&CudaSlice<f32>, &mut XOperand),
        w: &GpuWeight,
        grads: &mut GpuGrads,
        dw: usize,
        db: Option<usize>,
    ) -> Result<CudaSlice<f32>> {
        let dx = linear_backward_into(
            self.g,
            (dy, x.into(), self.m),
            w,
            self.precs(),
            &mut grads.bufs[dw],
            xin,
        )?;
        self.bias(dy, w, grads, db)?;
        Ok(dx)
    }
}

/// FP8 DGrad of projections `ws` that read one input, from their dy's 1x128
/// operands: one GEMM over their stacked `W^T` (`wt`, with the operands stacked
/// too) whose output is the sum of their dx, or one GEMM a projection.
fn dgrad_fp8(
    g: &Gpu,
    rows: DualRows,
    ws: &[&GpuWeight],
    wt: Option<&Fp8Quantized>,
    m: usize,
) -> Result<Vec<GemmOut>> {
    match (rows, wt) {
        (DualRows::Stacked(dy), Some(wt)) => Ok(vec![linear_dgrad_fp8_stacked(g, &dy, wt, m)?]),
        (DualRows::Each(dys), None) if dys.len() == ws.len() => dys
            .iter()
            .zip(ws)
            .map(|(dy, w)| linear_dgrad_fp8_raw(g, dy, w, m))
            .collect(),
        _ => Err(CudaError::Invalid(
            "FP8 DGrad: stacked dy operands need the stacked W^T, one operand a projection otherwise"
                .into(),
        )),
    }
}

/// BF16 DGrad of projections `ws` that read one input `[m, k]`, from their dy
/// stacked `[m][ld]` (columns in `ws`' order): one GEMM over their stacked BF16
/// weights (`w16`) whose output is the sum of their dx, or one GEMM a projection
/// reading its columns.
fn dgrad_bf16(
    g: &Gpu,
    (dy, ld): (&CudaSlice<u16>, usize),
    ws: &[&GpuWeight],
    w16: Option<&CudaSlice<u16>>,
    (m, k): (usize, usize),
) -> Result<Vec<GemmOut>> {
    if let Some(w) = w16 {
        return Ok(vec![linear_dgrad_bf16_stacked(g, (dy, ld), w, (m, k))?]);
    }
    let mut col = 0;
    ws.iter()
        .map(|w| {
            let out = linear_dgrad_bf16_part(g, (dy, col, ld), w, m);
            col += w.n;
            out
        })
        .collect()
}

/// Whether the projections that read one input of width `k` (q, k, v: `ns` their
/// widths; gate, up) take one WGrad GEMM over their stacked dy operands, in the
/// flow whose DGrad and WGrad are both `prec`: FP8 ([`wgrad_fp8_stacked`], their
/// 128x1 operands stacked) or BF16 ([`wgrad_bf16_stacked`], their producers
/// writing their columns of one operand); every width a multiple of 16 (no padding
/// columns between the stacked blocks). On unless `JET_WGRAD_STACK=0` (the separate
/// GEMMs, for comparison).
fn stack_wgrad(model: &GpuModel, prec: GemmPrecision, k: usize, ns: &[usize]) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| jet_kernels::cuda::switch_on("JET_WGRAD_STACK"));
    on && operand_dy(model) == Some(prec)
        && k.is_multiple_of(16)
        && ns.iter().all(|n| n.is_multiple_of(16))
}

/// The precision in which swiglu's backward writes the gate and up projections'
/// dy (and the log-prob backward the LM head's) as their GEMM operands instead of f32: BF16 (BF16 DGrad and WGrad, the BF16
/// flows' training) or FP8 (FP8 DGrad and WGrad, the fp8 flow's); `None`: f32.
/// The operands have the bits of the (rounded) f32 gradients' copies or codes.
pub(super) fn operand_dy(model: &GpuModel) -> Option<GemmPrecision> {
    let f = model.flow;
    let precs = (f.precision(GemmRole::DGrad), f.precision(GemmRole::WGrad));
    match precs {
        (GemmPrecision::Bf16, GemmPrecision::Bf16) => Some(GemmPrecision::Bf16),
        (GemmPrecision::Fp8, GemmPrecision::Fp8) if f.low_precision() => Some(GemmPrecision::Fp8),
        _ => None,
    }
}

/// Add the gradients of all weights, given `dlogits` for a forward kept with
/// `keep_acts` (`[R, vocab]` for its `head_rows`, every other row's logits having
/// no gradient, or `[M, vocab]`), into `grads` (tied: the LM head's into the
/// embedding's).
pub fn backward(
    model: &GpuModel,
    acts: &mut GpuActivations,
    dlogits: Dy,
    grads: &mut GpuGrads,
) -> Result<()> {
    let (cfg, w, g) = (model.cfg, model.w, &*model.gpu);
    let (h, hd) = (cfg.hidden_size, cfg.head_dim);
    let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let m = acts.tokens.len();
    let cx = Ctx { model, g, m };
    // The last passes' held WGrad outputs, settled together where as many are held
    // as may be (the same values as one by one as this pass's arrive).
    grads.settle_full(g)?;

    // Head: logits = normed[head_rows] lm_head^T; normed = rmsnorm(h_final). The
    // head's GEMMs run over its R rows; dn is 0 on the rows it did not read.
    let head_ix = w.ix.lm_head.unwrap_or(w.ix.embed);
    let normed = (&acts.normed, &mut XOperand::default());
    let hx = Ctx {
        model,
        g,
        m: acts.head_rows.as_ref().map_or(m, Vec::len),
    };
    let dn = hx.linear(dlogits, normed, &model.lm_head, grads, head_ix, None)?;
    let dn = match &acts.head_rows {
        Some(rows) => {
            let mut full = g.zeros::<f32>(m * h)?;
            scatter_rows(g, &mut full, h, rows, &dn)?;
            full
        }
        None => dn,
    };
    let hs = &acts.h_final;
    let rs = (cx.round(), None);
    let fin = (&dn, hs, w.t(w.ix.norm), &acts.rstd_final);
    // Where DGrad and WGrad are BF16, the norms' backward (and the q/k norms' and
    // RoPE's) also write the next projections' dy as their BF16 GEMM operands, so no
    // copy of the f32 gradient is made (None: the linear layer copies it).
    let bf16_dy = operand_dy(model) == Some(GemmPrecision::Bf16);
    // Where DGrad and WGrad share a low precision, the attention's backward and the
    // q/k norms' write q's, k's and v's dy as BF16 only: the BF16 flows' operands,
    // or (FP8) what the quantizer reads, the same values in half the bytes.
    let dy16 = operand_dy(model).is_some();
    let dwn = grads.acc(g, w.ix.norm)?;
    let (mut dx, mut dx16) = rmsnorm_backward_acc_operand(g, fin, (m, h), rs, dwn, bf16_dy)?;

    // Gradients between ops are rounded to BF16 by the kernels that produce them
    // (`round`), residual branches added in the norms' backward, and the inputs
    // shared by several projections accumulate in the DGrad epilogues.
    let round = cx.round();
    for li in (0..w.ix.layers.len()).rev() {
        let (lx, lp) = (&w.ix.layers[li], &model.layers[li]);
        // The forward's operands of a, attn, b, m that WGrad reuses (BF16 copies;
        // FP8: m's 128x1 groups), freed with this layer's backward.
        let [ain, attn_in, bin, min] = &mut std::mem::take(&mut acts.layers[li].ops);
        let a = &acts.layers[li];
        let inter = cfg.intermediate_size;
        let (qd, kvd) = (nh * hd, nkv * hd);
        if cx.precs().1 == GemmPrecision::Fp8 {
            // FP8 WGrad: the 128x1 groups of the layer's inputs that the forward did
            // not make (m's come from SwiGLU's kernel, attn's from its dual
            // quantizer) in one launch.
            let post_norm = (&a.h_mid, w.t(lx.post_attention_layernorm), &a.rstd2);
            let in_norm = (&a.x_in, w.t(lx.input_layernorm), &a.rstd1);
            let mut want: Vec<(DualIn, usize, &mut XOperand)> = Vec::with_capacity(4);
            if !min.has_fp8_t() {
                want.push((kept(&a.m, "m")?.into(), inter, &mut *min));
            }
            want.push((norm_out(&a.b, post_norm), h, &mut *bin));
            if !attn_in.has_fp8_t() {
                want.push((kept(&a.attn, "attn")?.into(), qd, &mut *attn_in));
            }
            want.push((norm_out(&a.a, in_norm), h, &mut *ain));
            let xs: Vec<_> = want.iter().map(|&(x, k, _)| (x, m, k, false)).collect();
            let qs = quantize_dual_multi(g, &xs)?;
            for ((_, q), (_, k, xo)) in qs.into_iter().zip(want) {
                xo.set_fp8_t(m, k, q)?;
            }
        }
        // MLP: out = h_mid + down(swiglu(gate(b), up(b))), b = norm(h_mid).
        // The down projection's DGrad output as cuBLASLt wrote it (BF16 in the
        // low-precision flows): swiglu's backward reads it without an epilogue.
        let dgrad = cx.precs().0;
        let dw_down = &mut grads.bufs[lx.down];
        let dy_down = dx16.as_ref().map_or(Dy::F32(&dx), Dy::Bf16);
        let dmm = linear_backward_raw(
            g,
            (dy_down, a.m.as_ref().into(), m),
            &lp.down,
            cx.precs(),
            dw_down,
            min,
        )?;
        // gate and up read one input b: its WGrad operand is made once. Their dy
        // leave swiglu's backward as the GEMMs' operands where DGrad and WGrad
        // share a low precision; in FP8, with their 128x1 operands side by side
        // for one WGrad of both.
        // With their W^T stacked (`GpuLayer::gu_st`) one DGrad too, which sums the
        // two projections' dx itself.
        let gu_t = lp.gu_st.as_ref().and_then(Stacked::fp8_t);
        let gu16 = lp.gu_st.as_ref().and_then(Stacked::bf16);
        let stack_gu = operand_dy(model) == Some(GemmPrecision::Fp8)
            && (gu_t.is_some() || stack_wgrad(model, GemmPrecision::Fp8, h, &[inter, inter]));
        // The BF16 flows: gate's and up's dy as the column halves of one operand,
        // for one WGrad and (their weights stacked) one DGrad.
        let stack_gu16 = stack_wgrad(model, GemmPrecision::Bf16, h, &[inter, inter]);
        // The DGrad outputs (one, or one a projection) and, where gate's and up's
        // WGrad is one GEMM, its output for their gradients to hold.
        let (outs, dw) = if let (true, GemmOut::Bf16(d, ld)) = (stack_gu16, &dmm) {
            let dh = SwigluDh::Bf16(d, *ld);
            let (gu, up) = (a.gate.view(), a.up.view());
            let st = swiglu_backward_bf16_stacked(g, dh, gu, up, (m, inter))?;
            drop(dmm);
            let dy = (&st, 2 * inter);
            let outs = dgrad_bf16(g, dy, &[&lp.gate, &lp.up], gu16, (m, h))?;
            (
                outs,
                Some(wgrad_bf16_stacked(g, dy, (a.b.as_ref().into(), m, h), bin)?),
            )
        } else if let (true, GemmOut::Bf16(d, ld)) = (stack_gu, &dmm) {
            let dh = SwigluDh::Bf16(d, *ld);
            let (gu, up) = (a.gate.view(), a.up.view());
            let stack_rows = gu_t.is_some();
            let (rows, col) = swiglu_backward_fp8_stacked(g, dh, gu, up, (m, inter), stack_rows)?;
            drop(dmm);
            let outs = dgrad_fp8(g, rows, &[&lp.gate, &lp.up], gu_t, m)?;
            (
                outs,
                Some(wgrad_fp8_stacked(
                    g,
                    &col,
                    (a.b.as_ref().into(), m, h),
                    bin,
                )?),
            )
        } else {
            let (gb, ub, gq, uq, gf, uf, dmf);
            let (dgate, dup) = match (operand_dy(model), &dmm) {
                (Some(GemmPrecision::Bf16), GemmOut::Bf16(d, ld)) => {
                    let dh = SwigluDh::Bf16(d, *ld);
                    (gb, ub) = swiglu_backward_bf16(g, dh, a.gate.view(), a.up.view(), (m, inter))?;
                    (Dy::Bf16(&gb), Dy::Bf16(&ub))
                }
                (Some(GemmPrecision::Fp8), GemmOut::Bf16(d, ld)) => {
                    let dh = SwigluDh::Bf16(d, *ld);
                    (gq, uq) = swiglu_backward_fp8(g, dh, a.gate.view(), a.up.view(), (m, inter))?;
                    (Dy::Fp8(&gq), Dy::Fp8(&uq))
                }
                _ => {
                    dmf = dmm.finish(g, (m, inter), dgrad)?;
                    // The f32 op reads f32: BF16-kept gate and up widened (exact).
                    let (mut gw, mut uw) = (None, None);
                    let (gate, up) = (a.gate.as_f32(g, &mut gw)?, a.up.as_f32(g, &mut uw)?);
                    (gf, uf) = swiglu_backward(g, &dmf, gate, up, m * inter, round)?;
                    (Dy::F32(&gf), Dy::F32(&uf))
                }
            };
            drop(dmm);
            // db = gate's dx + up's dx, summed where the norm's backward reads it.
            let dbg = cx.linear_raw(
                dgate,
                (a.b.as_ref().into(), bin),
                &lp.gate,
                grads,
                (lx.gate, None),
            )?;
            let dbu = cx.linear_raw(
                dup,
                (a.b.as_ref().into(), bin),
                &lp.up,
                grads,
                (lx.up, None),
            )?;
            (vec![dbg, dbu], None)
        };
        if let Some(dw) = dw {
            grads.hold_blocks(g, &dw, &[(lx.gate, inter * h), (lx.up, inter * h)])?;
        }
        let post = (&a.h_mid, w.t(lx.post_attention_layernorm), &a.rstd2);
        let dw2 = grads.acc(g, lx.post_attention_layernorm)?;
        let outs: Vec<&GemmOut> = outs.iter().collect();
        let (dh_mid, dh16) = cx.norm_of_sum(&outs, post, (h, Some(&dx)), dw2, bf16_dy)?;

        // Attention: h_mid = x_in + o(attn(rope(norm(q(a))), rope(norm(k(a))), v(a))).
        // The o projection's DGrad output, read by the flash backward as its BF16
        // dO where it is BF16 without padding.
        let dattn_raw = cx.linear_raw(
            dh16.as_ref().map_or(Dy::F32(&dh_mid), Dy::Bf16),
            (a.attn.as_ref().into(), &mut *attn_in),
            &lp.o,
            grads,
            (lx.o, None),
        )?;
        // The attention's output as delta reads it: f32, or the BF16 values of the
        // o projection's operand where the forward kept only those.
        let attn_out: ActRef = match &a.attn {
            Some(o) => o.into(),
            None => attn_in
                .bf16_values(m, qd)
                .map(ActRef::Bf16)
                .ok_or_else(|| {
                    CudaError::Invalid(
                        "attention backward: neither the output nor its BF16 operand was kept"
                            .into(),
                    )
                })?,
        };
        let dattn_f32;
        let dout = match (&a.saved, dattn_raw.bf16_rows(qd)) {
            (AttnSaved::Flash(_), Some(d16)) => Dout::Bf16(d16),
            _ => {
                dattn_f32 = dattn_raw.finish(g, (m, qd), cx.precs().0)?;
                Dout::F32(&dattn_f32)
            }
        };
        let shape = model.attn_shape();
        let biases = [lx.q_bias, lx.k_bias, lx.v_bias];
        let no_bias = biases.iter().all(Option::is_none);
        // The BF16 flows: q's, k's and v's dy written by their producers (the q/k
        // norms' backward, the attention's) as the column blocks of one operand
        // `[m][q + k + v]`, for one WGrad and (their weights stacked) one DGrad.
        let qkv_ld = qd + 2 * kvd;
        // q's, k's and v's gradients, in the order of a stacked WGrad's row blocks.
        let qkv_parts = [(lx.q, lp.q.n * h), (lx.k, lp.k.n * h), (lx.v, lp.v.n * h)];
        let qkv16 = match (&a.saved, &acts.flash, lx.q_norm, lx.k_norm, &a.qk_pre) {
            (AttnSaved::Flash(_), Some(_), Some(_), Some(_), Some(_))
                if no_bias
                    && hd == 128
                    && acts.share.is_none()
                    && stack_wgrad(model, GemmPrecision::Bf16, h, &[qd, kvd, kvd]) =>
            {
                Some(stacked_dy_bf16(g, m, qkv_ld)?)
            }
            _ => None,
        };
        // dv in f32, or (None) its BF16 operand `dv16` alone where that is all that
        // is read: the kernel then writes no f32 dv.
        let mut dv16 = None;
        let (mut dq, mut dk, dv) = match (&a.saved, &acts.flash) {
            (AttnSaved::Flash(saved), Some(plan)) if qkv16.is_some() => {
                // dv leaves the kernel rounded, as its columns of the stacked dy.
                let st = qkv16.as_ref().expect("checked");
                let (outs, at) = ((dout, attn_out), (st, qd + kvd, qkv_ld));
                let (dq, dk) =
                    flash_backward_operand_at(g, plan, outs, saved, shape, cx.round(), at)?;
                (dq, dk, None)
            }
            (AttnSaved::Flash(saved), Some(plan)) if acts.share.is_some() => {
                // Shared prompt rows: the backward on the expanded sequences, dq, dk
                // and dv brought back to the rows (dv rounded where the flow rounds).
                let sh = acts.share.as_ref().expect("checked");
                let (dq, dk, dv) =
                    sh.backward(g, plan, (dout, attn_out), saved, shape, cx.round())?;
                (dq, dk, Some(dv))
            }
            (AttnSaved::Flash(saved), Some(plan)) if dy16 && no_bias => {
                // dv leaves the kernel rounded, as the v projection's BF16 dy alone.
                let outs = (dout, attn_out);
                let (dq, dk, v16) =
                    flash_backward_operand(g, plan, outs, saved, shape, cx.round())?;
                dv16 = Some(v16);
                (dq, dk, None)
            }
            (AttnSaved::Flash(saved), Some(plan)) => {
                // dv leaves the kernel rounded where the flow rounds gradients.
                let (dq, dk, dv) =
                    flash_backward(g, plan, dout, attn_out, saved, shape, cx.round())?;
                (dq, dk, Some(dv))
            }
            (AttnSaved::Probs(p), _) => {
                let Dout::F32(dattn) = dout else {
                    return Err(CudaError::Invalid(
                        "attention backward: probabilities kept but dO not in f32".into(),
                    ));
                };
                let Some([q, k, v]) = &a.qkv else {
                    return Err(CudaError::Invalid(
                        "attention backward: probabilities kept but not q, k, v".into(),
                    ));
                };
                let (dq, dk, dv) = attention_backward(g, dattn, q, k, v, p, &acts.seq_lens, shape)?;
                (dq, dk, Some(cx.lp(dv)?))
            }
            (AttnSaved::Flash(_), None) => {
                return Err(CudaError::Invalid(
                    "attention backward: log-sum-exp kept but no tile plan".into(),
                ))
            }
        };
        let pos = &acts.rows.positions;
        let qk_norms = (lx.q_norm, lx.k_norm, a.qk_pre.as_ref());
        if let (Some(st), (Some(qn), Some(kn), Some((q_pre, k_pre, q_rstd, k_rstd)))) =
            (&qkv16, qk_norms)
        {
            // q's and k's norm and RoPE backward in one launch, into their columns.
            let (qp, kp) = (q_pre.view(), k_pre.view());
            let (qi, ki) = ((&dq, qp, w.t(qn), q_rstd), (&dk, kp, w.t(kn), k_rstd));
            let accs = grads.acc2(g, qn, kn)?;
            let (rope, dims, at) = ((pos, &*model.rope), (m, [nh, nkv]), (st, qkv_ld));
            qk_norm_rope_backward_pair_stacked(g, [qi, ki], rope, dims, round, accs, at)?;
            drop((dq, dk, dv));
            let w16 = lp.qkv_st.as_ref().and_then(Stacked::bf16);
            let dy = (st, qkv_ld);
            let outs = dgrad_bf16(g, dy, &[&lp.q, &lp.k, &lp.v], w16, (m, h))?;
            let dw = wgrad_bf16_stacked(g, dy, (a.a.as_ref().into(), m, h), ain)?;
            grads.hold_blocks(g, &dw, &qkv_parts)?;
            drop((qkv16, dw));
            let inorm = (&a.x_in, w.t(lx.input_layernorm), &a.rstd1);
            let dw1 = grads.acc(g, lx.input_layernorm)?;
            let outs: Vec<&GemmOut> = outs.iter().collect();
            (dx, dx16) = cx.norm_of_sum(&outs, inorm, (h, Some(&dh_mid)), dw1, bf16_dy)?;
            continue;
        }
        // q's and k's dy as BF16 operands (the bias gradients read dy in f32).
        let (mut dq16, mut dk16) = (None, None);
        if let (Some(qn), Some(kn), Some((q_pre, k_pre, q_rstd, k_rstd))) = qk_norms {
            if hd == 128 {
                // RoPE's and the norms' backward in one pass each (the same bits).
                let (qp, kp) = (q_pre.view(), k_pre.view());
                let (qi, ki) = ((&dq, qp, w.t(qn), q_rstd), (&dk, kp, w.t(kn), k_rstd));
                let rope = (pos, &*model.rope);
                // With BF16 operands only those are written (nothing reads the f32
                // values): dq, dk then stay the attention's gradients, read no further.
                let b16 = dy16 && no_bias;
                // q and k in one launch (the bits of one each).
                let accs = grads.acc2(g, qn, kn)?;
                let [gq, gk] = qk_norm_rope_backward_pair(
                    g,
                    [qi, ki],
                    rope,
                    (m, [nh, nkv]),
                    round,
                    accs,
                    b16,
                )?;
                match gq {
                    QkNormGrad::F32(d) => dq = d,
                    QkNormGrad::Bf16(d) => dq16 = Some(d),
                }
                match gk {
                    QkNormGrad::F32(d) => dk = d,
                    QkNormGrad::Bf16(d) => dk16 = Some(d),
                }
            } else {
                rope_backward_dev(g, &mut dq, pos, (m, nh), &model.rope, round)?;
                rope_backward_dev(g, &mut dk, pos, (m, nkv), &model.rope, round)?;
                // The f32 norm backward reads f32 x: BF16-kept q, k widened (exact).
                let (mut qf, mut kf) = (None, None);
                let (qp, kp) = (q_pre.as_f32(g, &mut qf)?, k_pre.as_f32(g, &mut kf)?);
                let (qi, ki) = ((&dq, qp, w.t(qn), q_rstd), (&dk, kp, w.t(kn), k_rstd));
                let rq = (round, None);
                let dqp = rmsnorm_backward_acc(g, qi, (m * nh, hd), rq, grads.acc(g, qn)?)?;
                let dkp = rmsnorm_backward_acc(g, ki, (m * nkv, hd), rq, grads.acc(g, kn)?)?;
                (dq, dk) = (dqp, dkp);
            }
        } else {
            rope_backward_dev(g, &mut dq, pos, (m, nh), &model.rope, round)?;
            rope_backward_dev(g, &mut dk, pos, (m, nkv), &model.rope, round)?;
        }
        // q, k and v read one input a. Their dy's FP8 operands (FP8 DGrad and
        // WGrad, no biases: those read dy in f32) in one launch, from the BF16
        // values where their producers stored them so; their 128x1 operands side
        // by side for one WGrad of the three where the shapes allow.
        let inorm = (&a.x_in, w.t(lx.input_layernorm), &a.rstd1);
        let qkv_t = lp.qkv_st.as_ref().and_then(Stacked::fp8_t);
        if operand_dy(model) == Some(GemmPrecision::Fp8)
            && no_bias
            && (qkv_t.is_some() || stack_wgrad(model, GemmPrecision::Fp8, h, &[qd, kvd, kvd]))
        {
            let xs = [
                (values(&dq16, &dq).into(), qd),
                (values(&dk16, &dk).into(), kvd),
                (dv_values(&dv16, &dv)?.into(), kvd),
            ];
            let (rows, col) = quantize_dual_stacked(g, &xs, m, qkv_t.is_some())?;
            drop((dq, dk, dv, dq16, dk16, dv16));
            let outs = dgrad_fp8(g, rows, &[&lp.q, &lp.k, &lp.v], qkv_t, m)?;
            let dw = wgrad_fp8_stacked(g, &col, (a.a.as_ref().into(), m, h), ain)?;
            grads.hold_blocks(g, &dw, &qkv_parts)?;
            drop((col, dw));
            let dw1 = grads.acc(g, lx.input_layernorm)?;
            let outs: Vec<&GemmOut> = outs.iter().collect();
            (dx, dx16) = cx.norm_of_sum(&outs, inorm, (h, Some(&dh_mid)), dw1, bf16_dy)?;
            continue;
        }
        let (qq, kq, vq);
        let (dyq, dyk, dyv) = if operand_dy(model) == Some(GemmPrecision::Fp8) && no_bias {
            let xs = [
                (values(&dq16, &dq).into(), m, qd, true),
                (values(&dk16, &dk).into(), m, kvd, true),
                (dv_values(&dv16, &dv)?.into(), m, kvd, true),
            ];
            let mut qs = quantize_dual_multi(g, &xs)?.into_iter();
            let mut next = || match qs.next() {
                Some((Some(row), col)) => Ok(DualFp8 { row, col }),
                _ => Err(CudaError::Invalid(
                    "quantize_dual_multi returned fewer operands than asked".into(),
                )),
            };
            (qq, kq, vq) = (next()?, next()?, next()?);
            (Dy::Fp8(&qq), Dy::Fp8(&kq), Dy::Fp8(&vq))
        } else {
            let q = dq16.as_ref().map_or(Dy::F32(&dq), Dy::Bf16);
            let k = dk16.as_ref().map_or(Dy::F32(&dk), Dy::Bf16);
            let v = match dv_values(&dv16, &dv)? {
                ActRef::Bf16(b) => Dy::Bf16(b),
                ActRef::F32(f) => Dy::F32(f),
            };
            (q, k, v)
        };
        // da = q's dx + k's dx + v's dx, summed where the norm's backward reads it.
        let daq = cx.linear_raw(
            dyq,
            (a.a.as_ref().into(), ain),
            &lp.q,
            grads,
            (lx.q, lx.q_bias),
        )?;
        let dak = cx.linear_raw(
            dyk,
            (a.a.as_ref().into(), ain),
            &lp.k,
            grads,
            (lx.k, lx.k_bias),
        )?;
        let dav = cx.linear_raw(
            dyv,
            (a.a.as_ref().into(), ain),
            &lp.v,
            grads,
            (lx.v, lx.v_bias),
        )?;
        let dw1 = grads.acc(g, lx.input_layernorm)?;
        let outs = [&daq, &dak, &dav];
        (dx, dx16) = cx.norm_of_sum(&outs, inorm, (h, Some(&dh_mid)), dw1, bf16_dy)?;
    }
    embedding_backward_into(
        g,
        grads.acc_scatter(g, w.ix.embed)?,
        cfg.vocab_size,
        h,
        &acts.tokens,
        &dx,
    )
}

/// A norm's output as FP8's WGrad quantizes it: its f32 values where the forward
/// kept them, else made again from the norm's `(x, w, rstd)` (the forward's
/// `rmsnorm_operand`, which kept no f32 output: the same bits).
fn norm_out<'a>(
    y: &'a Option<CudaSlice<f32>>,
    (x, w, rstd): (&'a CudaSlice<f32>, &'a CudaSlice<f32>, &'a CudaSlice<f32>),
) -> DualIn<'a> {
    y.as_ref().map_or(DualIn::Norm { x, w, rstd }, DualIn::from)
}

/// A gradient's values: its BF16 copy where its producer wrote one, else its f32.
fn values<'a>(b16: &'a Option<CudaSlice<u16>>, f: &'a CudaSlice<f32>) -> ActRef<'a> {
    b16.as_ref().map_or(ActRef::F32(f), ActRef::Bf16)
}

/// dv's values: the BF16 operand where the attention's backward wrote that alone,
/// else its f32 dv.
fn dv_values<'a>(
    b16: &'a Option<CudaSlice<u16>>,
    f: &'a Option<CudaSlice<f32>>,
) -> Result<ActRef<'a>> {
    match (b16, f) {
        (Some(b), _) => Ok(ActRef::Bf16(b)),
        (None, Some(f)) => Ok(ActRef::F32(f)),
        (None, None) => Err(CudaError::Invalid(
            "attention backward: dv written neither as f32 nor as BF16".into(),
        )),
    }
}

/// An activation FP8's WGrad quantizes from its f32 values, which its forward kept
/// (SwiGLU's output where its kernel did not make the 128x1 groups itself).
fn kept<'a>(x: &'a Option<CudaSlice<f32>>, what: &str) -> Result<&'a CudaSlice<f32>> {
    x.as_ref()
        .ok_or_else(|| CudaError::Invalid(format!("FP8 WGrad: {what} was not kept in f32")))
}
