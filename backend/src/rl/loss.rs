//! The PPO clipped surrogate with token-level aggregation, optional truncated
//! importance sampling (TIS) against the rollout's logprobs, an optional k3 KL
//! penalty to a reference policy, and an optional entropy bonus.
//!
//! Per response token t of a sample with advantage A:
//! `r = exp(logp - logp_old)`, `s = min(r A, clip(r, 1-eps_low, 1+eps_high) A)`,
//! `w = min(exp(logp_old - logp_rollout), tis_cap)` (1 without TIS),
//! `loss_t = -w s + beta kl_t - c_ent H_t`, and the loss is the sum over all
//! response tokens of the batch divided by their number.

/// Settings of the policy loss.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossConfig {
    pub clip_low: f64,
    pub clip_high: f64,
    /// Cap of the truncated importance weight; `None` turns TIS off.
    pub tis_cap: Option<f64>,
    /// Coefficient of the k3 KL to the reference policy (0 = off).
    pub kl_coef: f64,
    /// Coefficient of the entropy bonus (0 = off).
    pub entropy_coef: f64,
}

/// One token's inputs.
#[derive(Clone, Copy, Debug)]
pub struct TokenInput {
    pub logp: f64,
    pub logp_old: f64,
    pub logp_rollout: f64,
    pub logp_ref: Option<f64>,
    pub advantage: f64,
}

/// One token's loss and its derivatives with respect to logp and entropy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenLoss {
    pub loss: f64,
    pub dlogp: f64,
    pub dentropy: f64,
    pub clipped: bool,
    pub kl: f64,
}

/// Loss of one token, scaled by `1/n_tokens` (token-level aggregation).
pub fn token_loss(cfg: &LossConfig, t: TokenInput, entropy: f64, n_tokens: usize) -> TokenLoss {
    let inv_n = 1.0 / n_tokens as f64;
    let r = (t.logp - t.logp_old).exp();
    let a = t.advantage;
    let rc = r.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
    let (s1, s2) = (r * a, rc * a);
    // The clipped term is active when it is strictly smaller; its gradient is 0
    // when r is outside the clip range.
    let clipped = s2 < s1;
    let (s, ds) = if clipped {
        (s2, if rc == r { a * r } else { 0.0 })
    } else {
        (s1, a * r)
    };
    let w = match cfg.tis_cap {
        Some(cap) => (t.logp_old - t.logp_rollout).exp().min(cap),
        None => 1.0,
    };
    let mut loss = -w * s;
    let mut dlogp = -w * ds;
    let mut kl = 0.0;
    if let (Some(lr), true) = (t.logp_ref, cfg.kl_coef != 0.0) {
        // k3: exp(ref - logp) - (ref - logp) - 1; d/dlogp = 1 - exp(ref - logp).
        let x = lr - t.logp;
        kl = x.exp() - x - 1.0;
        loss += cfg.kl_coef * kl;
        dlogp += cfg.kl_coef * (1.0 - x.exp());
    }
    loss -= cfg.entropy_coef * entropy;
    TokenLoss {
        loss: loss * inv_n,
        dlogp: dlogp * inv_n,
        dentropy: -cfg.entropy_coef * inv_n,
        clipped,
        kl,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LossConfig {
        LossConfig {
            clip_low: 0.2,
            clip_high: 0.28,
            tis_cap: None,
            kl_coef: 0.0,
            entropy_coef: 0.0,
        }
    }

    fn input(logp: f64, old: f64, adv: f64) -> TokenInput {
        TokenInput {
            logp,
            logp_old: old,
            logp_rollout: old,
            logp_ref: None,
            advantage: adv,
        }
    }

    fn fd(c: &LossConfig, t: TokenInput) -> f64 {
        let h = 1e-6;
        let f = |lp: f64| token_loss(c, TokenInput { logp: lp, ..t }, 0.0, 1).loss;
        (f(t.logp + h) - f(t.logp - h)) / (2.0 * h)
    }

    #[test]
    fn on_policy_gradient_is_minus_advantage() {
        let l = token_loss(&cfg(), input(-1.0, -1.0, 2.0), 0.0, 4);
        assert!((l.loss + 0.5).abs() < 1e-12 && (l.dlogp + 0.5).abs() < 1e-12 && !l.clipped);
    }

    #[test]
    fn clipping_is_asymmetric_and_stops_the_gradient() {
        let c = cfg();
        // Positive advantage, ratio above 1 + clip_high: clipped, no gradient.
        let t = input((1.3f64).ln(), 0.0, 1.0);
        let l = token_loss(&c, t, 0.0, 1);
        assert!(l.clipped && l.dlogp == 0.0 && (l.loss + 1.28).abs() < 1e-12);
        // Ratio 1.25 is inside [0.8, 1.28]: not clipped.
        assert!(!token_loss(&c, input((1.25f64).ln(), 0.0, 1.0), 0.0, 1).clipped);
        // Negative advantage, ratio below 1 - clip_low: clipped.
        let l = token_loss(&c, input((0.7f64).ln(), 0.0, -1.0), 0.0, 1);
        assert!(l.clipped && l.dlogp == 0.0);
        // Negative advantage, ratio above: the unclipped term is the min, gradient flows.
        let t = input((1.5f64).ln(), 0.0, -1.0);
        let l = token_loss(&c, t, 0.0, 1);
        assert!(!l.clipped && (l.dlogp - fd(&c, t)).abs() < 1e-6);
    }

    #[test]
    fn tis_weight_is_capped() {
        let c = LossConfig {
            tis_cap: Some(2.0),
            ..cfg()
        };
        let mut t = input(-1.0, -1.0, 1.0);
        t.logp_rollout = -3.0; // ratio e^2 > cap
        let l = token_loss(&c, t, 0.0, 1);
        assert!((l.dlogp + 2.0).abs() < 1e-12);
        t.logp_rollout = -1.5; // ratio e^0.5 < cap
        let l = token_loss(&c, t, 0.0, 1);
        assert!((l.dlogp + 0.5f64.exp()).abs() < 1e-12);
    }

    #[test]
    fn kl_term_gradient() {
        let c = LossConfig {
            kl_coef: 0.1,
            ..cfg()
        };
        let mut t = input(-1.0, -1.1, 0.5);
        t.logp_ref = Some(-1.4);
        let l = token_loss(&c, t, 0.0, 1);
        assert!(l.kl > 0.0);
        assert!((l.dlogp - fd(&c, t)).abs() < 1e-6);
    }
}
