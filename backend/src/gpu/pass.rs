//! One pass of the trainer on the GPU (as `trainer::pass::run_pass`): the
//! training forward in micro-batches, the logprob and entropy of each response
//! token under the tempered distribution, and, when asked, the loss gradient
//! back through the model into a device gradient buffer.
//!
//! The policy loss (`rl::loss::token_loss`, the CPU's) and a constant gradient
//! are evaluated on the device ([`super::pass_loss`]): the host queues every
//! micro-batch's forward, loss and backward without waiting, and the tokens'
//! logprobs, entropies and loss terms come down once, when the caller asks
//! ([`PendingScored::wait`]: the trainer asks after queuing the optimizer step,
//! so a training step's only wait is at its end; H100, forty-sixth session: a
//! wait at the pass's end left the GPU idle 0.1-0.26 ms before the optimizer's
//! first kernel, as the host loss's round trip had before the backward). A host
//! closure (`PassLoss::Host`) waits for each micro-batch: its logprobs and
//! entropies come down and d loss / d logp, d entropy go back up.

use jet_kernels::cuda::act::Act;
use jet_kernels::cuda::linear::Dy;
use jet_kernels::cuda::logsoftmax::{
    token_logprobs_backward_at, token_logprobs_forward_at, GpuTokenLogprobs, ScoredDz, ScoredGrad,
    ScoredOut,
};
use jet_kernels::cuda::policy_loss::LossGrad;
use jet_kernels::cuda::tensor::div_scalar;
use std::sync::Arc;

use jet_kernels::cuda::{CudaError, Gpu, Result};
use jet_kernels::GemmRole;

use super::backward::{backward, operand_dy};
use super::forward::{forward_rows, forward_shared};
use super::grads::GpuGrads;
use super::model::GpuModel;
use super::pass_loss::DeviceScores;
use super::share::PromptShare;
use crate::trainer::pass::{
    check_seqs, micro_batches, scored_rows, Micro, Scored, TokenGrad, TrainSeq,
};
use crate::trainer::pass_loss::PassLoss;

/// Run `seqs` through the model in micro-batches within `micro`'s bounds
/// ([`micro_batches`]). When `grad` is given, each response token's gradient
/// `(dloss/dlogp, dloss/dentropy)` is its loss's (`PassLoss::token`) and the
/// weight gradients are added into `grads`.
pub fn run_pass_gpu(
    model: &GpuModel,
    seqs: &[TrainSeq],
    temperature: f64,
    micro: impl Into<Micro>,
    grad: Option<(PassLoss, &mut GpuGrads)>,
) -> Result<Scored> {
    run_pass_gpu_queued(model, seqs, temperature, micro, grad)?.wait()
}

/// [`run_pass_gpu`] that returns once the pass is queued: its scored tokens come to
/// the host at [`PendingScored::wait`], so work queued after the pass (the
/// optimizer step) is on the stream before the host waits for any of it. With a
/// host closure's loss the pass has waited for each micro-batch already.
pub fn run_pass_gpu_queued(
    model: &GpuModel,
    seqs: &[TrainSeq],
    temperature: f64,
    micro: impl Into<Micro>,
    grad: Option<(PassLoss, &mut GpuGrads)>,
) -> Result<PendingScored> {
    let share = std::env::var("JET_SHARE_PROMPTS").map_or(true, |v| {
        !matches!(
            v.to_ascii_lowercase().as_str(),
            "0" | "false" | "off" | "no"
        )
    });
    run_pass_gpu_with(model, seqs, (temperature, micro.into()), grad, share)
}

