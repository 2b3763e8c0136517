//! Token sampling: temperature, top-k, top-p, from a seeded RNG.
//!
//! The logprob recorded for a sampled token is its log-probability under the
//! tempered distribution `log_softmax(logits / T)` before any top-k/top-p
//! truncation: the trainer computes exactly that quantity, so the two can be
//! compared (and are bitwise equal when the forwards are).

use jet_kernels::ops::logsoftmax::log_softmax_row;
use rand::Rng;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f64,
    /// Keep the smallest set of tokens whose probability reaches top_p (1 = off).
    pub top_p: f64,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
        }
    }
}

/// Logits divided by the temperature (unchanged when greedy).
pub fn temper(logits: &[f32], temperature: f64) -> Vec<f32> {
    if temperature <= 0.0 || temperature == 1.0 {
        return logits.to_vec();
    }
    let t = temperature as f32;
    logits.iter().map(|&z| z / t).collect()
}

/// Sample one token from `logits [vocab]`; returns the token and its logprob.
pub fn sample(logits: &[f32], p: &SamplingParams, rng: &mut impl Rng) -> (u32, f32) {
    sample_logprobs(&log_softmax_row(&temper(logits, p.temperature)), p, rng)
}

impl SamplingParams {
    /// Plain tempered sampling or greedy: no top-k/top-p truncation (what the
    /// GPU's decode steps draw inside their graph, running ahead of the host;
    /// truncated draws run `sample_top` after the step).
    pub fn untruncated(&self) -> bool {
        self.temperature <= 0.0 || (self.top_k == 0 && self.top_p >= 1.0)
    }
}

/// Sample one token from `lp [vocab] = log_softmax(logits / T)`.
pub fn sample_logprobs(lp: &[f32], p: &SamplingParams, rng: &mut impl Rng) -> (u32, f32) {
    if p.temperature <= 0.0 {
        let mut best = 0;
        for (i, &v) in lp.iter().enumerate() {
            if v > lp[best] {
                best = i;
            }
        }
        return (best as u32, lp[best]);
    }
    // Candidates by decreasing probability (ties by token id, for determinism).
    let mut idx: Vec<usize> = (0..lp.len()).collect();
    idx.sort_by(|&a, &b| {
        lp[b]
            .partial_cmp(&lp[a])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    if p.top_k > 0 {
        idx.truncate(p.top_k);
    }
    let probs: Vec<f64> = idx.iter().map(|&i| (lp[i] as f64).exp()).collect();
    let mut keep = probs.len();
    if p.top_p < 1.0 {
        let mut c = 0.0;
        for (j, q) in probs.iter().enumerate() {
            c += q;
            if c >= p.top_p {
                keep = j + 1;
                break;
            }
        }
    }
    let total: f64 = probs[..keep].iter().sum();
    let mut u = rng.random::<f64>() * total;
    for j in 0..keep {
        u -= probs[j];
        if u < 0.0 {
            return (idx[j] as u32, lp[idx[j]]);
        }
    }
    let j = keep - 1;
    (idx[j] as u32, lp[idx[j]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let p = SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            top_k: 20,
        };
        let run = |seed| {
            let mut r = ChaCha8Rng::seed_from_u64(seed);
            (0..200)
                .map(|_| sample(&logits, &p, &mut r))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn top_k_and_top_p_restrict_the_support() {
        let logits = [3.0f32, 2.0, 1.0, 0.0, -1.0];
        let mut r = ChaCha8Rng::seed_from_u64(0);
        let k2 = SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 2,
        };
        for _ in 0..500 {
            assert!(sample(&logits, &k2, &mut r).0 < 2);
        }
        // p(0) = 0.636..., p(0)+p(1) = 0.87: top_p 0.8 keeps tokens 0 and 1.
        let p8 = SamplingParams {
            temperature: 1.0,
            top_p: 0.8,
            top_k: 0,
        };
        let mut seen = [0usize; 5];
        for _ in 0..2000 {
            seen[sample(&logits, &p8, &mut r).0 as usize] += 1;
        }
        assert!(
            seen[0] > 0 && seen[1] > 0 && seen[2..].iter().all(|&c| c == 0),
            "{seen:?}"
        );
    }

    #[test]
    fn frequencies_follow_the_tempered_distribution_and_logprobs_are_untruncated() {
        let logits = [1.0f32, 0.0, -1.0];
        let p = SamplingParams {
            temperature: 0.5,
            top_p: 1.0,
            top_k: 0,
        };
        let mut r = ChaCha8Rng::seed_from_u64(3);
        let n = 40_000;
        let mut c = [0usize; 3];
        let mut lp0 = 0.0;
        for _ in 0..n {
            let (t, lp) = sample(&logits, &p, &mut r);
            c[t as usize] += 1;
            if t == 0 {
                lp0 = lp;
            }
        }
        let z: f64 = [2.0f64, 0.0, -2.0].iter().map(|v| v.exp()).sum();
        let p0 = 2.0f64.exp() / z;
        assert!((c[0] as f64 / n as f64 - p0).abs() < 0.01);
        assert!((lp0 as f64 - p0.ln()).abs() < 1e-5);
        // Top-k does not change the recorded logprob.
        let k1 = SamplingParams { top_k: 1, ..p };
        assert_eq!(sample(&logits, &k1, &mut r), (0, lp0));
        // Greedy.
        let g = SamplingParams {
            temperature: 0.0,
            ..p
        };
        assert_eq!(sample(&logits, &g, &mut r).0, 0);
    }
}
