//! The layer stack on the GPU, shared by training, prefill and decode (as
//! `transformer::layers` on the CPU): norms, projections, RoPE and the MLP for
//! any set of rows, with the attention itself left to a strategy.

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::act::Act;
use jet_kernels::cuda::flash::{attention_operand_bf16, FlashSaved};
use jet_kernels::cuda::linear::{
    forward_writes_bf16, gate_up_swiglu, linear_forward, linear_forward_act, linear_forward_group,
    linear_forward_group_act, linear_forward_into, linear_forward_residual, linear_residual_norm,
    qkv_partials, rmsnorm_with_operand_opt, swiglu_with_dual, swiglu_with_operand_opt, QkvPartials,
    XIn, XOperand,
};
use jet_kernels::cuda::ops::{
    embedding_forward_dev, qk_norm_rope, qk_norm_rope_bf16, qk_norm_rope_fits, rmsnorm_forward,
    rope_forward_dev, upload_positions, upload_tokens,
};
use jet_kernels::cuda::quantize::dual_fills_gpu;
use jet_kernels::cuda::tensor::gather_rows;
use jet_kernels::cuda::{CudaError, Result};
use jet_kernels::{GemmPrecision, GemmRole};

use super::model::GpuModel;

/// An attention's output, what it keeps for the backward, and the o
/// projection's operand of its output (empty where it made none).
pub type Attended = (CudaSlice<f32>, Option<AttnSaved>, XOperand);

/// Qwen3's q, k before the per-head norm (f32, or the BF16 values their
/// projections stored: the same numbers in half the bytes) and the norms' rstd.
pub type QkPre = (Act, Act, CudaSlice<f32>, CudaSlice<f32>);

/// What one layer's backward needs; M rows.
pub struct GpuLayerActs {
    /// Residual entering the layer `[M, hidden]`, input norm output and rstd.
    pub x_in: CudaSlice<f32>,
    /// f32 where a GEMM reads it so (the f32 flow; FP8 forward GEMMs with another
    /// WGrad); None where its operands are all that is read (the BF16 copy in
    /// `ops`; FP8 WGrad remakes its 128x1 groups from x_in, the weight and rstd1,
    /// `DualIn::Norm`). So b.
    pub a: Option<CudaSlice<f32>>,
    pub rstd1: CudaSlice<f32>,
    /// q, k before the per-head norm and its rstd (Qwen3 only).
    pub qk_pre: Option<QkPre>,
    /// Attention inputs after norm and RoPE, q `[M, nh*hd]`, k, v `[M, nkv*hd]`:
    /// kept where the attention's backward reads them in f32 (the per-row
    /// kernels, [`AttnSaved::Probs`]); the tensor-core kernels keep BF16 copies.
    pub qkv: Option<[CudaSlice<f32>; 3]>,
    /// What the attention backward needs beyond q, k, v and its output.
    pub saved: AttnSaved,
    /// Attention output `[M, nh*hd]` (None where only its BF16 values were kept,
    /// the o projection's operand in `ops[1]`: a BF16 flow's training), residual
    /// after attention, its norm and rstd.
    pub attn: Option<CudaSlice<f32>>,
    pub h_mid: CudaSlice<f32>,
    pub b: Option<CudaSlice<f32>>,
    pub rstd2: CudaSlice<f32>,
    /// MLP gate, up `[M, inter]` (BF16 values where the rows GEMM kept them so)
    /// and the swiglu output (None where only its operands are read: the BF16
    /// flows, and FP8 training, whose SwiGLU makes m's 128x1 groups itself).
    pub gate: Act,
    pub up: Act,
    pub m: Option<CudaSlice<f32>>,
    /// What the backward reuses of the forward's operands of a, attn, b and m:
    /// the BF16 copies (the BF16 flows' WGrad operands) and, in FP8 training, m's
    /// 128x1 groups (`swiglu_with_dual`), [`XOperand::for_backward`].
    pub ops: [XOperand; 4],
}

/// What one layer's attention keeps for its backward.
pub enum AttnSaved {
    /// Per-row kernels (f32 flow): the softmax probabilities of the packed sequences.
    Probs(CudaSlice<f32>),
    /// Tensor-core kernels: each row's log2-sum-exp and the BF16 operands.
    Flash(FlashSaved),
}

