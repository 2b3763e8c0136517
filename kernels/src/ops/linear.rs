//! Linear layer `y[M,N] = x[M,K] w[N,K]^T (+ b[N])` in a flow's precision, forward
//! and backward side by side.
//!
//! - F32: plain f32 GEMMs.
//! - BF16: operands rounded to BF16, f32 accumulation, output rounded to BF16.
//! - FP8: forward X 1x128 along K and W 128x128; DGrad dY 1x128 along N and the
//!   same W blocks transposed; WGrad dY and X both 128x1 along tokens. f32
//!   accumulation, output rounded to BF16.
//!
//! Gradients leave this op rounded to BF16 in the low-precision modes.

use crate::bf16;
use crate::fp8::{fp8_gemm, Fp8Matrix, Fp8Operand, Grouping};
use crate::gemm::{matmul_nn, matmul_nt, matmul_tn};
use crate::{Flow, GemmPrecision, GemmRole, Real};

/// A weight `[N, K]` prepared for one step: the copies the flow's GEMM roles read.
/// In the `fp8` flow the 128x128-block quantization is done once here and read by
/// rollout, training forward and DGrad alike.
#[derive(Clone, Debug)]
pub struct PreparedWeight<T> {
    pub n: usize,
    pub k: usize,
    f32: Option<Vec<T>>,
    bf16: Option<Vec<T>>,
    fp8: Option<Fp8Matrix>,
}

impl<T: Real> PreparedWeight<T> {
    /// Prepare `w [n, k]` for every GEMM role of `flow` that reads W.
    pub fn prepare(w: &[T], n: usize, k: usize, flow: Flow) -> Self {
        assert_eq!(
            w.len(),
            n * k,
            "weight holds {} values for [{n}, {k}]",
            w.len()
        );
        let mut p = PreparedWeight {
            n,
            k,
            f32: None,
            bf16: None,
            fp8: None,
        };
        for role in [
            GemmRole::RolloutForward,
            GemmRole::TrainForward,
            GemmRole::DGrad,
        ] {
            match flow.precision(role) {
                GemmPrecision::F32 if p.f32.is_none() => p.f32 = Some(w.to_vec()),
                GemmPrecision::Bf16 if p.bf16.is_none() => p.bf16 = Some(bf16::rounded(w)),
                GemmPrecision::Fp8 if p.fp8.is_none() => {
                    let wf: Vec<f32> = w.iter().map(|v| v.as_f32()).collect();
                    p.fp8 = Some(Fp8Matrix::quantize(&wf, n, k, Grouping::Block128));
                }
                _ => {}
            }
        }
        p
    }

    /// The FP8 copy, when the flow has one (shared by every FP8 role).
    pub fn fp8(&self) -> Option<&Fp8Matrix> {
        self.fp8.as_ref()
    }

    fn dense(&self, prec: GemmPrecision) -> &[T] {
        match prec {
            GemmPrecision::F32 => self.f32.as_deref(),
            GemmPrecision::Bf16 => self.bf16.as_deref(),
            GemmPrecision::Fp8 => None,
        }
        .unwrap_or_else(|| {
            panic!(
                "weight [{}, {}] was not prepared for {prec:?}",
                self.n, self.k
            )
        })
    }

    fn fp8_ref(&self) -> &Fp8Matrix {
        self.fp8
            .as_ref()
            .unwrap_or_else(|| panic!("weight [{}, {}] was not prepared for FP8", self.n, self.k))
    }
}

fn to_f32<T: Real>(x: &[T]) -> Vec<f32> {
    x.iter().map(|v| v.as_f32()).collect()
}

fn from_f32_bf16<T: Real>(y: Vec<f32>) -> Vec<T> {
    y.into_iter().map(|v| bf16::round(T::of_f32(v))).collect()
}

