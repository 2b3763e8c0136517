//! Collapse detection: rules over the per-step metrics, each an alarm when it
//! fires. The daemon acts on alarms (automatic rollback, pause).

use crate::config::HealthSection;
use crate::trainer::StepMetrics;

/// A fired rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Alarm {
    /// alarm.nan, alarm.reward_collapse, alarm.entropy, alarm.mismatch, alarm.grad_spike
    pub kind: &'static str,
    pub message: String,
    /// Whether the run is unhealthy (rolls back under auto_rollback); the
    /// mismatch alarm only warns.
    pub collapse: bool,
}

/// Running state of the rules (reset by a rollback).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Health {
    reward_ema: Option<f64>,
    best_ema: Option<f64>,
    below: u64,
    grad_ema: Option<f64>,
}

impl Health {
    /// Check one RL step's metrics; returns the alarms it raises.
    pub fn check(&mut self, cfg: &HealthSection, m: &StepMetrics) -> Vec<Alarm> {
        let mut out = Vec::new();
        let mut alarm = |kind, message: String, collapse| {
            out.push(Alarm {
                kind,
                message,
                collapse,
            })
        };
        if !m.loss.is_finite() || !m.grad_norm.is_finite() {
            alarm(
                "alarm.nan",
                format!("step {}: loss {} grad_norm {}", m.step, m.loss, m.grad_norm),
                true,
            );
        }
        if let Some(r) = m.reward_mean {
            let ema = match self.reward_ema {
                None => r,
                Some(e) => cfg.reward_ema * e + (1.0 - cfg.reward_ema) * r,
            };
            self.reward_ema = Some(ema);
            let best = self.best_ema.map_or(ema, |b: f64| b.max(ema));
            self.best_ema = Some(best);
            if cfg.reward_drop > 0.0 && r < best - cfg.reward_drop {
                self.below += 1;
                if self.below >= cfg.reward_drop_steps {
                    alarm(
                        "alarm.reward_collapse",
                        format!(
                            "step {}: reward_mean {r:.3} below best EMA {best:.3} - {} for {} steps",
                            m.step, cfg.reward_drop, self.below
                        ),
                        true,
                    );
                }
            } else {
                self.below = 0;
            }
        }
        if let Some(e) = m.entropy {
            if cfg.entropy_min > 0.0 && e < cfg.entropy_min {
                alarm(
                    "alarm.entropy",
                    format!(
                        "step {}: entropy {e:.4} collapsed below {}",
                        m.step, cfg.entropy_min
                    ),
                    true,
                );
            }
            if cfg.entropy_max > 0.0 && e > cfg.entropy_max {
                alarm(
                    "alarm.entropy",
                    format!(
                        "step {}: entropy {e:.4} exploded above {}",
                        m.step, cfg.entropy_max
                    ),
                    true,
                );
            }
        }
        if let Some(k) = m.mismatch_kl {
            if cfg.mismatch_kl_alarm > 0.0 && k > cfg.mismatch_kl_alarm {
                alarm(
                    "alarm.mismatch",
                    format!(
                        "step {}: mismatch_kl {k:.3e} above {:.1e}: rollout and training disagree",
                        m.step, cfg.mismatch_kl_alarm
                    ),
                    false,
                );
            }
        }
        if m.grad_norm.is_finite() {
            if let Some(g) = self.grad_ema {
                if cfg.grad_norm_spike > 0.0 && m.grad_norm > cfg.grad_norm_spike * g {
                    alarm(
                        "alarm.grad_spike",
                        format!(
                            "step {}: grad_norm {:.3} is {:.1}x its EMA {g:.3}",
                            m.step,
                            m.grad_norm,
                            m.grad_norm / g
                        ),
                        true,
                    );
                }
            }
            self.grad_ema = Some(
                self.grad_ema
                    .map_or(m.grad_norm, |g| 0.9 * g + 0.1 * m.grad_norm),
            );
        }
        out
    }
}