/// The attention of one layer for all M rows: q `[M, nh*hd]`, k, v `[M, nkv*hd]`
/// after norm and RoPE -> output `[M, nh*hd]` and, when training, what the
/// backward needs.
pub trait GpuAttention {
    fn attend(
        &mut self,
        layer: usize,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
    ) -> Result<(CudaSlice<f32>, Option<AttnSaved>)>;

    /// [`GpuAttention::attend`] and, where the attention makes it, the o
    /// projection's operand of its output for GEMMs in `prec` (else an empty one,
    /// made by the projection).
    fn attend_operand(
        &mut self,
        layer: usize,
        (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
        _prec: GemmPrecision,
    ) -> Result<(CudaSlice<f32>, Option<AttnSaved>, XOperand)> {
        let (o, saved) = self.attend(layer, q, k, v)?;
        Ok((o, saved, XOperand::default()))
    }

    /// [`GpuAttention::attend_operand`] of the q, k, v that `qkv`'s epilogue
    /// makes, where this attention runs that epilogue inside its own launch (a
    /// captured decode step's); `None` (nothing launched) where it does not, and
    /// the caller runs [`QkvPartials::norm_rope`] then `attend_operand`.
    fn attend_qkv(
        &mut self,
        _layer: usize,
        _qkv: &QkvPartials,
        _prec: GemmPrecision,
    ) -> Result<Option<Attended>> {
        Ok(None)
    }

    /// Whether [`GpuAttention::attend_bf16`] takes q, k, v as BF16 copies made by
    /// their producers (the full-sequence tensor-core kernels).
    fn takes_bf16(&self) -> bool {
        false
    }

    /// [`GpuAttention::attend_operand`] of `[q16, k16, v16]`, the BF16 copies of
    /// q, k, v (the bits the f32 form's conversion would make), where
    /// [`GpuAttention::takes_bf16`]. `f32_out` false: no f32 output where the
    /// operand is BF16 (a BF16 training forward: the o projection and the
    /// backward read the output's BF16 values in the operand); `None` then.
    fn attend_bf16(
        &mut self,
        _layer: usize,
        _qkv16: [CudaSlice<u16>; 3],
        _prec: GemmPrecision,
        _f32_out: bool,
    ) -> Result<(Option<CudaSlice<f32>>, Option<AttnSaved>, XOperand)> {
        Err(CudaError::Invalid(
            "this attention takes q, k, v in f32 only".into(),
        ))
    }
}

/// The M rows a layer stack runs, on the device: each row's token and position
/// (i32), uploaded once for every layer (and the backward), or rewritten in
/// place before each replay of a captured decode step.
pub struct RowsIn {
    pub tokens: CudaSlice<i32>,
    pub positions: CudaSlice<i32>,
    pub m: usize,
}

impl RowsIn {
    /// Check `tokens` against the vocabulary and `positions` against the RoPE
    /// table, and upload both.
    pub fn upload(model: &GpuModel, tokens: &[u32], positions: &[usize]) -> Result<RowsIn> {
        if tokens.len() != positions.len() {
            return Err(CudaError::Invalid(format!(
                "{} tokens for {} positions",
                tokens.len(),
                positions.len()
            )));
        }
        Ok(RowsIn {
            tokens: upload_tokens(&model.gpu, tokens, model.cfg.vocab_size)?,
            positions: upload_positions(&model.gpu, positions, &model.rope)?,
            m: tokens.len(),
        })
    }
}

/// Embed the rows' tokens, run every layer; returns the residual before the
/// final norm `[M, hidden]`. Row r sits at position `rows.positions[r]`.
pub fn run_layers(
    model: &GpuModel,
    rows: &RowsIn,
    role: GemmRole,
    attn: &mut dyn GpuAttention,
    mut acts: Option<&mut Vec<GpuLayerActs>>,
) -> Result<CudaSlice<f32>> {
    let (g, cfg, w) = (&*model.gpu, model.cfg, model.w);
    let (m, h, eps) = (rows.m, cfg.hidden_size, cfg.rms_norm_eps);
    let prec = model.flow.precision(role);
    let mut x = embedding_forward_dev(g, w.t(w.ix.embed), cfg.vocab_size, h, &rows.tokens, m)?;
    // A pass that keeps nothing for a backward (rollout) runs a split-K
    // projection's epilogue inside the kernel after it (`linear::fused`): the
    // same bits, fewer launches. The next layer's input norm, when the down
    // projection made it so:
    let fuse = acts.is_none();
    // A pass that keeps its activations (training) writes the norms' and SwiGLU's
    // outputs only as the operands its GEMMs read, where those are BF16
    // (`*_with_operand_opt`): their f32 values would be read by nothing. The fused
    // paths of a pass that keeps nothing read them.
    let keep_f32 = fuse;
    // A training pass whose forward and WGrad GEMMs are FP8 keeps no f32 norm or
    // SwiGLU outputs either: SwiGLU's kernel makes both FP8 operands of its output
    // (`swiglu_with_dual`), and the backward quantizes the norms' outputs made
    // again from x, w and rstd (`DualIn::Norm`). FP8 forward GEMMs with another
    // WGrad keep the norms' f32 outputs for it.
    let wgrad_fp8 = model.flow.precision(GemmRole::WGrad) == GemmPrecision::Fp8;
    let dual_m = acts.is_some() && prec == GemmPrecision::Fp8 && wgrad_fp8;
    // The attention's output `[m, qd]`, which the o projection reads.
    let qd = cfg.num_attention_heads * cfg.head_dim;
    let keep_norm = keep_f32 || (prec == GemmPrecision::Fp8 && !wgrad_fp8);
    // The tensor-core attention's f32 output: read by the fused paths, FP8's
    // quantizers and the backward's delta; a BF16 training pass keeps only its
    // BF16 values (the o projection's operand, which WGrad and delta read too).
    let wgrad_bf16 = model.flow.precision(GemmRole::WGrad) == GemmPrecision::Bf16;
    let attn_f32 = keep_f32 || prec != GemmPrecision::Bf16 || !wgrad_bf16 || !attn_out16();
    // The o and down projections' split-K epilogue, residual add and the next norm
    // with its operand in one launch (`linear_residual_norm`: the bits of the
    // three launches) in a training pass too, where those projections take split-K
    // (micro-batches of a few hundred rows: `gemv::split_k_pays`): its output's f32
    // values kept only where the unfused path keeps them.
    let fuse_norm = fuse || (keep_norm_fused() && acts.is_some());
    let mut next_in = None;
    for (li, (lx, lp)) in w.ix.layers.iter().zip(&model.layers).enumerate() {
        // q, k and v read one low-precision copy of a, made by the norm; gate and up
        // one of b.
        let (a, rstd1, mut ao) = match next_in.take() {
            Some((a, rstd, ao)) => (a, rstd, ao),
            None => {
                let iw = w.t(lx.input_layernorm);
                rmsnorm_with_operand_opt(g, &x, iw, (m, h), eps, prec, keep_norm)?
            }
        };
        // Qwen3 in a decode step: the three projections in one GEMM launch, their
        // epilogues with the q/k norms and RoPE inside the attention's launch
        // (`attend_qkv`), else in one more.
        let biased = lx.q_bias.is_some() || lx.k_bias.is_some() || lx.v_bias.is_some();
        let fused_qkv = match (fuse && !biased, lx.q_norm, lx.k_norm) {
            (true, Some(qn), Some(kn)) => {
                let ws = (&lp.q, &lp.k, &lp.v);
                let norms = (w.t(qn), w.t(kn), eps);
                let rope = (&rows.positions, &*model.rope);
                qkv_partials(g, f32_of(&a, "a")?, &mut ao, m, ws, norms, rope, prec)?
            }
            _ => None,
        };
        // A full-sequence forward (training, scoring, a rollout's prefill; Qwen3,
        // tensor-core attention): q and k leave their norms and v its GEMM as the
        // attention's BF16 operands, with no f32 copy (a prefill's cache takes k
        // and v as they are: `KvRows::Bf16`).
        let qk_norms =
            lx.q_norm.is_some() && lx.k_norm.is_some() && qk_norm_rope_fits(cfg.head_dim);
        let bf16_attn = !biased && qk_norms && attn.takes_bf16();
        let some = |(o, saved, oo): Attended| (Some(o), saved, oo);
        let (qkv, qk_pre, (o, saved, mut oo)) = match fused_qkv {
            Some(p) => match attn.attend_qkv(li, &p, prec)? {
                Some(out) => (None, None, some(out)),
                None => {
                    let [q, k, v] = p.norm_rope(g)?;
                    let out = attn.attend_operand(li, (&q, &k, &v), prec)?;
                    (Some([q, k, v]), None, some(out))
                }
            },
            None if bf16_attn => {
                let (qkv16, pre) = qkv_bf16(model, li, rows, (a.as_ref().into(), &mut ao), prec)?;
                (
                    None,
                    Some(pre),
                    attn.attend_bf16(li, qkv16, prec, attn_f32)?,
                )
            }
            None => {
                let (q, k, v, pre) =
                    qkv_unfused(model, li, rows, (a.as_ref().into(), &mut ao), prec)?;
                let out = attn.attend_operand(li, (&q, &k, &v), prec)?;
                (Some([q, k, v]), pre, some(out))
            }
        };
        let o_f32 = || {
            o.as_ref().ok_or_else(|| {
                CudaError::Invalid("the attention kept only its output's BF16 values".into())
            })
        };
        // f32 q, k, v only where the attention's backward reads them.
        let qkv = qkv.filter(|_| matches!(saved, Some(AttnSaved::Probs(_))));
        // FP8 forward and WGrad: both groupings of the attention's output in one
        // pass (the o projection reads the 1x128 ones now, its WGrad the 128x1),
        // in place of the 1x128 quantizer here and the 128x1 groups made again from
        // the kept f32 output in the backward (`quantize_dual_multi`), where that
        // pass fills the GPU: at 8 x 512 tokens it took 0.34 ms from a 0.6B step,
        // while in a GRPO-shaped step's micro-batches (256 rows, 32 tiles) it
        // added ~2 ms (forty-eighth session, H100).
        if dual_m && dual_fills_gpu(g, m, qd) {
            oo.make_dual(g, o_f32()?, m, qd)?;
        }
        // The residual adds ride in the o and down projections' epilogues.
        let post = (w.t(lx.post_attention_layernorm), eps);
        let o_norm = match fuse_norm {
            true => linear_residual_norm(g, o.as_ref(), &mut oo, m, &lp.o, prec, &x, post)?,
            false => None,
        };
        let (h_mid, b, rstd2, mut bo) = match o_norm {
            Some((h_mid, b, rstd2, bo)) => (h_mid, keep_norm.then_some(b), rstd2, bo),
            None => {
                let h_mid = linear_forward_residual(g, o.as_ref(), &mut oo, m, &lp.o, prec, &x)?;
                let (b, rstd2, bo) =
                    rmsnorm_with_operand_opt(g, &h_mid, post.0, (m, h), eps, prec, keep_norm)?;
                (h_mid, b, rstd2, bo)
            }
        };
        let gate_up = (&lp.gate, &lp.up);
        let swiglu = match fuse {
            true => gate_up_swiglu(g, f32_of(&b, "b")?, &mut bo, m, gate_up, prec)?,
            false => None,
        };
        // gate and up themselves: only where a backward keeps them.
        let (gate, up, mm, mut mo) = match swiglu {
            Some((mm, mo)) => (None, None, Some(mm), mo),
            None => {
                // Kept as their BF16 values where the rows GEMM makes them: half
                // the bytes written, read by swiglu and kept for its backward.
                let gu = [(gate_up.0, None), (gate_up.1, None)];
                let [gate, up]: [_; 2] =
                    linear_forward_group_act(g, b.as_ref(), &mut bo, m, &gu, prec)?
                        .try_into()
                        .map_err(|_| CudaError::Invalid("gate, up: two outputs expected".into()))?;
                let inter = cfg.intermediate_size;
                let (gv, uv) = (gate.view(), up.view());
                let (mm, mo) = match dual_m {
                    true => (None, swiglu_with_dual(g, gv, uv, (m, inter))?),
                    false => swiglu_with_operand_opt(g, gv, uv, (m, inter), prec, keep_f32)?,
                };
                (Some(gate), Some(up), mm, mo)
            }
        };
        // The last layer's output goes to the final norm (`head`, its own kernel).
        let next_norm = match li + 1 < model.layers.len() {
            true => w.ix.layers.get(li + 1),
            false => None,
        }
        .map(|nx| (w.t(nx.input_layernorm), eps));
        let down_norm = match (fuse_norm, next_norm) {
            (true, Some(nn)) => {
                linear_residual_norm(g, mm.as_ref(), &mut mo, m, &lp.down, prec, &h_mid, nn)?
            }
            _ => None,
        };
        let out = match down_norm {
            Some((out, a, rstd, ao)) => {
                next_in = Some((keep_norm.then_some(a), rstd, ao));
                out
            }
            None => linear_forward_residual(g, mm.as_ref(), &mut mo, m, &lp.down, prec, &h_mid)?,
        };
        let x_in = std::mem::replace(&mut x, out);
        if let Some(acts) = acts.as_deref_mut() {
            acts.push(GpuLayerActs {
                x_in,
                a,
                rstd1,
                qk_pre,
                qkv,
                saved: saved.ok_or_else(|| {
                    CudaError::Invalid("the attention kept nothing for the backward".into())
                })?,
                attn: o,
                h_mid,
                b,
                rstd2,
                gate: gate.ok_or_else(kept)?,
                up: up.ok_or_else(kept)?,
                m: mm,
                ops: [ao, oo, bo, mo].map(XOperand::for_backward),
            });
        }
    }
    Ok(x)
}

/// Whether a training pass takes `linear_residual_norm` where its projections take
/// split-K: on unless `JET_TRAIN_FUSED_NORM=0` (a measurement switch; the same bits).
fn keep_norm_fused() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| jet_kernels::cuda::switch_on("JET_TRAIN_FUSED_NORM"))
}

