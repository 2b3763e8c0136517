//! One pass of the trainer on the GPU (as `trainer::pass::run_pass`): the
//! training forward in micro-batches, the logprob and entropy of each response
//! token under the tempered distribution, and, when asked, the loss gradient
//! back through the model into a device gradient buffer.
//!
//! The per-token loss is the host's (`rl::loss`, shared with the CPU): per
//! micro-batch the response tokens' logprobs and entropies come down (a few
//! floats per token) and d loss / d logp, d entropy go back up.

use jet_kernels::cuda::act::Act;
use jet_kernels::cuda::linear::Dy;
use jet_kernels::cuda::logsoftmax::{
    token_logprobs_backward_at, token_logprobs_forward_at, ScoredDz, ScoredGrad, ScoredOut,
};
use jet_kernels::cuda::tensor::div_scalar;
use jet_kernels::cuda::{CudaError, Result};
use jet_kernels::GemmRole;

use super::backward::{backward, operand_dy};
use super::forward::{forward_rows, forward_shared};
use super::grads::GpuGrads;
use super::model::GpuModel;
use super::share::PromptShare;
use crate::trainer::pass::{
    check_seqs, micro_batches, scored_rows, Micro, Scored, TokenGrad, TrainSeq,
};

/// Run `seqs` through the model in micro-batches within `micro`'s bounds
/// ([`micro_batches`]). When
/// `grad` is given it is called for every response token as
/// `(sequence, position, logp, entropy) -> (dloss/dlogp, dloss/dentropy)` and
/// the weight gradients are added into `grads`.
pub fn run_pass_gpu(
    model: &GpuModel,
    seqs: &[TrainSeq],
    temperature: f64,
    micro: impl Into<Micro>,
    grad: Option<(TokenGrad, &mut GpuGrads)>,
) -> Result<Scored> {
    let share = std::env::var("JET_SHARE_PROMPTS").map_or(true, |v| {
        !matches!(
            v.to_ascii_lowercase().as_str(),
            "0" | "false" | "off" | "no"
        )
    });
    run_pass_gpu_with(model, seqs, (temperature, micro.into()), grad, share)
}

/// [`run_pass_gpu`] with the sharing of prompts' rows chosen: on, the sequences of a
/// micro-batch that begin with the same prompt run its rows once
/// ([`super::share`]; the same logprobs, bit for bit, and the same gradients to
/// rounding); `run_pass_gpu` shares unless `JET_SHARE_PROMPTS` is 0, false, off or no.
pub fn run_pass_gpu_with(
    model: &GpuModel,
    seqs: &[TrainSeq],
    (temperature, micro): (f64, Micro),
    mut grad: Option<(TokenGrad, &mut GpuGrads)>,
    share: bool,
) -> Result<Scored> {
    check_seqs(seqs).map_err(CudaError::Invalid)?;
    let g = &*model.gpu;
    let vocab = model.cfg.vocab_size;
    let tempered = temperature > 0.0 && temperature != 1.0;
    let mut scored = Scored::default();
    for range in micro_batches(seqs, micro) {
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
            scored.logp.extend(chunk.iter().map(|_| Vec::new()));
            scored.entropy.extend(chunk.iter().map(|_| Vec::new()));
            continue;
        }
        // The logits stay BF16 values (half the bytes of the step's largest tensor)
        // unless a temperature divides them in place.
        let keep = (grad.is_some(), !tempered);
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
        // dlogits' buffers now, while the forward runs: the download below waits for
        // it anyway, and after it the stream would wait for the allocation.
        let out = match grad {
            Some(_) => Some(ScoredOut::alloc(g, operand_dy(model), r, vocab)?),
            None => None,
        };
        let logp = g.download_n(&tl.logp, r)?;
        let ent = g.download_n(&tl.entropy, r)?;
        let mut k = 0;
        let (mut dlogp, mut dent) = (vec![0.0f32; r], vec![0.0f32; r]);
        for (i, s) in chunk.iter().enumerate() {
            let (mut lp, mut en) = (Vec::new(), Vec::new());
            for t in 0..s.response_len() {
                let (l, e) = (logp[k] as f64, ent[k] as f64);
                if let Some((gf, _)) = grad.as_mut() {
                    let (a, b) = gf(first + i, t, l, e);
                    dlogp[k] = a as f32;
                    dent[k] = b as f32;
                }
                lp.push(l);
                en.push(e);
                k += 1;
            }
            scored.logp.push(lp);
            scored.entropy.push(en);
        }
        let (Some((_, grads)), Some(acts), Some(dst)) = (grad.as_mut(), fwd.acts.as_mut(), out)
        else {
            continue;
        };
        let (dl, de) = (g.upload(&dlogp)?, g.upload(&dent)?);
        let d = ScoredGrad {
            tgt: &targets,
            fwd: &tl,
            dlogp: &dl,
            dentropy: Some(&de),
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
    Ok(scored)
}
