//! The loss a gradient pass differentiates, per response token, in a form the CPU
//! and the GPU pass both understand: any host closure, the GRPO policy loss, or a
//! constant gradient. A GPU pass evaluates the last two on the device, so it
//! queues every micro-batch's forward, loss and backward without waiting for the
//! host; a host closure needs each micro-batch's logprobs downloaded first.

use super::pass::{TokenGrad, TrainSeq};
use crate::rl::loss::{token_loss, LossConfig, TokenInput, TokenLoss};

/// What a gradient pass differentiates.
pub enum PassLoss<'a> {
    /// Called for every response token as `(sequence, position, logp, entropy) ->
    /// (dloss/dlogp, dloss/dentropy)`, on the host.
    Host(TokenGrad<'a>),
    /// The GRPO policy loss (`rl::loss::token_loss`) of every response token.
    Policy(PolicyLoss<'a>),
    /// The same gradient for every token: the SFT cross-entropy `-mean logp`
    /// (`dlogp = -1/n`), the benchmark's update.
    Const { dlogp: f64, dentropy: f64 },
}

/// [`token_loss`]'s inputs for a pass over sequences `base..base + seqs.len()` of
/// a step: the per-token arrays are indexed `[sequence][position]` over the whole
/// step, as the per-sequence advantages are.
#[derive(Clone, Copy)]
pub struct PolicyLoss<'a> {
    pub cfg: LossConfig,
    /// Tokens the loss is averaged over (each token's term times `1 / n_tokens`).
    pub n_tokens: usize,
    /// The step's index of the pass's first sequence.
    pub base: usize,
    /// The logprobs the ratio is taken against; `None`: the pass's own (ratio 1).
    pub logp_old: Option<&'a [Vec<f64>]>,
    /// The rollout's logprobs (the importance weight's denominator).
    pub logp_rollout: &'a [Vec<f64>],
    /// The reference policy's logprobs (the KL term), if any.
    pub logp_ref: Option<&'a [Vec<f64>]>,
    pub advantage: &'a [f64],
}

/// One response token's share of the loss statistics (of [`TokenLoss`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossTerms {
    /// The token's loss term, already times `1 / n_tokens`.
    pub loss: f64,
    pub clipped: bool,
    /// The k3 KL to the reference (0 without the term).
    pub kl: f64,
}

impl From<&TokenLoss> for LossTerms {
    fn from(l: &TokenLoss) -> LossTerms {
        LossTerms {
            loss: l.loss,
            clipped: l.clipped,
            kl: l.kl,
        }
    }
}

/// The sums of a step's [`LossTerms`], added token after token.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossStats {
    pub loss: f64,
    pub clipped: usize,
    pub kl: f64,
}

impl LossStats {
    /// Add a pass's terms (`[sequence][position]`), in that order.
    pub fn add(&mut self, terms: &[Vec<LossTerms>]) {
        for t in terms.iter().flatten() {
            self.loss += t.loss;
            self.clipped += t.clipped as usize;
            self.kl += t.kl;
        }
    }
}

impl PassLoss<'_> {
    /// The gradient of token `t` of the pass's sequence `seq` at `logp`, `entropy`
    /// and, for the policy loss, its statistics.
    pub fn token(
        &mut self,
        seq: usize,
        t: usize,
        logp: f64,
        entropy: f64,
    ) -> ((f64, f64), Option<LossTerms>) {
        match self {
            PassLoss::Host(f) => (f(seq, t, logp, entropy), None),
            PassLoss::Policy(p) => {
                let l = p.token(seq, t, logp, entropy);
                ((l.dlogp, l.dentropy), Some(LossTerms::from(&l)))
            }
            PassLoss::Const { dlogp, dentropy } => ((*dlogp, *dentropy), None),
        }
    }

    /// The policy loss's inputs cover every response token of `seqs`.
    pub fn check(&self, seqs: &[TrainSeq]) -> Result<(), String> {
        match self {
            PassLoss::Policy(p) => p.check(seqs),
            _ => Ok(()),
        }
    }
}

