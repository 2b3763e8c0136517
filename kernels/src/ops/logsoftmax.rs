//! Log-softmax over logits `[rows, vocab]`: the log-probability of a target token,
//! the entropy of the distribution and the log-sum-exp, per row.
//!
//! Every row is shifted by its max first. With `S = sum_j exp(z_j - m)`:
//! `log p_j = (z_j - m) - ln S`, `lse = m + ln S`, and the entropy
//! `lse - sum_j p_j z_j` is evaluated as `ln S - sum_j p_j (z_j - m)` (the same
//! quantity, since `sum_j p_j = 1`, without cancelling two large numbers).

use crate::Real;

/// Per-row results of [`token_logprobs_forward`], each `[rows]`.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs<T> {
    /// `log p(target)`.
    pub logp: Vec<T>,
    /// `-sum_j p_j log p_j`.
    pub entropy: Vec<T>,
    /// `log sum_j exp(z_j)`.
    pub lse: Vec<T>,
}

/// Max and `ln S` of one row (`S = sum_j exp(z_j - max)`); the shared first pass of
/// every function here, so that their log-probabilities agree bitwise.
fn row_shift<T: Real>(z: &[T]) -> (T, T) {
    let m = z.iter().fold(T::neg_infinity(), |a, &b| a.max(b));
    let s: T = z.iter().map(|&v| (v - m).exp()).sum();
    (m, s.ln())
}

/// Log-probabilities `[vocab]` of one row of logits `[vocab]` (for sampling).
/// The entry of a token equals `token_logprobs_forward`'s `logp` for it bitwise.
pub fn log_softmax_row<T: Real>(logits: &[T]) -> Vec<T> {
    let (m, ln_s) = row_shift(logits);
    logits.iter().map(|&v| (v - m) - ln_s).collect()
}

fn check_shapes(what: &str, logits: usize, rows: usize, vocab: usize, targets: &[u32]) {
    assert_eq!(
        logits,
        rows * vocab,
        "{what}: logits hold {logits} values for [{rows}, {vocab}]"
    );
    assert_eq!(
        targets.len(),
        rows,
        "{what}: {} targets for {rows} rows",
        targets.len()
    );
    assert!(vocab > 0, "{what}: vocab is 0");
    if let Some((r, &t)) = targets
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab)
    {
        panic!("{what}: target {t} of row {r} is outside the vocabulary of {vocab}");
    }
}

/// Forward: `logits [rows, vocab]`, `targets [rows]` -> logp, entropy, lse, each `[rows]`.
pub fn token_logprobs_forward<T: Real>(
    logits: &[T],
    rows: usize,
    vocab: usize,
    targets: &[u32],
) -> TokenLogprobs<T> {
    check_shapes("token_logprobs", logits.len(), rows, vocab, targets);
    let mut out = TokenLogprobs {
        logp: Vec::with_capacity(rows),
        entropy: Vec::with_capacity(rows),
        lse: Vec::with_capacity(rows),
    };
    for (z, &t) in logits.chunks_exact(vocab).zip(targets) {
        let (m, ln_s) = row_shift(z);
        // sum_j p_j (z_j - m), p_j = exp((z_j - m) - ln S)
        let pz: T = z
            .iter()
            .map(|&v| {
                let zs = v - m;
                (zs - ln_s).exp() * zs
            })
            .sum();
        out.logp.push((z[t as usize] - m) - ln_s);
        out.entropy.push(ln_s - pz);
        out.lse.push(m + ln_s);
    }
    out
}

