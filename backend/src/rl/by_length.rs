//! Mismatch and accuracy per response-length bucket: the step's `mismatch_kl`
//! averages over all tokens and hides whether long responses drift further from
//! the trained policy than short ones, which is the paper's point about
//! BF16-train + FP8-rollout.
//!
//! Buckets are powers of two of the response length in tokens (the stop token
//! included, as the mismatch metrics count it): `[0, 16)`, `[16, 32)`, `[32, 64)`,
//! `[64, 128)`, ... `[2^k, 2^(k+1))`. They give the tiny CPU configs (responses of
//! 5-50 tokens) and the GPU ones (hundreds) a few buckets each, with the same
//! edges everywhere so runs compare. Only buckets with responses are listed.

use serde::{Deserialize, Serialize};

use super::mismatch::{abs_prob_diff, k3};

/// The smallest bucket's upper edge: shorter responses share one bucket.
pub const FIRST_EDGE: u64 = 16;

/// The responses of one length bucket (in one step, or merged over steps).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LengthBucket {
    /// Response lengths in tokens, `lo <= len < hi`.
    pub lo: u64,
    pub hi: u64,
    /// Responses in the bucket, and their tokens.
    pub responses: u64,
    pub tokens: u64,
    /// Responses judged correct.
    pub correct: u64,
    /// mean(exp(d) - d - 1) over the bucket's tokens (the step's `mismatch_kl`
    /// restricted to the bucket).
    pub kl_mean: f64,
    /// max |p_train - p_rollout| over the bucket's tokens.
    pub diff_max: f64,
    /// correct / responses.
    pub accuracy: f64,
}

/// The bucket `[lo, hi)` a response of `len` tokens falls in.
pub fn bucket_of(len: u64) -> (u64, u64) {
    if len < FIRST_EDGE {
        return (0, FIRST_EDGE);
    }
    let lo = 1u64 << (63 - len.leading_zeros());
    (lo, lo.saturating_mul(2))
}

/// Per-bucket statistics of one step: `train[i]` and `rollout[i]` are response
/// i's token logprobs (the same length), `correct[i]` its verdict.
pub fn by_length(train: &[Vec<f64>], rollout: &[Vec<f64>], correct: &[bool]) -> Vec<LengthBucket> {
    assert_eq!(train.len(), rollout.len());
    assert_eq!(train.len(), correct.len());
    let mut out: Vec<LengthBucket> = Vec::new();
    let mut kl_sums: Vec<f64> = Vec::new();
    for ((t, r), &ok) in train.iter().zip(rollout).zip(correct) {
        assert_eq!(t.len(), r.len());
        let (lo, hi) = bucket_of(t.len() as u64);
        let i = match out.iter().position(|b| b.lo == lo) {
            Some(i) => i,
            None => {
                out.push(LengthBucket {
                    lo,
                    hi,
                    ..Default::default()
                });
                kl_sums.push(0.0);
                out.len() - 1
            }
        };
        let b = &mut out[i];
        b.responses += 1;
        b.tokens += t.len() as u64;
        b.correct += ok as u64;
        for (&lt, &lr) in t.iter().zip(r) {
            kl_sums[i] += k3(lt, lr);
            b.diff_max = b.diff_max.max(abs_prob_diff(lt, lr));
        }
    }
    for (b, kl) in out.iter_mut().zip(kl_sums) {
        b.kl_mean = kl / b.tokens.max(1) as f64;
        b.accuracy = b.correct as f64 / b.responses as f64;
    }
    out.sort_by_key(|b| b.lo);
    out
}

/// Adds one step's buckets into a running total (over steps): counts add, the
/// KL mean is weighted by tokens, the max stays a max.
pub fn merge(total: &mut Vec<LengthBucket>, step: &[LengthBucket]) {
    for s in step {
        match total.iter_mut().find(|b| b.lo == s.lo) {
            Some(b) => {
                let tokens = b.tokens + s.tokens;
                b.kl_mean = (b.kl_mean * b.tokens as f64 + s.kl_mean * s.tokens as f64)
                    / tokens.max(1) as f64;
                b.tokens = tokens;
                b.responses += s.responses;
                b.correct += s.correct;
                b.diff_max = b.diff_max.max(s.diff_max);
                b.accuracy = b.correct as f64 / b.responses.max(1) as f64;
            }
            None => total.push(s.clone()),
        }
    }
    total.sort_by_key(|b| b.lo);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_edges() {
        for (len, want) in [
            (0, (0, 16)),
            (1, (0, 16)),
            (15, (0, 16)),
            (16, (16, 32)),
            (31, (16, 32)),
            (32, (32, 64)),
            (255, (128, 256)),
            (256, (256, 512)),
            (363, (256, 512)),
            (1024, (1024, 2048)),
        ] {
            assert_eq!(bucket_of(len), want, "{len}");
        }
        assert_eq!(bucket_of(u64::MAX).1, u64::MAX);
    }

    /// Three responses by hand: two short ones (one token off by d = ln 2, one
    /// correct response) and one of 20 tokens with no mismatch.
    #[test]
    fn hand_made_step() {
        let ln2 = 2f64.ln();
        let half = 0.5f64.ln();
        let a_train = vec![half, 0.0];
        let a_roll = vec![half - ln2, 0.0]; // p 0.5 vs 0.25: d = ln 2
        let b = vec![half; 3];
        let c = vec![-1.0; 20];
        let got = by_length(
            &[a_train, b.clone(), c.clone()],
            &[a_roll, b, c],
            &[false, true, true],
        );
        // K3 of d = ln 2: 2 - ln 2 - 1; over the 5 tokens of the short bucket.
        let kl = (1.0 - ln2) / 5.0;
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].lo, got[0].hi), (0, 16));
        assert_eq!((got[0].responses, got[0].tokens, got[0].correct), (2, 5, 1));
        assert!((got[0].kl_mean - kl).abs() < 1e-15, "{}", got[0].kl_mean);
        assert!((got[0].diff_max - 0.25).abs() < 1e-15);
        assert_eq!(got[0].accuracy, 0.5);
        assert_eq!(
            got[1],
            LengthBucket {
                lo: 16,
                hi: 32,
                responses: 1,
                tokens: 20,
                correct: 1,
                kl_mean: 0.0,
                diff_max: 0.0,
                accuracy: 1.0,
            }
        );
        // Over two steps: the KL is weighted by tokens, counts add.
        let mut total = Vec::new();
        merge(&mut total, &got);
        let later = vec![LengthBucket {
            lo: 0,
            hi: 16,
            responses: 1,
            tokens: 15,
            correct: 1,
            kl_mean: 0.0,
            diff_max: 0.5,
            accuracy: 1.0,
        }];
        merge(&mut total, &later);
        assert_eq!(total.len(), 2);
        assert_eq!(
            (total[0].responses, total[0].tokens, total[0].correct),
            (3, 20, 2)
        );
        assert!((total[0].kl_mean - kl * 5.0 / 20.0).abs() < 1e-15);
        assert_eq!(total[0].diff_max, 0.5);
        assert!((total[0].accuracy - 2.0 / 3.0).abs() < 1e-15);
        assert_eq!(total[1], got[1]);
    }

    #[test]
    fn no_responses_no_buckets() {
        assert!(by_length(&[], &[], &[]).is_empty());
    }
}
