//! The per-step metrics record: one JSON object per step (the `--metrics-out`
//! file, the store and `jetctl metrics --format jsonl` all use it).

use serde::{Deserialize, Serialize};

use crate::rl::by_length::LengthBucket;

/// Fields that are wall-clock measurements: everything else in a record is a
/// deterministic function of (config, seed) on the CPU.
pub const TIMING_FIELDS: [&str; 5] = [
    "rollout_s",
    "train_s",
    "step_s",
    "rollout_tokens_per_s",
    "train_tokens_per_s",
];

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// "sft" for warm-up steps, "rl" for RL steps.
    pub phase: String,
    pub step: u64,
    pub flow: String,
    pub loss: f64,
    pub grad_norm: f64,
    pub lr: f64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub accuracy: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub heldout_accuracy: Option<f64>,
    /// pass@k on the held-out problems (evaluation steps with `run.eval_pass_k`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub heldout_pass_at_k: Option<f64>,
    /// The k of `heldout_pass_at_k`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub heldout_pass_k: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reward_mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reward_std: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub frac_reward_zero_std: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub response_len_mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub entropy: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub clip_frac: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kl_ref: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mismatch_kl: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mismatch_abs_prob_diff_mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mismatch_abs_prob_diff_max: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub token_mult_prob_error: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub is_ratio_min: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub is_ratio_mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub is_ratio_max: Option<f64>,
    /// The mismatch and accuracy per response-length bucket (RL steps; absent
    /// from records written before it existed).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub mismatch_by_length: Vec<LengthBucket>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rollout_s: Option<f64>,
    pub train_s: f64,
    pub step_s: f64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rollout_tokens_per_s: Option<f64>,
    pub train_tokens_per_s: f64,
    /// GiB of KV-cache pages in use at most during the step's rollout (GPU
    /// runs: the paged cache; absent on the CPU).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kv_peak_gib: Option<f64>,
    /// GiB of the KV cache's page pool (`rollout.kv_cache_gib`, or room for
    /// every sequence at full length).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kv_pool_gib: Option<f64>,
    /// Sequences the rollout preempted for want of a free page (each prefilled
    /// again later, its bits unchanged): above 0, a larger
    /// `rollout.kv_cache_gib` would speed the rollout.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rollout_preemptions: Option<u64>,
}

impl StepMetrics {
    /// One JSON line.
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("metrics serialize")
    }

    /// A copy with the wall-clock fields removed (for determinism checks).
    pub fn without_timing(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("metrics serialize");
        if let Some(o) = v.as_object_mut() {
            for f in TIMING_FIELDS {
                o.remove(f);
            }
        }
        v
    }

    /// The readable progress line printed per step.
    pub fn progress_line(&self, total: u64) -> String {
        let f = |x: Option<f64>| x.map_or("    -".to_string(), |v| format!("{v:5.3}"));
        if self.phase == "sft" {
            return format!(
                "sft {:>4}/{total} loss {:7.4} grad {:7.3} lr {:.2e} {:6.2}s",
                self.step + 1,
                self.loss,
                self.grad_norm,
                self.lr,
                self.step_s
            );
        }
        let preempted = match self.rollout_preemptions {
            Some(n @ 1..) => format!(", {n} preempted"),
            _ => String::new(),
        };
        format!(
            "rl  {:>4}/{total} reward {} acc {} heldout {} len {:5.2} ent {} kl_mis {} clip {} {:6.2}s (rollout {:.2}s{preempted}, train {:.2}s)",
            self.step + 1,
            f(self.reward_mean),
            f(self.accuracy),
            f(self.heldout_accuracy),
            self.response_len_mean.unwrap_or(0.0),
            f(self.entropy),
            self.mismatch_kl.map_or("-".into(), |v| format!("{v:.2e}")),
            f(self.clip_frac),
            self.step_s,
            self.rollout_s.unwrap_or(0.0),
            self.train_s
        )
    }
}
