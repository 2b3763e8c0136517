//! AdamW on f32 master weights, the learning-rate schedule, and global
//! gradient-norm clipping.

use serde::{Deserialize, Serialize};

use crate::model::{ModelConfig, ModelWeights};

/// Learning-rate schedule after a linear warm-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    Constant,
    Cosine,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptimConfig {
    pub lr: f64,
    pub warmup_steps: u64,
    pub schedule: Schedule,
    /// Cosine decays to `lr * min_lr_ratio` at `total_steps`.
    pub min_lr_ratio: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Global L2 norm above which gradients are scaled down (0 = off).
    pub grad_clip: f64,
}

impl OptimConfig {
    /// Learning rate of optimizer step `step` (0-based) out of `total`.
    pub fn lr_at(&self, step: u64, total: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        match self.schedule {
            Schedule::Constant => self.lr,
            Schedule::Cosine => {
                let span = total.saturating_sub(self.warmup_steps).max(1) as f64;
                let t = ((step - self.warmup_steps) as f64 / span).min(1.0);
                let min = self.lr * self.min_lr_ratio;
                min + (self.lr - min) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
            }
        }
    }
}

/// AdamW state: first and second moments in f32, laid out like the weights.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW {
    pub m: ModelWeights,
    pub v: ModelWeights,
    /// Optimizer steps taken.
    pub t: u64,
}

/// L2 norm over every gradient value (f64 accumulation).
pub fn global_norm(g: &ModelWeights) -> f64 {
    g.tensors()
        .iter()
        .flat_map(|(_, t)| t.iter())
        .map(|&x| (x as f64) * (x as f64))
        .sum::<f64>()
        .sqrt()
}

impl AdamW {
    pub fn new(cfg: &ModelConfig) -> Self {
        AdamW {
            m: ModelWeights::zeros(cfg),
            v: ModelWeights::zeros(cfg),
            t: 0,
        }
    }

    /// One step with learning rate `lr`. Gradients are clipped to `grad_clip` by
    /// global norm first; returns the norm before clipping. Weight decay applies
    /// to matrices only (not to norms, biases).
    pub fn step(
        &mut self,
        w: &mut ModelWeights,
        g: &ModelWeights,
        cfg: &OptimConfig,
        lr: f64,
    ) -> f64 {
        let norm = global_norm(g);
        let scale = if cfg.grad_clip > 0.0 && norm > cfg.grad_clip {
            cfg.grad_clip / norm
        } else {
            1.0
        };
        self.t += 1;
        let bc1 = 1.0 - cfg.beta1.powi(self.t as i32);
        let bc2 = 1.0 - cfg.beta2.powi(self.t as i32);
        let (b1, b2) = (cfg.beta1 as f32, cfg.beta2 as f32);
        let wd_factor = (1.0 - lr * cfg.weight_decay) as f32;
        for ((((name, p), (_, gt)), (_, m)), (_, v)) in w
            .tensors_mut()
            .into_iter()
            .zip(g.tensors())
            .zip(self.m.tensors_mut())
            .zip(self.v.tensors_mut())
        {
            let decay = !(name.contains("norm") || name.ends_with(".bias"));
            for i in 0..p.len() {
                let gi = gt[i] * scale as f32;
                m[i] = b1 * m[i] + (1.0 - b1) * gi;
                v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
                let mhat = m[i] as f64 / bc1;
                let vhat = v[i] as f64 / bc2;
                if decay {
                    p[i] *= wd_factor;
                }
                p[i] -= (lr * mhat / (vhat.sqrt() + cfg.eps)) as f32;
            }
        }
        norm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ocfg() -> OptimConfig {
        OptimConfig {
            lr: 1e-3,
            warmup_steps: 10,
            schedule: Schedule::Cosine,
            min_lr_ratio: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            grad_clip: 1.0,
        }
    }

    #[test]
    fn schedule_warms_up_then_decays() {
        let c = ocfg();
        assert!((c.lr_at(0, 100) - 1e-4).abs() < 1e-15);
        assert!((c.lr_at(9, 100) - 1e-3).abs() < 1e-15);
        assert!((c.lr_at(10, 100) - 1e-3).abs() < 1e-15);
        assert!((c.lr_at(100, 100) - 1e-4).abs() < 1e-15);
        assert!(c.lr_at(50, 100) < 1e-3 && c.lr_at(50, 100) > 1e-4);
        let k = OptimConfig {
            schedule: Schedule::Constant,
            ..c
        };
        assert_eq!(k.lr_at(80, 100), 1e-3);
    }

    #[test]
    fn adam_first_step_moves_each_weight_by_lr_against_the_gradient_sign() {
        let cfg = crate::transformer::tests_support::tiny_config();
        let mut w = ModelWeights::zeros(&cfg);
        let mut g = ModelWeights::zeros(&cfg);
        for (_, t) in g.tensors_mut() {
            for (i, v) in t.iter_mut().enumerate() {
                *v = if i % 2 == 0 { 1e-3 } else { -1e-3 };
            }
        }
        let mut opt = AdamW::new(&cfg);
        let c = OptimConfig {
            grad_clip: 0.0,
            ..ocfg()
        };
        opt.step(&mut w, &g, &c, 1e-2);
        for (_, t) in w.tensors() {
            for (i, v) in t.iter().enumerate() {
                let want = if i % 2 == 0 { -1e-2 } else { 1e-2 };
                assert!((v - want).abs() < 1e-6, "{v} vs {want}");
            }
        }
    }

    #[test]
    fn clipping_bounds_the_update_direction_norm() {
        let cfg = crate::transformer::tests_support::tiny_config();
        let mut g = ModelWeights::zeros(&cfg);
        g.norm[0] = 30.0;
        g.norm[1] = 40.0;
        assert_eq!(global_norm(&g), 50.0);
        let mut w = ModelWeights::zeros(&cfg);
        let mut opt = AdamW::new(&cfg);
        let n = opt.step(&mut w, &g, &ocfg(), 1e-3);
        assert_eq!(n, 50.0);
        // First moment holds the clipped gradient: (1-b1) * 30/50.
        assert!((opt.m.norm[0] - 0.1 * 0.6).abs() < 1e-7);
    }
}
