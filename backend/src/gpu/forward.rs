//! The full-sequence forward on the GPU (training, scoring, rollout prefill).

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::act::Act;
use jet_kernels::cuda::attention::attention_forward;
use jet_kernels::cuda::flash::{
    flash_forward, flash_forward_operand, flash_forward_operand_bf16, FlashPlan, FwdOut,
};
use jet_kernels::cuda::linear::XOperand;
use jet_kernels::cuda::quantize::FusedOperand;
use jet_kernels::cuda::{CudaError, Result};
use jet_kernels::{GemmPrecision, GemmRole};

use super::layers::{head, head_act, run_layers, AttnSaved, GpuAttention, GpuLayerActs, RowsIn};
use super::model::GpuModel;
use super::share::{PromptShare, SharedRows};
use crate::transformer::check_head_rows;

/// Everything the backward needs, sequences packed one after another (where
/// prompts are shared, `tokens` and `rows` are the compact layout's rows and
/// `seq_lens` the expanded layout's sequences: [`super::share`]).
pub struct GpuActivations {
    pub tokens: Vec<u32>,
    pub seq_lens: Vec<usize>,
    /// The rows' tokens and positions on the device (RoPE's backward reads them).
    pub rows: RowsIn,
    pub layers: Vec<GpuLayerActs>,
    /// The tensor-core attention's tiles of this batch (None: per-row kernels);
    /// of the expanded layout where prompts are shared.
    pub flash: Option<FlashPlan>,
    /// Where sequences share their prompt's rows ([`super::share`]): the maps
    /// between the rows (compact) and the attention's sequences (expanded).
    pub share: Option<SharedRows>,
    /// Residual entering the final norm `[M, hidden]` and its rstd `[M]`.
    pub h_final: CudaSlice<f32>,
    pub rstd_final: CudaSlice<f32>,
    /// The LM head's input: the normed rows at `head_rows` `[R, hidden]`, or all
    /// `M` of them when `head_rows` is None.
    pub normed: CudaSlice<f32>,
    pub head_rows: Option<Vec<usize>>,
}

pub struct GpuForwardOut {
    /// `[R, vocab]` for the rows asked for (`head_rows`, in that order), else
    /// `[M, vocab]` sequence after sequence: f32, or their BF16 values when asked
    /// for and the LM head's rows GEMM writes them.
    pub logits: Act,
    pub acts: Option<GpuActivations>,
}

/// A layer's k, v `[M, nkv*hd]` after RoPE as the attention has them: f32, or
/// the tensor-core kernels' BF16 operands (the bits the BF16 cache rounds the
/// f32 values to).
pub(super) enum KvRows<'x> {
    F32(&'x CudaSlice<f32>, &'x CudaSlice<f32>),
    Bf16(&'x CudaSlice<u16>, &'x CudaSlice<u16>),
}

/// Receives each layer's k, v (to fill a KV cache).
pub(super) type KeepKv<'a> = dyn FnMut(usize, KvRows<'_>) -> Result<()> + 'a;

/// Causal attention within each sequence of a packed batch; hands each layer's
/// k, v (after RoPE) to `keep` when prefilling a KV cache.
pub(super) struct PackedCausal<'a> {
    pub seq_lens: &'a [usize],
    pub shape: jet_kernels::ops::attention::AttnShape,
    pub gpu: &'a jet_kernels::cuda::Gpu,
    pub keep_probs: bool,
    pub keep_kv: Option<&'a mut KeepKv<'a>>,
    /// Set when the model runs the tensor-core attention (one plan for all layers).
    pub flash: Option<FlashPlan>,
    /// Set where sequences share their prompt's rows: `seq_lens` and `flash` are
    /// then the expanded layout's, q, k, v and the output the compact rows.
    pub share: Option<SharedRows>,
}

