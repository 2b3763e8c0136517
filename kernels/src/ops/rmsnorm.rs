//! RMSNorm as in HF Llama/Qwen, per row: `y = w * (x * rstd)` with
//! `rstd = 1 / sqrt(mean(x^2) + eps)`. The product `x * rstd` is rounded before
//! the weight multiplies it, in HF's order.
//!
//! Also Qwen3's per-head q/k norm, with `rows = tokens * heads`, `dim = head_dim`.

use crate::Real;

/// Forward: `x [rows, dim]`, `w [dim]` -> `(y [rows, dim], rstd [rows])`.
pub fn rmsnorm_forward<T: Real>(
    x: &[T],
    w: &[T],
    rows: usize,
    dim: usize,
    eps: f64,
) -> (Vec<T>, Vec<T>) {
    assert_eq!(
        x.len(),
        rows * dim,
        "rmsnorm: x holds {} values for [{rows}, {dim}]",
        x.len()
    );
    assert_eq!(
        w.len(),
        dim,
        "rmsnorm: w holds {} values for [{dim}]",
        w.len()
    );
    let mut y = vec![T::zero(); rows * dim];
    let mut rstd = vec![T::zero(); rows];
    if dim == 0 {
        return (y, rstd);
    }
    let (n, eps) = (T::of_f64(dim as f64), T::of_f64(eps));
    for ((xr, yr), rs) in x
        .chunks_exact(dim)
        .zip(y.chunks_exact_mut(dim))
        .zip(&mut rstd)
    {
        let ms = xr.iter().map(|&v| v * v).sum::<T>() / n;
        let r = T::one() / (ms + eps).sqrt();
        *rs = r;
        for ((yv, &xv), &wv) in yr.iter_mut().zip(xr).zip(w) {
            *yv = wv * (xv * r);
        }
    }
    (y, rstd)
}

/// Backward: from `dy [rows, dim]` and the forward's `x [rows, dim]`, `w [dim]`,
/// `rstd [rows]` -> `(dx [rows, dim], dw [dim])`.
///
/// With `xh = x * rstd`: `dw = sum_rows dy * xh`,
/// `dx = rstd * (dy*w - xh * mean(dy*w * xh))`.
pub fn rmsnorm_backward<T: Real>(
    dy: &[T],
    x: &[T],
    w: &[T],
    rstd: &[T],
    rows: usize,
    dim: usize,
) -> (Vec<T>, Vec<T>) {
    assert_eq!(
        dy.len(),
        rows * dim,
        "rmsnorm backward: dy holds {} values for [{rows}, {dim}]",
        dy.len()
    );
    assert_eq!(
        x.len(),
        rows * dim,
        "rmsnorm backward: x holds {} values for [{rows}, {dim}]",
        x.len()
    );
    assert_eq!(w.len(), dim, "rmsnorm backward: w holds {} values", w.len());
    assert_eq!(
        rstd.len(),
        rows,
        "rmsnorm backward: rstd holds {} values",
        rstd.len()
    );
    let mut dx = vec![T::zero(); rows * dim];
    let mut dw = vec![T::zero(); dim];
    if dim == 0 {
        return (dx, dw);
    }
    let n = T::of_f64(dim as f64);
    for (((dyr, xr), dxr), &r) in dy
        .chunks_exact(dim)
        .zip(x.chunks_exact(dim))
        .zip(dx.chunks_exact_mut(dim))
        .zip(rstd)
    {
        // mean over the row of (dy * w) * xh
        let mut dot = T::zero();
        for (((&g, &xv), &wv), dwv) in dyr.iter().zip(xr).zip(w).zip(dw.iter_mut()) {
            let xh = xv * r;
            *dwv += g * xh;
            dot += g * wv * xh;
        }
        let mean = dot / n;
        for (((d, &g), &xv), &wv) in dxr.iter_mut().zip(dyr).zip(xr).zip(w) {
            *d = r * (g * wv - xv * r * mean);
        }
    }
    (dx, dw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::{check_grad, rand_vec};

    fn check(rows: usize, dim: usize, seed: u64) {
        let eps = 1e-6;
        let x = rand_vec(rows * dim, seed, 1.5);
        let w = rand_vec(dim, seed + 1, 1.0);
        let dy = rand_vec(rows * dim, seed + 2, 1.0);
        let loss = |x: &[f64], w: &[f64]| -> f64 {
            let (y, _) = rmsnorm_forward(x, w, rows, dim, eps);
            y.iter().zip(&dy).map(|(a, b)| a * b).sum()
        };
        let (_, rstd) = rmsnorm_forward(&x, &w, rows, dim, eps);
        let (dx, dw) = rmsnorm_backward(&dy, &x, &w, &rstd, rows, dim);
        check_grad("rmsnorm dx", &x, &dx, |x| loss(x, &w));
        check_grad("rmsnorm dw", &w, &dw, |w| loss(&x, w));
    }

    #[test]
    fn backward_matches_finite_differences() {
        check(3, 7, 10);
        check(1, 1, 20);
    }

    #[test]
    fn per_head_qk_norm_shape() {
        // Qwen3 q/k norm: rows = tokens * heads, dim = head_dim.
        let (tokens, heads, head_dim) = (3, 4, 5);
        check(tokens * heads, head_dim, 30);
    }

    #[test]
    fn forward_normalizes_rows() {
        let (rows, dim) = (2, 9);
        let x: Vec<f32> = rand_vec(rows * dim, 40, 3.0)
            .iter()
            .map(|&v| v as f32)
            .collect();
        let w = vec![1f32; dim];
        let (y, rstd) = rmsnorm_forward(&x, &w, rows, dim, 0.0);
        for (r, yr) in y.chunks(dim).enumerate() {
            let ms: f32 = yr.iter().map(|v| v * v).sum::<f32>() / dim as f32;
            assert!((ms - 1.0).abs() < 1e-5, "row {r}: mean square {ms}");
            let xr = &x[r * dim..(r + 1) * dim];
            let want = 1.0 / (xr.iter().map(|v| v * v).sum::<f32>() / dim as f32).sqrt();
            assert!((rstd[r] - want).abs() <= 1e-6 * want);
        }
    }
}