impl PolicyLoss<'_> {
    /// [`token_loss`] of token `t` of the pass's sequence `seq`.
    pub fn token(&self, seq: usize, t: usize, logp: f64, entropy: f64) -> TokenLoss {
        let si = self.base + seq;
        let input = TokenInput {
            logp,
            logp_old: self.logp_old.map_or(logp, |o| o[si][t]),
            logp_rollout: self.logp_rollout[si][t],
            logp_ref: self.logp_ref.map(|r| r[si][t]),
            advantage: self.advantage[si],
        };
        token_loss(&self.cfg, input, entropy, self.n_tokens)
    }

    /// Every array holds sequences `base..base + seqs.len()`, each per-token one
    /// at least a value per response token; errors name the array and sequence.
    pub fn check(&self, seqs: &[TrainSeq]) -> Result<(), String> {
        let end = self.base + seqs.len();
        if self.advantage.len() < end {
            return Err(format!(
                "policy loss: {} advantages for sequences {}..{end}",
                self.advantage.len(),
                self.base
            ));
        }
        let arrays = [
            ("logp_old", self.logp_old),
            ("logp_rollout", Some(self.logp_rollout)),
            ("logp_ref", self.logp_ref),
        ];
        for (name, a) in arrays {
            let Some(a) = a else { continue };
            for (i, s) in seqs.iter().enumerate() {
                let si = self.base + i;
                let have = a.get(si).map(|v| v.len());
                if have.is_none_or(|n| n < s.response_len()) {
                    return Err(format!(
                        "policy loss: {name} of sequence {si} holds {} values for {} response tokens",
                        have.unwrap_or(0),
                        s.response_len()
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use jet_kernels::Flow;

    use super::*;
    use crate::model::{init_random, ModelWeights};
    use crate::trainer::pass::run_pass;
    use crate::transformer::tests_support::tiny_config;
    use crate::transformer::PreparedModel;

    /// Five sequences of the tiny model's vocabulary, the third with no response.
    fn seqs(vocab: u32) -> Vec<TrainSeq> {
        let mut s = 11u64;
        let mut tok = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % vocab as u64) as u32
        };
        [(3usize, 7usize), (5, 9), (4, 0), (2, 12), (6, 5)]
            .iter()
            .map(|&(p, n)| TrainSeq {
                tokens: (0..p + n).map(|_| tok()).collect(),
                prompt_len: p,
            })
            .collect()
    }

    /// `logp` moved by pseudo-random amounts in `[-spread, spread]`.
    fn near(logp: &[Vec<f64>], spread: f64, seed: u64) -> Vec<Vec<f64>> {
        let mut s = seed;
        let mut u = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        };
        logp.iter()
            .map(|v| v.iter().map(|&x| x + spread * u()).collect())
            .collect()
    }

    fn bits(w: &ModelWeights) -> Vec<u32> {
        w.tensors()
            .into_iter()
            .flat_map(|(_, t)| t.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
            .collect()
    }

    fn configs() -> [LossConfig; 4] {
        let plain = LossConfig {
            clip_low: 0.2,
            clip_high: 0.28,
            tis_cap: None,
            kl_coef: 0.0,
            entropy_coef: 0.0,
        };
        [
            plain,
            LossConfig {
                tis_cap: Some(2.0),
                kl_coef: 0.1,
                entropy_coef: 0.01,
                ..plain
            },
            // A narrow range and a cap the weights often pass.
            LossConfig {
                clip_low: 0.1,
                clip_high: 0.1,
                tis_cap: Some(1.05),
                kl_coef: 0.05,
                entropy_coef: 0.0,
            },
            LossConfig {
                entropy_coef: 0.02,
                ..plain
            },
        ]
    }

    /// A CPU pass under `PassLoss::Policy` is the pass under the closure rl_step
    /// used before it (token_loss per token, the statistics summed in the
    /// closure): the same logprobs, gradients and sums, bit for bit, for a pass
    /// over sequences 1.. of the step's arrays in two micro-batches, with and
    /// without old and reference logprobs, over clipping on both sides, capped
    /// and uncapped importance weights, KL and entropy terms on and off.
    #[test]
    fn policy_loss_is_the_closure_rl_step_used() {
        let cfg = tiny_config();
        let w = init_random(&cfg, 7);
        let model = PreparedModel::new(&cfg, &w, Flow::F32);
        let all = seqs(cfg.vocab_size as u32);
        let (base, part) = (1, &all[1..]);
        // Arrays around the model's own logprobs: the ratios fall on both sides
        // of the clip range.
        let (s0, _) = run_pass(&model, &all, 0.8, 2, None);
        let rollout = near(&s0.logp, 0.4, 1);
        let old = near(&s0.logp, 0.3, 2);
        let reference = near(&s0.logp, 0.5, 3);
        let adv = [1.0, -0.5, 0.0, 2.0, -1.5];
        let n_tokens: usize = part.iter().map(|s| s.response_len()).sum();
        let (mut clipped_any, mut unclipped_any) = (false, false);
        for lc in configs() {
            for (logp_old, logp_ref) in [
                (None, None),
                (Some(old.as_slice()), None),
                (None, Some(reference.as_slice())),
                (Some(old.as_slice()), Some(reference.as_slice())),
            ] {
                let (mut loss, mut clipped, mut kl_sum) = (0.0, 0usize, 0.0);
                let mut gfn = |i: usize, t: usize, logp: f64, ent: f64| {
                    let si = base + i;
                    let ti = TokenInput {
                        logp,
                        logp_old: logp_old.map_or(logp, |o| o[si][t]),
                        logp_rollout: rollout[si][t],
                        logp_ref: logp_ref.map(|r| r[si][t]),
                        advantage: adv[si],
                    };
                    let l = token_loss(&lc, ti, ent, n_tokens);
                    loss += l.loss;
                    clipped += l.clipped as usize;
                    kl_sum += l.kl;
                    (l.dlogp, l.dentropy)
                };
                let (sh, gh) = run_pass(&model, part, 0.8, 2, Some(PassLoss::Host(&mut gfn)));
                let pl = PolicyLoss {
                    cfg: lc,
                    n_tokens,
                    base,
                    logp_old,
                    logp_rollout: &rollout,
                    logp_ref,
                    advantage: &adv,
                };
                let (sp, gp) = run_pass(&model, part, 0.8, 2, Some(PassLoss::Policy(pl)));
                let what = format!(
                    "{lc:?} old {} ref {}",
                    logp_old.is_some(),
                    logp_ref.is_some()
                );
                assert_eq!(sp.logp, sh.logp, "{what}");
                assert!(
                    bits(&gp.unwrap()) == bits(&gh.unwrap()),
                    "{what}: gradients"
                );
                assert!(sh.terms.is_empty(), "{what}: a closure has no terms");
                let lens: Vec<usize> = sp.terms.iter().map(|t| t.len()).collect();
                let want: Vec<usize> = part.iter().map(|s| s.response_len()).collect();
                assert_eq!(lens, want, "{what}: one term a response token");
                let mut stats = LossStats::default();
                stats.add(&sp.terms);
                assert_eq!(stats.loss.to_bits(), loss.to_bits(), "{what}: loss");
                assert_eq!(stats.clipped, clipped, "{what}: clipped");
                assert_eq!(stats.kl.to_bits(), kl_sum.to_bits(), "{what}: kl");
                assert!(stats.loss.is_finite() && stats.loss != 0.0, "{what}");
                assert_eq!(kl_sum != 0.0, logp_ref.is_some() && lc.kl_coef != 0.0);
                clipped_any |= clipped > 0;
                unclipped_any |= clipped < n_tokens;
            }
        }
        assert!(clipped_any && unclipped_any);
    }

    /// `PassLoss::Const` is the constant closure: the same gradients, bit for bit.
    #[test]
    fn const_loss_is_the_constant_closure() {
        let cfg = tiny_config();
        let w = init_random(&cfg, 9);
        let model = PreparedModel::new(&cfg, &w, Flow::F32);
        let seqs = seqs(cfg.vocab_size as u32);
        let (dlogp, dentropy) = (-1.0 / 33.0, 0.003);
        let mut gf = |_: usize, _: usize, _: f64, _: f64| (dlogp, dentropy);
        let (sh, gh) = run_pass(&model, &seqs, 1.0, 3, Some(PassLoss::Host(&mut gf)));
        let c = PassLoss::Const { dlogp, dentropy };
        let (sc, gc) = run_pass(&model, &seqs, 1.0, 3, Some(c));
        assert_eq!(sc.logp, sh.logp);
        assert!(sc.terms.is_empty());
        assert!(bits(&gc.unwrap()) == bits(&gh.unwrap()));
    }

    /// Inputs that do not cover the pass are refused, naming the array and the
    /// sequence (before anything indexes them).
    #[test]
    fn short_inputs_are_refused_by_name() {
        let seqs = seqs(37);
        let full: Vec<Vec<f64>> = seqs.iter().map(|s| vec![-1.0; s.response_len()]).collect();
        let adv = vec![0.5; seqs.len()];
        let lc = configs()[0];
        let pl = |rollout, reference, adv, base| PolicyLoss {
            cfg: lc,
            n_tokens: 1,
            base,
            logp_old: None,
            logp_rollout: rollout,
            logp_ref: reference,
            advantage: adv,
        };
        assert!(pl(&full, Some(&full), &adv, 0).check(&seqs).is_ok());
        let e = pl(&full, None, &adv, 1).check(&seqs).unwrap_err();
        assert!(e.contains("advantages for sequences 1..6"), "{e}");
        // Misaligned by one: the pass's sequence 1 (9 tokens) reads sequence 2's (none).
        let e = pl(&full, None, &adv, 1).check(&seqs[..4]).unwrap_err();
        assert!(
            e.contains("logp_rollout of sequence 2") && e.contains("0 values for 9"),
            "{e}"
        );
        let e = pl(&full[..4], None, &adv, 0).check(&seqs).unwrap_err();
        assert!(e.contains("logp_rollout of sequence 4"), "{e}");
        let mut short = full.clone();
        short[3].pop();
        let e = pl(&full, Some(&short), &adv, 0).check(&seqs).unwrap_err();
        assert!(
            e.contains("logp_ref of sequence 3") && e.contains("11 values for 12"),
            "{e}"
        );
        let e = PassLoss::Policy(pl(&short, None, &adv, 0)).check(&seqs);
        assert!(e.unwrap_err().contains("logp_rollout of sequence 3"));
        assert!(PassLoss::Const {
            dlogp: 1.0,
            dentropy: 0.0
        }
        .check(&seqs)
        .is_ok());
    }
}
