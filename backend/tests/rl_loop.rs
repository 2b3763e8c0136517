//! The RL loop on the CPU, through the library: exact zero mismatch in the fp8
//! flow, a real one in the off-policy baseline, and bitwise determinism.

use jet_backend::config::{FlowName, RunConfig};
use jet_backend::trainer::{StepMetrics, Trainer};
use jet_kernels::Flow;

fn small(flow: Flow, seed: u64) -> RunConfig {
    let mut c = RunConfig::tiny_arith();
    c.sft.steps = 15;
    c.run.steps = 3;
    c.run.eval_size = 16;
    c.run.eval_every = 2;
    c.rollout.prompts_per_step = 6;
    c.rollout.group_size = 4;
    c.run.flow = FlowName(flow);
    c.run.seed = seed;
    c
}

fn run(cfg: RunConfig) -> (Vec<StepMetrics>, Trainer) {
    let mut t = Trainer::new(cfg, None).expect("trainer");
    let mut ms = Vec::new();
    while let Some(m) = t.next_step() {
        ms.push(m.expect("step"));
    }
    (ms, t)
}

fn rl(ms: &[StepMetrics]) -> Vec<&StepMetrics> {
    ms.iter().filter(|m| m.phase == "rl").collect()
}

#[test]
fn fp8_and_bf16_flows_have_exactly_zero_mismatch_on_the_cpu() {
    for flow in [Flow::Fp8, Flow::Bf16] {
        let (ms, _) = run(small(flow, 3));
        let steps = rl(&ms);
        assert_eq!(steps.len(), 3);
        for m in steps {
            assert_eq!(m.mismatch_kl, Some(0.0), "{flow} step {}", m.step);
            assert_eq!(m.mismatch_abs_prob_diff_mean, Some(0.0));
            assert_eq!(m.mismatch_abs_prob_diff_max, Some(0.0));
            assert_eq!(m.token_mult_prob_error, Some(1.0));
            assert_eq!(
                (m.is_ratio_min, m.is_ratio_mean, m.is_ratio_max),
                (Some(1.0), Some(1.0), Some(1.0))
            );
            assert!(!m.mismatch_by_length.is_empty());
            for b in &m.mismatch_by_length {
                assert_eq!((b.kl_mean, b.diff_max), (0.0, 0.0), "{flow} {b:?}");
            }
        }
    }
}

#[test]
fn fp8_rollout_with_bf16_training_is_off_policy() {
    let (ms, _) = run(small(Flow::Bf16Fp8Rollout, 3));
    for m in rl(&ms) {
        let kl = m.mismatch_kl.unwrap();
        assert!(
            kl > 0.0 && kl.is_finite(),
            "step {}: mismatch_kl {kl}",
            m.step
        );
        assert!(m.mismatch_abs_prob_diff_max.unwrap() > 0.0);
        assert!(m.token_mult_prob_error.unwrap() > 1.0);
        assert!(m.is_ratio_min.unwrap() < 1.0 && m.is_ratio_max.unwrap() > 1.0);
    }
}

#[test]
fn same_seed_same_metrics_and_weights_bit_for_bit() {
    let (a, ta) = run(small(Flow::Fp8, 5));
    let (b, tb) = run(small(Flow::Fp8, 5));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.without_timing(), y.without_timing());
    }
    assert!(ta.weights == tb.weights, "final weights differ");
    let (c, _) = run(small(Flow::Fp8, 6));
    assert_ne!(
        rl(&a)
            .iter()
            .map(|m| m.without_timing())
            .collect::<Vec<_>>(),
        rl(&c)
            .iter()
            .map(|m| m.without_timing())
            .collect::<Vec<_>>(),
        "a different seed gives a different run"
    );
}

#[test]
fn metrics_carry_the_design_fields() {
    let (ms, _) = run(small(Flow::Fp8, 1));
    let fields = [
        "phase",
        "step",
        "flow",
        "accuracy",
        "reward_mean",
        "reward_std",
        "response_len_mean",
        "entropy",
        "loss",
        "grad_norm",
        "clip_frac",
        "lr",
        "mismatch_kl",
        "mismatch_abs_prob_diff_mean",
        "mismatch_abs_prob_diff_max",
        "token_mult_prob_error",
        "rollout_s",
        "train_s",
        "step_s",
        "rollout_tokens_per_s",
        "train_tokens_per_s",
    ];
    let steps = rl(&ms);
    for m in &steps {
        let v: serde_json::Value = serde_json::from_str(&m.to_json_line()).unwrap();
        for f in fields {
            assert!(v.get(f).is_some(), "step {} lacks {f}", m.step);
        }
        assert_eq!(v["phase"], "rl");
        assert_eq!(v["flow"], "fp8");
        // The KV-cache fields are the GPU's paged cache's: absent on the CPU.
        for f in ["kv_peak_gib", "kv_pool_gib", "rollout_preemptions"] {
            assert!(v.get(f).is_none(), "step {} has {f} on the CPU", m.step);
        }
        // The per-length buckets partition the step's responses.
        let b = &m.mismatch_by_length;
        let responses: u64 = b.iter().map(|b| b.responses).sum();
        let tokens: u64 = b.iter().map(|b| b.tokens).sum();
        let correct: u64 = b.iter().map(|b| b.correct).sum();
        assert_eq!(responses, 24);
        assert_eq!(Some(tokens as f64 / 24.0), m.response_len_mean);
        assert_eq!(Some(correct as f64 / 24.0), m.accuracy);
    }
    // Evaluation steps carry the held-out accuracy: every 2nd and the last.
    let with: Vec<u64> = steps
        .iter()
        .filter(|m| m.heldout_accuracy.is_some())
        .map(|m| m.step)
        .collect();
    assert_eq!(with, vec![0, 2]);
    assert!(ms.iter().filter(|m| m.phase == "sft").count() == 15);
}