/// Forward: `x [m, k]` -> `y [m, n]`.
pub fn linear_forward<T: Real>(
    x: &[T],
    m: usize,
    w: &PreparedWeight<T>,
    bias: Option<&[T]>,
    prec: GemmPrecision,
) -> Vec<T> {
    let (n, k) = (w.n, w.k);
    assert_eq!(
        x.len(),
        m * k,
        "linear input holds {} values for [{m}, {k}]",
        x.len()
    );
    let mut y = match prec {
        GemmPrecision::F32 => matmul_nt(x, w.dense(prec), m, k, n),
        GemmPrecision::Bf16 => matmul_nt(&bf16::rounded(x), w.dense(prec), m, k, n),
        GemmPrecision::Fp8 => {
            let qx = Fp8Matrix::quantize(&to_f32(x), m, k, Grouping::Row1x128);
            fp8_gemm(Fp8Operand::plain(&qx), Fp8Operand::plain(w.fp8_ref()))
                .into_iter()
                .map(T::of_f32)
                .collect()
        }
    };
    if let Some(b) = bias {
        assert_eq!(b.len(), n);
        for row in y.chunks_mut(n) {
            for (v, &bb) in row.iter_mut().zip(b) {
                *v += bb;
            }
        }
    }
    if prec != GemmPrecision::F32 {
        bf16::round_slice(&mut y);
    }
    y
}

/// Gradients of a linear layer.
pub struct LinearGrads<T> {
    /// `[m, k]`
    pub dx: Vec<T>,
    /// `[n, k]`
    pub dw: Vec<T>,
    /// `[n]`, when the layer has a bias.
    pub db: Option<Vec<T>>,
}

