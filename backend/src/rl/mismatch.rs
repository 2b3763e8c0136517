//! Rollout/training mismatch metrics over response tokens, from the rollout's
//! logprobs and the trainer's logprobs of the same tokens at the same weights.

use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Mismatch {
    /// mean(exp(d) - d - 1), d = logp_train - logp_rollout (the k3 estimator).
    pub mismatch_kl: f64,
    pub mismatch_abs_prob_diff_mean: f64,
    pub mismatch_abs_prob_diff_max: f64,
    /// mean(exp(|d|)).
    pub token_mult_prob_error: f64,
    /// exp(d): min, mean, max.
    pub is_ratio_min: f64,
    pub is_ratio_mean: f64,
    pub is_ratio_max: f64,
}

/// The k3 estimator's term for one token: exp(d) - d - 1, d = logp_train - logp_rollout.
pub fn k3(logp_train: f64, logp_rollout: f64) -> f64 {
    let d = logp_train - logp_rollout;
    d.exp() - d - 1.0
}

/// |p_train - p_rollout| for one token.
pub fn abs_prob_diff(logp_train: f64, logp_rollout: f64) -> f64 {
    (logp_train.exp() - logp_rollout.exp()).abs()
}

/// Metrics over paired logprobs (empty input gives the all-equal values).
pub fn mismatch(train: &[f64], rollout: &[f64]) -> Mismatch {
    assert_eq!(train.len(), rollout.len());
    let n = train.len();
    if n == 0 {
        return Mismatch {
            token_mult_prob_error: 1.0,
            is_ratio_min: 1.0,
            is_ratio_mean: 1.0,
            is_ratio_max: 1.0,
            ..Default::default()
        };
    }
    let mut m = Mismatch {
        is_ratio_min: f64::INFINITY,
        is_ratio_max: f64::NEG_INFINITY,
        ..Default::default()
    };
    for (&lt, &lr) in train.iter().zip(rollout) {
        let d = lt - lr;
        let r = d.exp();
        m.mismatch_kl += k3(lt, lr);
        let pd = abs_prob_diff(lt, lr);
        m.mismatch_abs_prob_diff_mean += pd;
        m.mismatch_abs_prob_diff_max = m.mismatch_abs_prob_diff_max.max(pd);
        m.token_mult_prob_error += d.abs().exp();
        m.is_ratio_min = m.is_ratio_min.min(r);
        m.is_ratio_max = m.is_ratio_max.max(r);
        m.is_ratio_mean += r;
    }
    let nf = n as f64;
    m.mismatch_kl /= nf;
    m.mismatch_abs_prob_diff_mean /= nf;
    m.token_mult_prob_error /= nf;
    m.is_ratio_mean /= nf;
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_when_identical_and_positive_otherwise() {
        let a = [-0.1, -2.0, -0.5];
        let m = mismatch(&a, &a);
        assert_eq!(m.mismatch_kl, 0.0);
        assert_eq!(m.mismatch_abs_prob_diff_max, 0.0);
        assert_eq!(m.token_mult_prob_error, 1.0);
        assert_eq!((m.is_ratio_min, m.is_ratio_max), (1.0, 1.0));
        let b = [-0.2, -2.0, -0.4];
        let m = mismatch(&a, &b);
        let k3 = |d: f64| d.exp() - d - 1.0;
        assert!((m.mismatch_kl - (k3(0.1) + k3(-0.1)) / 3.0).abs() < 1e-15);
        assert!((m.is_ratio_max - 0.1f64.exp()).abs() < 1e-15);
        assert!((m.is_ratio_min - (-0.1f64).exp()).abs() < 1e-15);
        assert!((m.mismatch_abs_prob_diff_max - ((-0.1f64).exp() - (-0.2f64).exp())).abs() < 1e-15);
    }
}