impl<'a> PackedCausal<'a> {
    /// The attention of `model` over `seq_lens`, keeping what the backward needs
    /// when `keep`.
    pub fn new(
        model: &'a GpuModel,
        seq_lens: &'a [usize],
        keep: bool,
        keep_kv: Option<&'a mut KeepKv<'a>>,
    ) -> Result<PackedCausal<'a>> {
        let flash = match model.flash_attention() {
            true => Some(FlashPlan::new(&model.gpu, seq_lens)?),
            false => None,
        };
        Ok(PackedCausal {
            seq_lens,
            shape: model.attn_shape(),
            gpu: &model.gpu,
            keep_probs: keep,
            keep_kv,
            flash,
            share: None,
        })
    }
}

/// The attention's f32 output and its BF16 copy, either of which may be absent.
type OutForms = (Option<CudaSlice<f32>>, Option<CudaSlice<u16>>);

impl PackedCausal<'_> {
    /// The attention of one layer and, when `o16` and the tensor-core kernels run,
    /// the o projection's BF16 operand of its output, written by the attention
    /// itself (else an empty operand, made by the projection).
    fn run(
        &mut self,
        layer: usize,
        (q, k, v): (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
        o16: bool,
    ) -> Result<(CudaSlice<f32>, Option<AttnSaved>, XOperand)> {
        self.check_share()?;
        if let Some(keep) = self.keep_kv.as_mut() {
            keep(layer, KvRows::F32(k, v))?;
        }
        let keep = self.keep_probs;
        let Some(plan) = &self.flash else {
            let (o, p) = attention_forward(self.gpu, q, k, v, self.seq_lens, self.shape)?;
            return Ok((o, keep.then_some(AttnSaved::Probs(p)), XOperand::default()));
        };
        let (g, s) = (self.gpu, self.shape);
        let qkv;
        let (q, k, v) = match &self.share {
            Some(sh) => {
                qkv = sh.expand_qkv(g, s, [q, k, v])?;
                (&qkv[0], &qkv[1], &qkv[2])
            }
            None => (q, k, v),
        };
        let (o, saved, b) = if o16 {
            let (o, saved, b) = flash_forward_operand(g, plan, (q, k, v), s)?;
            (o, saved, Some(b))
        } else {
            let (o, saved) = flash_forward(g, plan, q, k, v, s)?;
            (o, saved, None)
        };
        let (o, b) = self.compact(o, b)?;
        Ok((
            o,
            keep.then_some(AttnSaved::Flash(saved)),
            self.o_operand(b),
        ))
    }

    /// The attention's output and its BF16 copy on the rows: as the kernel wrote
    /// them, or each row's first copy where prompts are shared.
    fn compact(
        &self,
        o: CudaSlice<f32>,
        o16: Option<CudaSlice<u16>>,
    ) -> Result<(CudaSlice<f32>, Option<CudaSlice<u16>>)> {
        match self.compact_opt(Some(o), o16)? {
            (Some(o), o16) => Ok((o, o16)),
            (None, _) => Err(CudaError::Invalid(
                "attention output lost in compaction".into(),
            )),
        }
    }

    /// [`PackedCausal::compact`] of an output that may have no f32 form.
    fn compact_opt(
        &self,
        o: Option<CudaSlice<f32>>,
        o16: Option<CudaSlice<u16>>,
    ) -> Result<OutForms> {
        let Some(sh) = &self.share else {
            return Ok((o, o16));
        };
        let qd = self.shape.n_heads * self.shape.head_dim;
        let o = o.map(|o| sh.compact(self.gpu, &o, qd)).transpose()?;
        let o16 = o16.map(|b| sh.compact(self.gpu, &b, qd)).transpose()?;
        Ok((o, o16))
    }

    /// Shared rows need the tensor-core attention (the per-row kernels would read
    /// the compact rows as whole sequences) and no KV cache (its rows are a
    /// sequence's own).
    fn check_share(&self) -> Result<()> {
        match (&self.share, &self.flash, &self.keep_kv) {
            (Some(_), None, _) => Err(CudaError::Invalid(
                "shared prompt rows need the tensor-core attention".into(),
            )),
            (Some(_), _, Some(_)) => Err(CudaError::Invalid(
                "shared prompt rows cannot fill a KV cache".into(),
            )),
            _ => Ok(()),
        }
    }

    /// Rows of q, k, v and the output.
    fn rows(&self) -> usize {
        match (&self.share, &self.flash) {
            (Some(sh), _) => sh.rows(),
            (None, Some(plan)) => plan.rows(),
            (None, None) => self.seq_lens.iter().sum(),
        }
    }

    /// The o projection's operand of the tensor-core attention's output: its BF16
    /// copy where the kernel wrote one, else empty (made by the projection).
    fn o_operand(&self, o16: Option<CudaSlice<u16>>) -> XOperand {
        match o16 {
            Some(b) => {
                let width = self.shape.n_heads * self.shape.head_dim;
                XOperand::fused(self.rows(), width, FusedOperand::Bf16(b))
            }
            None => XOperand::default(),
        }
    }
}