/// The warning a step's KV-cache preemptions earn (None: none preempted, or
/// not a GPU rollout). Not an alarm: the bits are the same, only slower.
pub fn preemption_warning(m: &StepMetrics) -> Option<String> {
    let n = m.rollout_preemptions.filter(|&n| n > 0)?;
    Some(format!(
        "step {}: the KV cache ({:.2} GiB, rollout.kv_cache_gib) ran out of pages; {n} \
         sequences were preempted and prefilled again (the same bits, more time); a larger \
         rollout.kv_cache_gib avoids it",
        m.step,
        m.kv_pool_gib.unwrap_or(0.0)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preemptions_warn_naming_the_setting() {
        let mut s = m(4, 0.5, 1.0, 1.0);
        assert_eq!(preemption_warning(&s), None);
        s.rollout_preemptions = Some(0);
        assert_eq!(preemption_warning(&s), None);
        (s.rollout_preemptions, s.kv_pool_gib) = (Some(7), Some(6.0));
        let w = preemption_warning(&s).unwrap();
        assert!(w.starts_with("step 4: the KV cache (6.00 GiB"), "{w}");
        assert!(w.contains("7 sequences were preempted") && w.contains("rollout.kv_cache_gib"));
    }

    fn m(step: u64, reward: f64, entropy: f64, grad: f64) -> StepMetrics {
        StepMetrics {
            phase: "rl".into(),
            step,
            reward_mean: Some(reward),
            entropy: Some(entropy),
            grad_norm: grad,
            mismatch_kl: Some(0.0),
            ..Default::default()
        }
    }

    #[test]
    fn reward_collapse_fires_after_k_steps_below() {
        let cfg = HealthSection {
            reward_drop: 0.2,
            reward_drop_steps: 3,
            reward_ema: 0.5,
            ..Default::default()
        };
        let mut h = Health::default();
        for s in 0..5 {
            assert!(h.check(&cfg, &m(s, 0.8, 1.0, 1.0)).is_empty());
        }
        assert!(h.check(&cfg, &m(5, 0.1, 1.0, 1.0)).is_empty());
        assert!(h.check(&cfg, &m(6, 0.1, 1.0, 1.0)).is_empty());
        let a = h.check(&cfg, &m(7, 0.1, 1.0, 1.0));
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].kind, "alarm.reward_collapse");
        assert!(a[0].collapse);
    }

    #[test]
    fn nan_entropy_mismatch_and_spikes() {
        let cfg = HealthSection {
            entropy_min: 0.05,
            entropy_max: 5.0,
            grad_norm_spike: 10.0,
            mismatch_kl_alarm: 1e-3,
            ..Default::default()
        };
        let mut h = Health::default();
        assert!(h.check(&cfg, &m(0, 0.5, 1.0, 1.0)).is_empty());
        let kinds = |a: Vec<Alarm>| a.into_iter().map(|x| x.kind).collect::<Vec<_>>();
        assert_eq!(
            kinds(h.check(&cfg, &m(1, 0.5, 0.01, 1.0))),
            vec!["alarm.entropy"]
        );
        assert_eq!(
            kinds(h.check(&cfg, &m(2, 0.5, 9.0, 1.0))),
            vec!["alarm.entropy"]
        );
        assert_eq!(
            kinds(h.check(&cfg, &m(3, 0.5, 1.0, 50.0))),
            vec!["alarm.grad_spike"]
        );
        let mut x = m(4, 0.5, 1.0, 1.0);
        x.loss = f64::NAN;
        assert_eq!(kinds(h.check(&cfg, &x)), vec!["alarm.nan"]);
        let mut y = m(5, 0.5, 1.0, 1.0);
        y.mismatch_kl = Some(0.1);
        let a = h.check(&cfg, &y);
        assert_eq!(a[0].kind, "alarm.mismatch");
        assert!(
            !a[0].collapse,
            "a mismatch alarm warns, it does not roll back"
        );
    }
}
