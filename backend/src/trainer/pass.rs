//! One pass of the trainer over a set of sequences, in micro-batches: the
//! training forward, per-token logprobs and entropies of the response tokens,
//! and (optionally) the loss gradient back through the model.

use jet_kernels::ops::logsoftmax::{token_logprobs_backward, token_logprobs_forward};
use jet_kernels::GemmRole;

use super::pass_loss::{LossTerms, PassLoss};
use crate::model::ModelWeights;
use crate::rollout::engine::Sample;
use crate::rollout::sampler::temper;
use crate::transformer::{backward, forward_rows, PreparedModel};

/// A sequence as the trainer sees it.
#[derive(Clone, Debug)]
pub struct TrainSeq {
    /// Prompt then response tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
}

impl TrainSeq {
    pub fn response_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Each rollout sample as its prompt followed by its response.
    pub fn of_samples(prompts: &[Vec<u32>], samples: &[Sample]) -> Vec<TrainSeq> {
        samples
            .iter()
            .map(|s| TrainSeq {
                tokens: [prompts[s.prompt_index].as_slice(), &s.tokens].concat(),
                prompt_len: prompts[s.prompt_index].len(),
            })
            .collect()
    }
}

/// Per response token: the logprob and the entropy under the tempered
/// distribution, sequence after sequence, and under [`PassLoss::Policy`] the
/// token's loss terms (empty under any other loss).
#[derive(Clone, Debug, Default)]
pub struct Scored {
    pub logp: Vec<Vec<f64>>,
    pub entropy: Vec<Vec<f64>>,
    pub terms: Vec<Vec<LossTerms>>,
}

/// Per response token: d loss / d logp and d loss / d entropy.
pub type TokenGrad<'a> = &'a mut dyn FnMut(usize, usize, f64, f64) -> (f64, f64);

/// The packed rows of `seqs` whose logits score a response token (row
/// `prompt_len - 1 + t` of a sequence predicts its token `prompt_len + t`) and those
/// tokens, sequence after sequence.
pub fn scored_rows(seqs: &[TrainSeq]) -> (Vec<usize>, Vec<u32>) {
    let mut start = 0;
    let at: Vec<(usize, usize)> = seqs
        .iter()
        .map(|s| {
            start += s.tokens.len();
            (0, start - s.tokens.len())
        })
        .collect();
    scored_rows_at(seqs, &at)
}

/// [`scored_rows`] where sequence i's rows from position `at[i].0` on sit at packed
/// rows from `at[i].1` on (a layout that keeps a shared prompt's rows once: the
/// scored positions are at least `prompt_len - 1 >= at[i].0`).
pub fn scored_rows_at(seqs: &[TrainSeq], at: &[(usize, usize)]) -> (Vec<usize>, Vec<u32>) {
    assert_eq!(seqs.len(), at.len(), "one row offset a sequence");
    let mut rows = Vec::new();
    let mut targets = Vec::new();
    for (s, &(from, start)) in seqs.iter().zip(at) {
        for t in 0..s.response_len() {
            rows.push(start + s.prompt_len - 1 + t - from);
            targets.push(s.tokens[s.prompt_len + t]);
        }
    }
    (rows, targets)
}

/// How a pass splits its sequences into micro-batches: at most `seqs` sequences
/// each and, where `tokens` > 0, at most `tokens` tokens (a longer sequence runs
/// alone). A usize is a count alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Micro {
    pub seqs: usize,
    pub tokens: usize,
}

impl From<usize> for Micro {
    fn from(seqs: usize) -> Micro {
        Micro { seqs, tokens: 0 }
    }
}

/// `seqs` in consecutive micro-batches within `micro`'s bounds, in order. A run of
/// consecutive samples of one prompt (a GRPO group, whose prompt rows the GPU runs
/// once a micro-batch) starts a new micro-batch rather than being split, where it
/// fits in one; with no such runs and no token bound these are `chunks(seqs)`.
pub fn micro_batches(seqs: &[TrainSeq], micro: Micro) -> Vec<std::ops::Range<usize>> {
    let cap_n = micro.seqs.max(1);
    let cap_t = match micro.tokens {
        0 => usize::MAX,
        t => t,
    };
    let fits = |n: usize, t: usize| n <= cap_n && t <= cap_t;
    let same_prompt = |a: &TrainSeq, b: &TrainSeq| {
        a.prompt_len >= 2
            && a.prompt_len <= a.tokens.len()
            && b.prompt_len <= b.tokens.len()
            && a.tokens[..a.prompt_len] == b.tokens[..b.prompt_len]
    };
    let mut out = Vec::new();
    let (mut start, mut n, mut t) = (0usize, 0usize, 0usize);
    let mut i = 0;
    while i < seqs.len() {
        let mut j = i + 1;
        while j < seqs.len() && same_prompt(&seqs[i], &seqs[j]) {
            j += 1;
        }
        let run_t: usize = seqs[i..j].iter().map(|s| s.tokens.len()).sum();
        if n > 0 && !fits(n + j - i, t + run_t) && fits(j - i, run_t) {
            // The run whole in a micro-batch of its own.
            out.push(start..i);
            (start, n, t) = (i, 0, 0);
        }
        for (k, s) in seqs.iter().enumerate().take(j).skip(i) {
            let len = s.tokens.len();
            if n > 0 && !fits(n + 1, t + len) {
                out.push(start..k);
                (start, n, t) = (k, 0, 0);
            }
            n += 1;
            t += len;
        }
        i = j;
    }
    if n > 0 {
        out.push(start..seqs.len());
    }
    out
}