/// Whether a BF16 training pass keeps the attention's output as its BF16 values
/// alone: on unless `JET_ATTN_OUT16=0` (a measurement switch; the f32 output then
/// feeds the backward's delta as before).
fn attn_out16() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| jet_kernels::cuda::switch_on("JET_ATTN_OUT16"))
}

/// q, k, v after norm and RoPE `[M, heads * hd]`, and q, k before.
type Qkv = (
    CudaSlice<f32>,
    CudaSlice<f32>,
    CudaSlice<f32>,
    Option<QkPre>,
);

/// Layer `li`'s q, k and v of the normed rows `a` (operand in `ao`) as
/// separate kernels: one GEMM and one epilogue launch for the three where a
/// decode step's split-K path allows (each output's bits those of its own
/// launch), then the q/k norms (Qwen3) and RoPE. Returns (q, k, v, the q and k
/// before their norms with the norms' rstd).
fn qkv_unfused(
    model: &GpuModel,
    li: usize,
    rows: &RowsIn,
    (a, ao): (XIn, &mut XOperand),
    prec: GemmPrecision,
) -> Result<Qkv> {
    let (g, cfg, w) = (&*model.gpu, model.cfg, model.w);
    let (lx, lp) = (&w.ix.layers[li], &model.layers[li]);
    let (m, hd, eps) = (rows.m, cfg.head_dim, cfg.rms_norm_eps);
    let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let qkv = [
        (&lp.q, w.opt(lx.q_bias)),
        (&lp.k, w.opt(lx.k_bias)),
        (&lp.v, w.opt(lx.v_bias)),
    ];
    let [mut q, mut k, v]: [_; 3] = linear_forward_group(g, a, ao, m, &qkv, prec)?
        .try_into()
        .map_err(|_| CudaError::Invalid("q, k, v: three outputs expected".into()))?;
    let mut qk_pre = None;
    match (lx.q_norm, lx.k_norm) {
        // Qwen3: the per-head norms and RoPE in one kernel.
        (Some(qn), Some(kn)) if qk_norm_rope_fits(hd) => {
            let norms = (w.t(qn), w.t(kn));
            let pos = &rows.positions;
            let (qq, kk, qr, kr) =
                qk_norm_rope(g, (&q, &k), norms, (m, nh, nkv), eps, pos, &model.rope)?;
            let (q_pre, k_pre) = (std::mem::replace(&mut q, qq), std::mem::replace(&mut k, kk));
            qk_pre = Some((Act::F32(q_pre), Act::F32(k_pre), qr, kr));
        }
        (qn, kn) => {
            if let (Some(qn), Some(kn)) = (qn, kn) {
                let (qq, qr) = rmsnorm_forward(g, &q, w.t(qn), m * nh, hd, eps)?;
                let (kk, kr) = rmsnorm_forward(g, &k, w.t(kn), m * nkv, hd, eps)?;
                let (q_pre, k_pre) = (std::mem::replace(&mut q, qq), std::mem::replace(&mut k, kk));
                qk_pre = Some((Act::F32(q_pre), Act::F32(k_pre), qr, kr));
            }
            rope_forward_dev(g, &mut q, &rows.positions, m, nh, &model.rope)?;
            rope_forward_dev(g, &mut k, &rows.positions, m, nkv, &model.rope)?;
        }
    }
    Ok((q, k, v, qk_pre))
}

