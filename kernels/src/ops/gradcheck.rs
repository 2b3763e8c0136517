//! Test support: f64 finite-difference checks of analytic gradients.

use rand::{Rng, SeedableRng};

/// Uniform values in `[-amp, amp)` from a seeded RNG.
pub fn rand_vec(n: usize, seed: u64, amp: f64) -> Vec<f64> {
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| r.random_range(-amp..amp)).collect()
}

/// Compare `grad` (d loss / d x) with central differences of `loss` around `x`,
/// in f64. Fails with the name, the index and both values.
pub fn check_grad(name: &str, x: &[f64], grad: &[f64], loss: impl Fn(&[f64]) -> f64) {
    assert_eq!(
        x.len(),
        grad.len(),
        "{name}: gradient has {} values for {} inputs",
        grad.len(),
        x.len()
    );
    let h = 1e-6;
    let mut xp = x.to_vec();
    for i in 0..x.len() {
        xp[i] = x[i] + h;
        let lp = loss(&xp);
        xp[i] = x[i] - h;
        let lm = loss(&xp);
        xp[i] = x[i];
        let fd = (lp - lm) / (2.0 * h);
        let tol = 1e-6 + 1e-5 * fd.abs().max(grad[i].abs());
        assert!(
            (fd - grad[i]).abs() <= tol,
            "{name}[{i}]: analytic {} vs finite difference {fd}",
            grad[i]
        );
    }
}