/// Every sequence has a prompt of at least one token (its last row predicts the
/// first response token) and no more tokens of prompt than it has.
pub fn check_seqs(seqs: &[TrainSeq]) -> Result<(), String> {
    match seqs
        .iter()
        .position(|s| s.prompt_len == 0 || s.prompt_len > s.tokens.len())
    {
        Some(i) => Err(format!(
            "training sequence {i}: prompt of {} tokens in a sequence of {} (needs 1 to all)",
            seqs[i].prompt_len,
            seqs[i].tokens.len()
        )),
        None => Ok(()),
    }
}

/// Run `seqs` through the model in micro-batches within `micro`'s bounds
/// ([`micro_batches`]). When `grad` is given, each response token's gradient
/// `(dloss/dlogp, dloss/dentropy)` is its loss's ([`PassLoss::token`]) and the
/// weight gradients are returned.
pub fn run_pass(
    model: &PreparedModel,
    seqs: &[TrainSeq],
    temperature: f64,
    micro: impl Into<Micro>,
    mut grad: Option<PassLoss>,
) -> (Scored, Option<ModelWeights>) {
    let vocab = model.cfg.vocab_size;
    let inv_t = if temperature > 0.0 && temperature != 1.0 {
        1.0 / temperature
    } else {
        1.0
    };
    let checked = check_seqs(seqs).and_then(|_| grad.as_ref().map_or(Ok(()), |l| l.check(seqs)));
    if let Err(e) = checked {
        panic!("{e}");
    }
    let policy = matches!(grad, Some(PassLoss::Policy(_)));
    let mut scored = Scored::default();
    let mut grads: Option<ModelWeights> = None;
    for range in micro_batches(seqs, micro.into()) {
        let (first, chunk) = (range.start, &seqs[range]);
        let refs: Vec<&[u32]> = chunk.iter().map(|s| s.tokens.as_slice()).collect();
        // Rows that predict response tokens: position prompt_len-1+t predicts token
        // prompt_len+t. Only they go through the LM head.
        let (rows, targets) = scored_rows(chunk);
        if rows.is_empty() {
            // Nothing to score: no logprobs, no gradient.
            scored.logp.extend(chunk.iter().map(|_| Vec::new()));
            scored.entropy.extend(chunk.iter().map(|_| Vec::new()));
            if policy {
                scored.terms.extend(chunk.iter().map(|_| Vec::new()));
            }
            continue;
        }
        let keep = (grad.is_some(), false);
        let out = forward_rows(model, &refs, GemmRole::TrainForward, keep, Some(&rows));
        let tempered: Vec<f32> = out
            .logits
            .chunks(vocab)
            .flat_map(|row| temper(row, temperature))
            .collect();
        let tl = token_logprobs_forward(&tempered, rows.len(), vocab, &targets);
        let mut k = 0;
        let (mut dlogp, mut dent) = (vec![0.0f32; rows.len()], vec![0.0f32; rows.len()]);
        for (i, s) in chunk.iter().enumerate() {
            let seq_index = first + i;
            let (mut lp, mut en, mut tm) = (Vec::new(), Vec::new(), Vec::new());
            for t in 0..s.response_len() {
                let (l, e) = (tl.logp[k] as f64, tl.entropy[k] as f64);
                if let Some(g) = grad.as_mut() {
                    let ((a, b), terms) = g.token(seq_index, t, l, e);
                    dlogp[k] = a as f32;
                    dent[k] = b as f32;
                    tm.extend(terms);
                }
                lp.push(l);
                en.push(e);
                k += 1;
            }
            scored.logp.push(lp);
            scored.entropy.push(en);
            if policy {
                scored.terms.push(tm);
            }
        }
        if grad.is_none() {
            continue;
        }
        let dg = token_logprobs_backward(
            &tempered,
            rows.len(),
            vocab,
            &targets,
            &tl,
            &dlogp,
            Some(&dent),
        );
        // d loss / d logits of the head's rows: the tempered rows' gradient times 1/T.
        let dlogits: Vec<f32> = dg.iter().map(|&g| g * inv_t as f32).collect();
        let g = backward(
            model,
            out.acts.as_ref().expect("kept activations"),
            &dlogits,
        );
        match grads.as_mut() {
            None => grads = Some(g),
            Some(acc) => {
                for ((_, a), (_, b)) in acc.tensors_mut().into_iter().zip(g.tensors()) {
                    for (x, y) in a.iter_mut().zip(b.iter()) {
                        *x += y;
                    }
                }
            }
        }
    }
    if grad.is_some() && grads.is_none() {
        grads = Some(ModelWeights::zeros(model.cfg));
    }
    (scored, grads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_without_a_prompt_row_are_refused_by_index() {
        let ok = TrainSeq {
            tokens: vec![1, 2, 3],
            prompt_len: 1,
        };
        let empty = TrainSeq {
            tokens: vec![1, 2, 3],
            prompt_len: 0,
        };
        let long = TrainSeq {
            tokens: vec![1, 2],
            prompt_len: 3,
        };
        assert!(check_seqs(&[ok.clone(), ok.clone()]).is_ok());
        let e = check_seqs(&[ok.clone(), empty]).unwrap_err();
        assert!(
            e.contains("training sequence 1") && e.contains("prompt of 0"),
            "{e}"
        );
        let e = check_seqs(&[long, ok]).unwrap_err();
        assert!(
            e.contains("training sequence 0") && e.contains("of 2"),
            "{e}"
        );
    }

    fn seq(prompt: &[u32], resp: usize) -> TrainSeq {
        TrainSeq {
            tokens: [prompt.to_vec(), vec![9; resp]].concat(),
            prompt_len: prompt.len(),
        }
    }

    #[test]
    fn micro_batches_keep_groups_whole_and_bound_tokens() {
        // Distinct prompts and no token bound: chunks of `seqs`.
        let distinct: Vec<TrainSeq> = (0..7).map(|i| seq(&[i, i + 1], 3)).collect();
        let got = micro_batches(&distinct, 3.into());
        assert_eq!(got, [0..3, 3..6, 6..7]);
        // Groups of 3 in micro-batches of 4: each group whole.
        let groups: Vec<TrainSeq> = (0..9).map(|i| seq(&[i / 3, 7], 2)).collect();
        assert_eq!(micro_batches(&groups, 4.into()), [0..3, 3..6, 6..9]);
        // A group larger than a micro-batch is split.
        assert_eq!(micro_batches(&groups[..3], 2.into()), [0..2, 2..3]);
        // A token bound (lengths 5, 5, 20, 3, 3, 3): the long one alone.
        let lens = [3, 3, 18, 1, 1, 1];
        let mixed: Vec<TrainSeq> = lens
            .iter()
            .zip(0u32..)
            .map(|(&r, i)| seq(&[i, 50], r))
            .collect();
        let m = Micro {
            seqs: 8,
            tokens: 10,
        };
        assert_eq!(micro_batches(&mixed, m), [0..2, 2..3, 3..6]);
    }

    #[test]
    fn micro_batches_cover_every_sequence_once_within_bounds() {
        let mut s = 3u64;
        let mut rnd = |n: u64| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) % n
        };
        for _ in 0..300 {
            let seqs: Vec<TrainSeq> = (0..rnd(20))
                .map(|_| seq(&[rnd(3) as u32, 1], rnd(12) as usize))
                .collect();
            let m = Micro {
                seqs: 1 + rnd(6) as usize,
                tokens: [0, 8, 20, 40][rnd(4) as usize],
            };
            let got = micro_batches(&seqs, m);
            let mut next = 0;
            for r in &got {
                assert_eq!(r.start, next);
                assert!(r.end > r.start && r.len() <= m.seqs);
                let t: usize = seqs[r.clone()].iter().map(|s| s.tokens.len()).sum();
                assert!(
                    m.tokens == 0 || t <= m.tokens || r.len() == 1,
                    "{m:?} {r:?}"
                );
                next = r.end;
            }
            assert_eq!(next, seqs.len());
        }
    }

    #[test]
    fn scored_rows_follow_the_packing() {
        let seqs = [
            TrainSeq {
                tokens: vec![5, 6, 7, 8],
                prompt_len: 2,
            },
            TrainSeq {
                tokens: vec![9, 10, 11],
                prompt_len: 3,
            },
            TrainSeq {
                tokens: vec![12, 13],
                prompt_len: 1,
            },
        ];
        // Rows 1, 2 predict 7, 8; the second scores nothing; row 7 predicts 13.
        assert_eq!(scored_rows(&seqs), (vec![1, 2, 7], vec![7, 8, 13]));
    }
}