/// Backward: from `dy [m, n]` and the forward input `x [m, k]`.
pub fn linear_backward<T: Real>(
    dy: &[T],
    x: &[T],
    m: usize,
    w: &PreparedWeight<T>,
    has_bias: bool,
    dgrad: GemmPrecision,
    wgrad: GemmPrecision,
) -> LinearGrads<T> {
    let (n, k) = (w.n, w.k);
    assert_eq!(dy.len(), m * n);
    assert_eq!(x.len(), m * k);
    // DGrad: dx[m,k] = dy[m,n] w[n,k]
    let dx = match dgrad {
        GemmPrecision::F32 => matmul_nn(dy, w.dense(dgrad), m, n, k),
        GemmPrecision::Bf16 => from_f32_bf16(to_f32(&matmul_nn(
            &bf16::rounded(dy),
            w.dense(dgrad),
            m,
            n,
            k,
        ))),
        GemmPrecision::Fp8 => {
            let qdy = Fp8Matrix::quantize(&to_f32(dy), m, n, Grouping::Row1x128);
            from_f32_bf16(fp8_gemm(
                Fp8Operand::plain(&qdy),
                Fp8Operand::t(w.fp8_ref()),
            ))
        }
    };
    // WGrad: dw[n,k] = dy[m,n]^T x[m,k]
    let dw = match wgrad {
        GemmPrecision::F32 => matmul_tn(dy, x, n, m, k),
        GemmPrecision::Bf16 => from_f32_bf16(to_f32(&matmul_tn(
            &bf16::rounded(dy),
            &bf16::rounded(x),
            n,
            m,
            k,
        ))),
        GemmPrecision::Fp8 => {
            let qdy = Fp8Matrix::quantize(&to_f32(dy), m, n, Grouping::Col128x1);
            let qx = Fp8Matrix::quantize(&to_f32(x), m, k, Grouping::Col128x1);
            from_f32_bf16(fp8_gemm(Fp8Operand::t(&qdy), Fp8Operand::t(&qx)))
        }
    };
    let db = has_bias.then(|| {
        let mut db = vec![T::zero(); n];
        for row in dy.chunks(n) {
            for (d, &g) in db.iter_mut().zip(row) {
                *d += g;
            }
        }
        if wgrad != GemmPrecision::F32 {
            bf16::round_slice(&mut db);
        }
        db
    });
    LinearGrads { dx, dw, db }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::{check_grad, rand_vec};

    #[test]
    fn backward_matches_finite_differences() {
        let (m, k, n) = (3, 5, 4);
        let x = rand_vec(m * k, 1, 1.0);
        let w = rand_vec(n * k, 2, 1.0);
        let b = rand_vec(n, 3, 1.0);
        let dy = rand_vec(m * n, 4, 1.0);
        let loss = |x: &[f64], w: &[f64], b: &[f64]| -> f64 {
            let pw = PreparedWeight::prepare(w, n, k, Flow::F32);
            let y = linear_forward(x, m, &pw, Some(b), GemmPrecision::F32);
            y.iter().zip(&dy).map(|(a, c)| a * c).sum()
        };
        let pw = PreparedWeight::prepare(&w, n, k, Flow::F32);
        let g = linear_backward(
            &dy,
            &x,
            m,
            &pw,
            true,
            GemmPrecision::F32,
            GemmPrecision::F32,
        );
        check_grad("linear dx", &x, &g.dx, |x| loss(x, &w, &b));
        check_grad("linear dw", &w, &g.dw, |w| loss(&x, w, &b));
        check_grad("linear db", &b, g.db.as_ref().unwrap(), |b| loss(&x, &w, b));
    }

    #[test]
    fn low_precision_paths_track_f32() {
        let (m, k, n) = (130, 896, 136);
        let x: Vec<f32> = rand_vec(m * k, 5, 1.0).iter().map(|&v| v as f32).collect();
        let w: Vec<f32> = rand_vec(n * k, 6, 0.05).iter().map(|&v| v as f32).collect();
        let dy: Vec<f32> = rand_vec(m * n, 7, 1.0).iter().map(|&v| v as f32).collect();
        let exact = PreparedWeight::prepare(&w, n, k, Flow::F32);
        let y0 = linear_forward(&x, m, &exact, None, GemmPrecision::F32);
        let g0 = linear_backward(
            &dy,
            &x,
            m,
            &exact,
            false,
            GemmPrecision::F32,
            GemmPrecision::F32,
        );
        let rel = |a: &[f32], b: &[f32]| {
            let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
            (num / den).sqrt()
        };
        for (flow, prec, tol) in [
            (Flow::Bf16, GemmPrecision::Bf16, 0.01),
            (Flow::Fp8, GemmPrecision::Fp8, 0.06),
        ] {
            let pw = PreparedWeight::prepare(&w, n, k, flow);
            let y = linear_forward(&x, m, &pw, None, prec);
            let g = linear_backward(&dy, &x, m, &pw, false, prec, prec);
            assert!(rel(&y, &y0) < tol, "{flow} forward: {}", rel(&y, &y0));
            assert!(
                rel(&g.dx, &g0.dx) < tol,
                "{flow} dgrad: {}",
                rel(&g.dx, &g0.dx)
            );
            assert!(
                rel(&g.dw, &g0.dw) < tol,
                "{flow} wgrad: {}",
                rel(&g.dw, &g0.dw)
            );
            // Outputs and gradients are BF16 values.
            for v in y.iter().chain(&g.dx).chain(&g.dw) {
                assert_eq!(*v, crate::bf16::round(*v));
            }
        }
    }

    #[test]
    fn fp8_rollout_and_training_forward_read_the_same_bytes() {
        let w: Vec<f32> = rand_vec(64 * 256, 8, 0.1)
            .iter()
            .map(|&v| v as f32)
            .collect();
        let pw = PreparedWeight::prepare(&w, 64, 256, Flow::Fp8);
        assert!(
            pw.f32.is_none() && pw.bf16.is_none(),
            "fp8 flow keeps only the FP8 copy"
        );
        let pw = PreparedWeight::prepare(&w, 64, 256, Flow::Bf16Fp8Rollout);
        assert!(pw.fp8.is_some() && pw.bf16.is_some());
    }
}
