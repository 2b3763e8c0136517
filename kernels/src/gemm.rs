//! Dense GEMMs on the CPU (matrixmultiply, f32 or f64 accumulation).
//!
//! Each output element is a dot product whose summation order depends only on K,
//! never on M or N, so a row's result does not depend on the other rows in the
//! batch (tested below): this is what lets rollout and training agree bitwise.

use crate::Real;

/// A read-only matrix view with general strides.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a, T> {
    pub data: &'a [T],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T: Real> MatRef<'a, T> {
    /// Row-major `[rows, cols]`.
    pub fn new(data: &'a [T], rows: usize, cols: usize) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "MatRef: {} values for [{rows}, {cols}]",
            data.len()
        );
        MatRef {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }
    /// The transpose view, without copying.
    pub fn t(self) -> Self {
        MatRef {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }
    /// Columns `c0..c1` of this view.
    pub fn cols_range(self, c0: usize, c1: usize) -> Self {
        assert!(c0 <= c1 && c1 <= self.cols);
        let off = if c1 > c0 { c0 * self.cs } else { 0 };
        MatRef {
            data: &self.data[off..],
            rows: self.rows,
            cols: c1 - c0,
            rs: self.rs,
            cs: self.cs,
        }
    }
    fn check(&self) {
        if self.rows > 0 && self.cols > 0 {
            let last = (self.rows - 1) * self.rs + (self.cols - 1) * self.cs;
            assert!(last < self.data.len(), "MatRef out of bounds");
        }
    }
}

/// `c[m,n] = alpha * a[m,k] b[k,n] + beta * c[m,n]`, c row-major.
pub fn gemm<T: Real>(alpha: T, a: MatRef<T>, b: MatRef<T>, beta: T, c: &mut [T]) {
    assert_eq!(
        a.cols, b.rows,
        "gemm: inner dimensions {} vs {}",
        a.cols, b.rows
    );
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(
        c.len(),
        m * n,
        "gemm: output holds {} values, want {m}x{n}",
        c.len()
    );
    a.check();
    b.check();
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        for v in c.iter_mut() {
            *v = if beta == T::zero() {
                T::zero()
            } else {
                *v * beta
            };
        }
        return;
    }
    // SAFETY: bounds checked above; c is an exclusive row-major [m, n] slice.
    unsafe {
        T::gemm_raw(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr(),
            b.rs as isize,
            b.cs as isize,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        )
    }
}

/// `y[m,n] = x[m,k] w[n,k]^T` (the forward of a linear layer).
pub fn matmul_nt<T: Real>(x: &[T], w: &[T], m: usize, k: usize, n: usize) -> Vec<T> {
    let mut y = vec![T::zero(); m * n];
    gemm(
        T::one(),
        MatRef::new(x, m, k),
        MatRef::new(w, n, k).t(),
        T::zero(),
        &mut y,
    );
    y
}

/// `y[m,n] = a[m,k] b[k,n]`.
pub fn matmul_nn<T: Real>(a: &[T], b: &[T], m: usize, k: usize, n: usize) -> Vec<T> {
    let mut y = vec![T::zero(); m * n];
    gemm(
        T::one(),
        MatRef::new(a, m, k),
        MatRef::new(b, k, n),
        T::zero(),
        &mut y,
    );
    y
}

/// `y[m,n] = a[k,m]^T b[k,n]`.
pub fn matmul_tn<T: Real>(a: &[T], b: &[T], m: usize, k: usize, n: usize) -> Vec<T> {
    let mut y = vec![T::zero(); m * n];
    gemm(
        T::one(),
        MatRef::new(a, k, m).t(),
        MatRef::new(b, k, n),
        T::zero(),
        &mut y,
    );
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn rnd(n: usize, seed: u64) -> Vec<f32> {
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect()
    }

    #[test]
    fn matches_naive_f64() {
        let (m, k, n) = (7, 300, 5);
        let x = rnd(m * k, 1);
        let w = rnd(n * k, 2);
        let y = matmul_nt(&x, &w, m, k, n);
        for i in 0..m {
            for j in 0..n {
                let r: f64 = (0..k)
                    .map(|t| x[i * k + t] as f64 * w[j * k + t] as f64)
                    .sum();
                assert!((y[i * n + j] as f64 - r).abs() < 1e-4, "({i},{j})");
            }
        }
        let a = rnd(k * m, 3);
        let b = rnd(k * n, 4);
        let y = matmul_tn(&a, &b, m, k, n);
        for i in 0..m {
            for j in 0..n {
                let r: f64 = (0..k)
                    .map(|t| a[t * m + i] as f64 * b[t * n + j] as f64)
                    .sum();
                assert!((y[i * n + j] as f64 - r).abs() < 1e-4);
            }
        }
    }

    /// The property the on-policy design stands on: a row's output is bitwise the
    /// same whatever else is in the batch.
    #[test]
    fn rows_are_independent_of_the_batch() {
        let (k, n) = (896, 200);
        let w = rnd(n * k, 5);
        for m in [1usize, 3, 8, 17, 64] {
            let x = rnd(m * k, 6 + m as u64);
            let y = matmul_nt(&x, &w, m, k, n);
            for i in 0..m {
                let yi = matmul_nt(&x[i * k..(i + 1) * k], &w, 1, k, n);
                assert_eq!(
                    y[i * n..(i + 1) * n]
                        .iter()
                        .map(|v| v.to_bits())
                        .collect::<Vec<_>>(),
                    yi.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "row {i} of a batch of {m}"
                );
            }
        }
    }
}
