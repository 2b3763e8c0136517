//! SwiGLU gating of the MLP: `h = silu(gate) * up`, `silu(x) = x * sigmoid(x)`.

use crate::Real;

/// `sigmoid(x) = 1 / (1 + exp(-x))`, evaluated so that `exp` never overflows.
fn sigmoid<T: Real>(x: T) -> T {
    if x >= T::zero() {
        T::one() / (T::one() + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::one() + e)
    }
}

/// Forward: `gate [n]`, `up [n]` -> `h [n]` (any shape, elementwise).
pub fn swiglu_forward<T: Real>(gate: &[T], up: &[T]) -> Vec<T> {
    assert_eq!(
        gate.len(),
        up.len(),
        "swiglu: gate holds {} values, up {}",
        gate.len(),
        up.len()
    );
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| g * sigmoid(g) * u)
        .collect()
}

/// Backward: from `dh [n]` and the forward's `gate [n]`, `up [n]` ->
/// `(dgate [n], dup [n])`.
///
/// `dgate = dh * up * s * (1 + g * (1 - s))`, `dup = dh * g * s`, `s = sigmoid(g)`.
pub fn swiglu_backward<T: Real>(dh: &[T], gate: &[T], up: &[T]) -> (Vec<T>, Vec<T>) {
    assert!(
        dh.len() == gate.len() && gate.len() == up.len(),
        "swiglu backward: dh, gate, up hold {}, {}, {} values",
        dh.len(),
        gate.len(),
        up.len()
    );
    let mut dgate = Vec::with_capacity(dh.len());
    let mut dup = Vec::with_capacity(dh.len());
    for ((&d, &g), &u) in dh.iter().zip(gate).zip(up) {
        let s = sigmoid(g);
        dgate.push(d * u * s * (T::one() + g * (T::one() - s)));
        dup.push(d * g * s);
    }
    (dgate, dup)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::{check_grad, rand_vec};

    #[test]
    fn backward_matches_finite_differences() {
        let n = 13;
        let gate = rand_vec(n, 1, 6.0);
        let up = rand_vec(n, 2, 2.0);
        let dh = rand_vec(n, 3, 1.0);
        let loss = |g: &[f64], u: &[f64]| -> f64 {
            swiglu_forward(g, u)
                .iter()
                .zip(&dh)
                .map(|(a, b)| a * b)
                .sum()
        };
        let (dg, du) = swiglu_backward(&dh, &gate, &up);
        check_grad("swiglu dgate", &gate, &dg, |g| loss(g, &up));
        check_grad("swiglu dup", &up, &du, |u| loss(&gate, u));
    }

    #[test]
    fn large_inputs_stay_finite() {
        let gate = [-1e4f32, -100.0, 100.0, 1e4];
        let up = [1f32; 4];
        let h = swiglu_forward(&gate, &up);
        assert_eq!(h[0], 0.0);
        assert!(h[1].abs() < 1e-30);
        assert_eq!(h[2], 100.0);
        assert_eq!(h[3], 1e4);
        let (dg, du) = swiglu_backward(&[1f32; 4], &gate, &up);
        assert!(dg.iter().chain(&du).all(|v| v.is_finite()));
    }
}