/// Layer `li`'s q, k and v as the tensor-core attention's BF16 operands (Qwen3's
/// q/k norms, no biases): q and k from their GEMMs through `qk_norm_rope_bf16`,
/// v as its rows GEMM's BF16 values (converted where the GEMM wrote f32). The
/// same bits as [`qkv_unfused`] then the attention's f32 -> BF16 copies. Returns
/// them with q and k before their norms and the norms' rstd.
fn qkv_bf16(
    model: &GpuModel,
    li: usize,
    rows: &RowsIn,
    (a, ao): (XIn, &mut XOperand),
    prec: GemmPrecision,
) -> Result<([CudaSlice<u16>; 3], QkPre)> {
    let (g, cfg, w) = (&*model.gpu, model.cfg, model.w);
    let (lx, lp) = (&w.ix.layers[li], &model.layers[li]);
    let (m, eps) = (rows.m, cfg.rms_norm_eps);
    let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let (Some(qn), Some(kn)) = (lx.q_norm, lx.k_norm) else {
        return Err(CudaError::Invalid(
            "q, k, v as BF16 operands: the q/k norms are missing".into(),
        ));
    };
    // q and k before their norms as the BF16 values their GEMMs store where both
    // do (the low-precision flows' rows GEMMs and split-K epilogues), which the
    // norm's forward and the paired backward (`qk_norm_rope_bwd_x16`, heads of 128)
    // read: half the bytes written, kept and read twice; else f32. One form for
    // both, which the norm's kernels take (widening one to the other's f32 cost
    // more than it saved).
    let qk = [(&lp.q, None), (&lp.k, None)];
    let both16 = [&lp.q, &lp.k]
        .iter()
        .all(|w| forward_writes_bf16(g, m, w, prec));
    let pre: Vec<Act> = if cfg.head_dim == 128 && both16 && qk_pre_bf16() {
        linear_forward_group_act(g, a, ao, m, &qk, prec)?
    } else {
        linear_forward_group(g, a, ao, m, &qk, prec)?
            .into_iter()
            .map(Act::F32)
            .collect()
    };
    let [q_pre, k_pre]: [Act; 2] = pre
        .try_into()
        .map_err(|_| CudaError::Invalid("q, k: two outputs expected".into()))?;
    let [v]: [_; 1] = linear_forward_group_act(g, a, ao, m, &[(&lp.v, None)], prec)?
        .try_into()
        .map_err(|_| CudaError::Invalid("v: one output expected".into()))?;
    let norms = (w.t(qn), w.t(kn));
    let pre = (q_pre.view(), k_pre.view());
    let (q16, k16, qr, kr) = qk_norm_rope_bf16(
        g,
        pre,
        norms,
        (m, nh, nkv),
        eps,
        &rows.positions,
        &model.rope,
    )?;
    let v16 = match v {
        Act::Bf16(v16) => v16,
        Act::F32(v) => attention_operand_bf16(g, &v, m * nkv * cfg.head_dim)?,
    };
    Ok(([q16, k16, v16], (q_pre, k_pre, qr, kr)))
}