/// Backward: `dlogits [rows, vocab]` for upstream gradients `dlogp [rows]` and,
/// optionally, `dentropy [rows]`, from the forward's `fwd`.
///
/// With `p_j = exp(z_j - lse)`: `d logp / d z_j = [j = target] - p_j` and
/// `d H / d z_j = -p_j (log p_j + H)`.
pub fn token_logprobs_backward<T: Real>(
    logits: &[T],
    rows: usize,
    vocab: usize,
    targets: &[u32],
    fwd: &TokenLogprobs<T>,
    dlogp: &[T],
    dentropy: Option<&[T]>,
) -> Vec<T> {
    check_shapes(
        "token_logprobs backward",
        logits.len(),
        rows,
        vocab,
        targets,
    );
    assert!(
        fwd.lse.len() == rows && fwd.entropy.len() == rows,
        "token_logprobs backward: forward results are for {} rows, not {rows}",
        fwd.lse.len()
    );
    assert_eq!(
        dlogp.len(),
        rows,
        "token_logprobs backward: dlogp holds {}",
        dlogp.len()
    );
    if let Some(de) = dentropy {
        assert_eq!(
            de.len(),
            rows,
            "token_logprobs backward: dentropy holds {}",
            de.len()
        );
    }
    let mut dz = vec![T::zero(); rows * vocab];
    for (r, (z, dzr)) in logits
        .chunks_exact(vocab)
        .zip(dz.chunks_exact_mut(vocab))
        .enumerate()
    {
        let (lse, h, gl) = (fwd.lse[r], fwd.entropy[r], dlogp[r]);
        let ge = dentropy.map_or(T::zero(), |de| de[r]);
        for (d, &v) in dzr.iter_mut().zip(z) {
            let logp = v - lse;
            let p = logp.exp();
            *d = -gl * p - ge * p * (logp + h);
        }
        dzr[targets[r] as usize] += gl;
    }
    dz
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::{check_grad, rand_vec};

    #[test]
    fn forward_matches_direct_formulas() {
        let (rows, vocab) = (3, 11);
        let z = rand_vec(rows * vocab, 1, 4.0);
        let targets = [4u32, 0, 10];
        let f = token_logprobs_forward(&z, rows, vocab, &targets);
        for r in 0..rows {
            let zr = &z[r * vocab..(r + 1) * vocab];
            let lse = zr.iter().map(|v| v.exp()).sum::<f64>().ln();
            let h: f64 = -zr.iter().map(|v| (v - lse).exp() * (v - lse)).sum::<f64>();
            assert!((f.lse[r] - lse).abs() < 1e-12);
            assert!((f.logp[r] - (zr[targets[r] as usize] - lse)).abs() < 1e-12);
            assert!((f.entropy[r] - h).abs() < 1e-12);
        }
    }

    #[test]
    fn large_logits_are_stable() {
        let z = [1000f32, 999.0, -1000.0];
        let f = token_logprobs_forward(&z, 1, 3, &[1]);
        let want = -(1.0f64 + (-1.0f64).exp()).ln() - 1.0;
        assert!((f.logp[0] as f64 - want).abs() < 1e-6);
        assert!(f.entropy[0].is_finite() && f.entropy[0] > 0.0);
    }

    #[test]
    fn backward_matches_finite_differences() {
        let (rows, vocab) = (3, 7);
        let z = rand_vec(rows * vocab, 2, 3.0);
        let targets = [6u32, 0, 3];
        let dlogp = rand_vec(rows, 3, 1.0);
        let dent = rand_vec(rows, 4, 1.0);
        let fwd = token_logprobs_forward(&z, rows, vocab, &targets);

        let lp_loss = |z: &[f64]| -> f64 {
            let f = token_logprobs_forward(z, rows, vocab, &targets);
            f.logp.iter().zip(&dlogp).map(|(a, b)| a * b).sum()
        };
        let g = token_logprobs_backward(&z, rows, vocab, &targets, &fwd, &dlogp, None);
        check_grad("logsoftmax dlogits (logp)", &z, &g, lp_loss);

        let zero = vec![0.0; rows];
        let ent_loss = |z: &[f64]| -> f64 {
            let f = token_logprobs_forward(z, rows, vocab, &targets);
            f.entropy.iter().zip(&dent).map(|(a, b)| a * b).sum()
        };
        let g = token_logprobs_backward(&z, rows, vocab, &targets, &fwd, &zero, Some(&dent));
        check_grad("logsoftmax dlogits (entropy)", &z, &g, ent_loss);

        let g = token_logprobs_backward(&z, rows, vocab, &targets, &fwd, &dlogp, Some(&dent));
        check_grad("logsoftmax dlogits (both)", &z, &g, |z| {
            lp_loss(z) + ent_loss(z)
        });
    }

    #[test]
    fn log_softmax_row_agrees_bitwise_with_token_logprobs() {
        let (rows, vocab) = (4, 33);
        let z: Vec<f32> = rand_vec(rows * vocab, 5, 8.0)
            .iter()
            .map(|&v| v as f32)
            .collect();
        for t in 0..vocab as u32 {
            let targets = vec![t; rows];
            let f = token_logprobs_forward(&z, rows, vocab, &targets);
            for r in 0..rows {
                let full = log_softmax_row(&z[r * vocab..(r + 1) * vocab]);
                assert_eq!(
                    full[t as usize].to_bits(),
                    f.logp[r].to_bits(),
                    "row {r} token {t}"
                );
            }
        }
    }
}