impl GpuAttention for PackedCausal<'_> {
    fn attend(
        &mut self,
        layer: usize,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
    ) -> Result<(CudaSlice<f32>, Option<AttnSaved>)> {
        let (o, saved, _) = self.run(layer, (q, k, v), false)?;
        Ok((o, saved))
    }

    /// The tensor-core attention writes the o projection's BF16 operand of its
    /// output itself (no copy of the f32 output).
    fn attend_operand(
        &mut self,
        layer: usize,
        qkv: (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
        prec: GemmPrecision,
    ) -> Result<(CudaSlice<f32>, Option<AttnSaved>, XOperand)> {
        self.run(layer, qkv, prec == GemmPrecision::Bf16)
    }

    fn takes_bf16(&self) -> bool {
        self.flash.is_some()
    }

    /// The tensor-core forward from the BF16 copies (kept for the backward; a
    /// prefill's cache takes k and v as they are), and the o projection's BF16
    /// operand of its output where its GEMMs are BF16.
    fn attend_bf16(
        &mut self,
        layer: usize,
        qkv16: [CudaSlice<u16>; 3],
        prec: GemmPrecision,
        f32_out: bool,
    ) -> Result<(Option<CudaSlice<f32>>, Option<AttnSaved>, XOperand)> {
        let Some(plan) = &self.flash else {
            return Err(CudaError::Invalid(
                "BF16 q, k, v: the attention needs its tensor-core kernels".into(),
            ));
        };
        self.check_share()?;
        if let Some(keep) = self.keep_kv.as_mut() {
            keep(layer, KvRows::Bf16(&qkv16[1], &qkv16[2]))?;
        }
        let (g, s) = (self.gpu, self.shape);
        let qkv16 = match &self.share {
            Some(sh) => sh.expand_qkv(g, s, [&qkv16[0], &qkv16[1], &qkv16[2]])?,
            None => qkv16,
        };
        let form = match (prec == GemmPrecision::Bf16, f32_out) {
            (false, _) => FwdOut::F32,
            (true, true) => FwdOut::F32Bf16,
            (true, false) => FwdOut::Bf16,
        };
        let (o, saved, b) = flash_forward_operand_bf16(g, plan, qkv16, s, form)?;
        let (o, b) = self.compact_opt(o, b)?;
        let op = self.o_operand(b);
        Ok((o, self.keep_probs.then_some(AttnSaved::Flash(saved)), op))
    }
}

/// Pack `seqs` (each from position 0): tokens, lengths, positions.
pub(super) fn pack(seqs: &[&[u32]]) -> (Vec<u32>, Vec<usize>, Vec<usize>) {
    let mut tokens = Vec::new();
    let mut lens = Vec::new();
    let mut positions = Vec::new();
    for s in seqs {
        lens.push(s.len());
        tokens.extend_from_slice(s);
        positions.extend(0..s.len());
    }
    (tokens, lens, positions)
}