/// Whether the training forward keeps q and k before their norms as the BF16 values
/// their GEMMs store ([`qkv_bf16`]); on unless `JET_QK_PRE16=0` (f32, for comparison).
fn qk_pre_bf16() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| jet_kernels::cuda::switch_on("JET_QK_PRE16"))
}

/// The f32 values of an activation a fused (rollout) path reads, which such a
/// pass always writes.
fn f32_of<'a>(x: &'a Option<CudaSlice<f32>>, what: &str) -> Result<&'a CudaSlice<f32>> {
    x.as_ref().ok_or_else(|| {
        CudaError::Invalid(format!(
            "the fused layer path needs {what} in f32; it was not kept"
        ))
    })
}

/// A layer output that a pass keeping its activations always makes.
fn kept() -> CudaError {
    CudaError::Invalid("gate and up were fused away in a pass that keeps activations".into())
}

/// Final norm and LM head: `h [M, hidden]` -> (the head's input, rstd `[M]`,
/// logits): over every row (normed `[M, hidden]`, logits `[M, vocab]`), or over the
/// normed rows `rows` alone (`[R, hidden]`, `[R, vocab]`: with batch-invariant
/// GEMMs, the BF16 and FP8 flows' default, a row's logits are the same bits either
/// way, the norm and the head's GEMM working row by row).
pub fn head(
    model: &GpuModel,
    h: &CudaSlice<f32>,
    m: usize,
    role: GemmRole,
    rows: Option<&[usize]>,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>)> {
    let (n, r, rstd) = head_input(model, h, m, rows)?;
    let prec = model.flow.precision(role);
    let logits = linear_forward(&model.gpu, &n, r, &model.lm_head, None, prec)?;
    Ok((n, rstd, logits))
}