/// [`run_pass_gpu_queued`] with the sharing of prompts' rows chosen: on, the sequences of a
/// micro-batch that begin with the same prompt run its rows once
/// ([`super::share`]; the same logprobs, bit for bit, and the same gradients to
/// rounding); `run_pass_gpu` and `run_pass_gpu_queued` share unless
/// `JET_SHARE_PROMPTS` is 0, false, off or no.
pub fn run_pass_gpu_with(
    model: &GpuModel,
    seqs: &[TrainSeq],
    (temperature, micro): (f64, Micro),
    grad: Option<(PassLoss, &mut GpuGrads)>,
    share: bool,
) -> Result<PendingScored> {
    check_seqs(seqs).map_err(CudaError::Invalid)?;
    let g = &*model.gpu;
    let vocab = model.cfg.vocab_size;
    let tempered = temperature > 0.0 && temperature != 1.0;
    let (loss, mut grads) = grad.unzip();
    let mut sink = match loss {
        Some(PassLoss::Host(f)) => Sink::Host(f, Scored::default()),
        other => Sink::Device(DeviceScores::new(g, seqs, other.as_ref())?),
    };
    // The pass's scored tokens before this micro-batch's.
    let mut at = 0;
    let batches = micro_batches(seqs, micro);
    if let Some(gr) = grads.as_deref_mut() {
        let cap = grad_hold_switch().or(gr.hold_cap).unwrap_or(1);
        gr.set_hold(cap.min(batches.len()));
    }
    for range in batches {
        let (first, chunk) = (range.start, &seqs[range]);
        let refs: Vec<&[u32]> = chunk.iter().map(|s| s.tokens.as_slice()).collect();
        // Sequences that share a prompt keep its rows once (`share`), where the
        // tensor-core attention runs.
        let share = match share && model.flash_attention() {
            true => PromptShare::plan(chunk),
            false => None,
        };
        // The scored rows (row prompt_len-1+t predicts token prompt_len+t) are the
        // only ones the LM head runs over: logits [r, vocab], row j for rows[j].
        let (rows, targets) = match &share {
            Some(p) => p.scored_rows(chunk),
            None => scored_rows(chunk),
        };
        let r = rows.len();
        if r == 0 {
            if let Sink::Host(_, scored) = &mut sink {
                scored.logp.extend(chunk.iter().map(|_| Vec::new()));
                scored.entropy.extend(chunk.iter().map(|_| Vec::new()));
            }
            continue;
        }
        // The logits stay BF16 values (half the bytes of the step's largest tensor)
        // unless a temperature divides them in place.
        let keep = (grads.is_some(), !tempered);
        let role = GemmRole::TrainForward;
        let mut fwd = match &share {
            Some(p) => forward_shared(model, p, role, keep, Some(&rows))?,
            None => forward_rows(model, &refs, role, keep, Some(&rows))?,
        };
        let all: Vec<usize> = (0..r).collect();
        // A temperature divides the logits in place, as the CPU divides its rows
        // (the same bits).
        let mut logits = fwd.logits;
        if tempered {
            let Act::F32(l) = &mut logits else {
                return Err(CudaError::Invalid(
                    "tempered logits must be f32 (divided in place)".into(),
                ));
            };
            div_scalar(g, l, r * vocab, temperature as f32)?;
        }
        let tl = token_logprobs_forward_at(g, logits.view(), r, vocab, &all, &targets)?;
        // dlogits' buffers now, while the forward runs: the host time a fresh
        // buffer costs (`ScoredOut`) overlaps it, where after a host closure's
        // download the stream would wait for it.
        let out = match grads {
            Some(_) => Some(ScoredOut::alloc(g, operand_dy(model), r, vocab)?),
            None => None,
        };
        let dloss = match &mut sink {
            Sink::Host(f, scored) => Some(host_grad(g, &tl, (first, chunk), &mut **f, scored)?),
            Sink::Device(d) => d.micro(g, &tl, (at, r))?,
        };
        at += r;
        let (Some(grads), Some(acts), Some(dst), Some(dl)) =
            (grads.as_deref_mut(), fwd.acts.as_mut(), out, dloss)
        else {
            continue;
        };
        let d = ScoredGrad {
            tgt: &targets,
            fwd: &tl,
            dlogp: &dl.dlogp,
            dentropy: Some(&dl.dentropy),
        };
        // Each scored row's gradient in place, times 1/T when tempered. Where the
        // LM head's DGrad and WGrad are BF16 or FP8, dlogits leaves the kernel as
        // their operands (no f32 copy of [r, vocab] written, copied or quantized);
        // otherwise it overwrites the logits.
        let scale = if tempered {
            (1.0 / temperature) as f32
        } else {
            1.0
        };
        let dz = token_logprobs_backward_at(g, logits, (r, vocab), &all, &d, scale, dst)?;
        let dlogits = match &dz {
            ScoredDz::F32(x) => Dy::F32(x),
            ScoredDz::Bf16(x) => Dy::Bf16(x),
            ScoredDz::Fp8(x) => Dy::Fp8(x.as_ref()),
        };
        backward(model, acts, dlogits, grads)?;
    }
    // The gradient norm and AdamW read one held addend a gradient.
    if let Some(gr) = grads {
        gr.settle_for_read(g)?;
    }
    Ok(PendingScored(match sink {
        Sink::Host(_, scored) => Pending::Ready(scored),
        Sink::Device(d) => {
            let lens = seqs.iter().map(|s| s.response_len()).collect();
            Pending::Device(model.gpu.clone(), d, lens)
        }
    }))
}