/// Run `seqs` through the model; `keep_acts` keeps what the backward needs;
/// `bf16_logits` lets the logits stay BF16 values ([`head_act`]; the caller reads
/// them only through the log-prob kernels, which take either form).
pub fn forward(
    model: &GpuModel,
    seqs: &[&[u32]],
    role: GemmRole,
    keep_acts: bool,
    bf16_logits: bool,
) -> Result<GpuForwardOut> {
    forward_rows(model, seqs, role, (keep_acts, bf16_logits), None)
}

/// [`forward`] with the LM head over the packed rows `head_rows` only (distinct
/// rows whose logits are read: a trainer's scored rows), in that order; every row
/// still runs through the layers and the final norm. With batch-invariant GEMMs (the
/// BF16 and FP8 flows' default) a row's logits are the same bits either way ([`head`]).
pub fn forward_rows(
    model: &GpuModel,
    seqs: &[&[u32]],
    role: GemmRole,
    (keep_acts, bf16_logits): (bool, bool),
    head_rows: Option<&[usize]>,
) -> Result<GpuForwardOut> {
    let (tokens, seq_lens, positions) = pack(seqs);
    forward_from(
        model,
        (tokens, positions, seq_lens, None),
        role,
        (keep_acts, bf16_logits),
        head_rows,
    )
}

/// [`forward_rows`] of the sequences `share` laid out with their shared prompts'
/// rows once ([`super::share`]); `head_rows` are rows of its compact layout
/// ([`PromptShare::scored_rows`]). With batch-invariant GEMMs each row's logits are
/// those of the unshared forward, bit for bit. Needs the tensor-core attention.
pub fn forward_shared(
    model: &GpuModel,
    share: &PromptShare,
    role: GemmRole,
    flags: (bool, bool),
    head_rows: Option<&[usize]>,
) -> Result<GpuForwardOut> {
    // The attention refuses shared rows without its tensor-core kernels
    // (`PackedCausal::check_share`).
    let dev = SharedRows::upload(&model.gpu, share)?;
    let packed = (
        share.tokens.clone(),
        share.positions.clone(),
        share.seq_lens.clone(),
        Some(dev),
    );
    forward_from(model, packed, role, flags, head_rows)
}

/// The forward over rows `tokens` at `positions`, the attention over sequences of
/// `seq_lens` (the expanded layout where `share` maps the rows to them).
fn forward_from(
    model: &GpuModel,
    (tokens, positions, seq_lens, share): (Vec<u32>, Vec<usize>, Vec<usize>, Option<SharedRows>),
    role: GemmRole,
    (keep_acts, bf16_logits): (bool, bool),
    head_rows: Option<&[usize]>,
) -> Result<GpuForwardOut> {
    if let Some(rows) = head_rows {
        check_head_rows(rows, tokens.len()).map_err(CudaError::Invalid)?;
    }
    let rows = RowsIn::upload(model, &tokens, &positions)?;
    let mut attn = PackedCausal::new(model, &seq_lens, keep_acts, None)?;
    attn.share = share;
    let mut layers = Vec::new();
    let h = run_layers(
        model,
        &rows,
        role,
        &mut attn,
        keep_acts.then_some(&mut layers),
    )?;
    let m = tokens.len();
    let (normed, rstd_final, logits) = match bf16_logits {
        true => head_act(model, &h, m, role, head_rows)?,
        false => {
            let (n, r, l) = head(model, &h, m, role, head_rows)?;
            (n, r, Act::F32(l))
        }
    };
    let (flash, share) = (attn.flash.take(), attn.share.take());
    let acts = keep_acts.then_some(GpuActivations {
        tokens,
        seq_lens,
        rows,
        layers,
        flash,
        share,
        h_final: h,
        rstd_final,
        normed,
        head_rows: head_rows.map(<[usize]>::to_vec),
    });
    Ok(GpuForwardOut { logits, acts })
}