/// [`head`]'s logits written into `logits [m, vocab]` (a captured decode step's
/// output buffer, so no copy of them is made).
pub fn head_into(
    model: &GpuModel,
    h: &CudaSlice<f32>,
    m: usize,
    role: GemmRole,
    logits: &mut CudaSlice<f32>,
) -> Result<()> {
    let (n, _) = final_norm(model, h, m)?;
    let prec = model.flow.precision(role);
    linear_forward_into(&model.gpu, &n, m, &model.lm_head, prec, logits)
}

/// [`head`] with the logits kept as their BF16 values where the LM head's rows GEMM
/// writes them (the low-precision flows round them so): half of the largest
/// tensor of a training step (`[R, vocab]`), read twice by the log-prob kernels.
pub fn head_act(
    model: &GpuModel,
    h: &CudaSlice<f32>,
    m: usize,
    role: GemmRole,
    rows: Option<&[usize]>,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>, Act)> {
    let (n, r, rstd) = head_input(model, h, m, rows)?;
    let prec = model.flow.precision(role);
    let logits = linear_forward_act(&model.gpu, &n, r, &model.lm_head, None, prec)?;
    Ok((n, rstd, logits))
}

/// The final norm of `h [m, hidden]` and the head's input: every normed row, or
/// the rows `rows` of them gathered (`[R, hidden]`); with its row count and rstd `[m]`.
fn head_input(
    model: &GpuModel,
    h: &CudaSlice<f32>,
    m: usize,
    rows: Option<&[usize]>,
) -> Result<(CudaSlice<f32>, usize, CudaSlice<f32>)> {
    let (n, rstd) = final_norm(model, h, m)?;
    match rows {
        Some(rows) => {
            let x = gather_rows(&model.gpu, &n, model.cfg.hidden_size, rows)?;
            Ok((x, rows.len(), rstd))
        }
        None => Ok((n, m, rstd)),
    }
}

fn final_norm(
    model: &GpuModel,
    h: &CudaSlice<f32>,
    m: usize,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    let cfg = model.cfg;
    let norm = model.w.t(model.w.ix.norm);
    rmsnorm_forward(&model.gpu, h, norm, m, cfg.hidden_size, cfg.rms_norm_eps)
}