/// WGrad outputs a matrix's gradient holds before they are settled into its f32
/// accumulator together (at most the pass's micro-batches): `JET_GRAD_HOLD` where
/// set (a measurement switch; 1: each settled before the next backward pass),
/// else the gradients' `hold_cap` (`gpu::micro::grad_hold`, set by the trainer),
/// else 1.
fn grad_hold_switch() -> Option<usize> {
    static HOLD: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *HOLD.get_or_init(|| {
        std::env::var("JET_GRAD_HOLD")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    })
}

/// A queued pass's scored tokens ([`run_pass_gpu_queued`]): on the host already
/// (a host closure's pass), or on the device until [`PendingScored::wait`].
pub struct PendingScored(Pending);

enum Pending {
    Ready(Scored),
    /// The device, the tokens, and the response length of each sequence.
    Device(Arc<Gpu>, DeviceScores, Vec<usize>),
}

impl PendingScored {
    /// Wait for the pass (and whatever was queued after it) and bring its tokens'
    /// logprobs, entropies and loss terms to the host, sequence after sequence.
    pub fn wait(self) -> Result<Scored> {
        match self.0 {
            Pending::Ready(s) => Ok(s),
            Pending::Device(g, d, lens) => d.finish(&g, &lens),
        }
    }
}

/// Where a pass's scored tokens go: a host closure needs each micro-batch's on
/// the host (a wait for the stream), into the `Scored` it fills; anything else
/// leaves them on the device until [`PendingScored::wait`].
enum Sink<'a> {
    Host(TokenGrad<'a>, Scored),
    Device(DeviceScores),
}

/// A host closure's gradient of a micro-batch's `r` scored tokens (`tl`, of the
/// pass's sequences `first..` in `chunk`): their logprobs and entropies come down
/// (waiting for the stream) into `scored`, the closure's values go up.
fn host_grad(
    g: &Gpu,
    tl: &GpuTokenLogprobs,
    (first, chunk): (usize, &[TrainSeq]),
    f: TokenGrad,
    scored: &mut Scored,
) -> Result<LossGrad> {
    let r: usize = chunk.iter().map(|s| s.response_len()).sum();
    let logp = g.download_n(&tl.logp, r)?;
    let ent = g.download_n(&tl.entropy, r)?;
    let mut k = 0;
    let (mut dlogp, mut dent) = (vec![0.0f32; r], vec![0.0f32; r]);
    for (i, s) in chunk.iter().enumerate() {
        let (mut lp, mut en) = (Vec::new(), Vec::new());
        for t in 0..s.response_len() {
            let (l, e) = (logp[k] as f64, ent[k] as f64);
            let (a, b) = f(first + i, t, l, e);
            dlogp[k] = a as f32;
            dent[k] = b as f32;
            lp.push(l);
            en.push(e);
            k += 1;
        }
        scored.logp.push(lp);
        scored.entropy.push(en);
    }
    Ok(LossGrad {
        dlogp: g.upload(&dlogp)?,
        dentropy: g.upload(&dent)?,
    })
}
