//! FP8 E4M3 quantization, emulated bit-exactly, and the block-scaled FP8 GEMM.
//!
//! E4M3 (the "fn" variant: no infinities, one NaN pattern per sign): max finite 448,
//! conversion rounds to nearest even and we saturate to +-448 ourselves. A group's
//! scale is `amax / 448` (f32); an all-zero group gets scale 1.0 so that every
//! scale is a valid positive number. Values are encoded as `code(quotient(x, scale))`:
//! `x * RN(1/scale)` for the scales of every usual group (2^-88 ..= 2^125), the
//! division itself outside (see [`quotient`]).
//!
//! Groupings (shapes of a row-major `[rows, cols]` matrix, G = 128):
//! - [`Grouping::Row1x128`]: one scale per 1 x 128 run along the columns (K for
//!   activations `[tokens, K]` and for `dY [tokens, N]` in DGrad); scales `[rows][ceil(cols/G)]`.
//! - [`Grouping::Col128x1`]: one scale per 128 x 1 run along the rows (tokens, for
//!   both WGrad operands); scales `[ceil(rows/G)][cols]`.
//! - [`Grouping::Block128`]: one scale per 128 x 128 block (weights `[N, K]`);
//!   scales `[ceil(rows/G)][ceil(cols/G)]`. A block transposes exactly, so DGrad
//!   reads the forward's bytes.
//!
//! Edge groups (K = 896, 7 groups; rows not a multiple of 128) are just shorter.

use std::sync::OnceLock;

use float8::F8E4M3;

use crate::gemm::{gemm, MatRef};

/// Group length along the grouped dimension.
pub const GROUP: usize = 128;
/// Largest finite E4M3 value. (float8's `F8E4M3::MAX` says 416: not used.)
pub const E4M3_MAX: f32 = 448.0;

/// How scales are shared inside a quantized matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grouping {
    Row1x128,
    Col128x1,
    Block128,
}

/// Encode one (already scaled) value: saturate, then round to nearest even.
#[inline]
pub fn encode(x: f32) -> u8 {
    if x.is_nan() {
        return F8E4M3::from_f32(f32::NAN).to_bits();
    }
    F8E4M3::from_f32(x.clamp(-E4M3_MAX, E4M3_MAX)).to_bits()
}

/// Decode one E4M3 code (exact in f32).
#[inline]
pub fn decode(code: u8) -> f32 {
    decode_table()[code as usize]
}

fn decode_table() -> &'static [f32; 256] {
    static T: OnceLock<[f32; 256]> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = [0.0f32; 256];
        for (i, v) in t.iter_mut().enumerate() {
            *v = F8E4M3::from_bits(i as u8).to_f32();
        }
        t
    })
}

/// The scale of a group from its largest magnitude. NaN in, NaN out, so that a
/// poisoned activation stays visible instead of being quantized to zero.
#[inline]
pub fn scale_for(amax: f32) -> f32 {
    if amax.is_nan() {
        return f32::NAN;
    }
    let s = amax / E4M3_MAX;
    if s > 0.0 && s.is_finite() {
        s
    } else if s == 0.0 {
        1.0
    } else {
        f32::INFINITY
    }
}

/// The scaled value that [`encode`] rounds: `x * RN(1/s)` for s in [2^-88, 2^125],
/// else `x / s`. One multiplication a value, as FP8 quantizers usually do (the
/// reciprocal is made once a group); it differs from the correctly rounded `x / s`
/// by at most an ulp of f32, which moves an E4M3 code only where the quotient lies
/// within that ulp of a rounding midpoint. The range keeps the reciprocal normal
/// and finite; outside it (tiny, huge, infinite and NaN scales) the division keeps
/// zeros, infinities and NaN as they were. The GPU's quantizers (`common.cuh`:
/// `Quot`, `qdiv`) compute the same bits.
#[inline]
pub fn quotient(x: f32, s: f32) -> f32 {
    if (QUOT_MIN..=QUOT_MAX).contains(&s) {
        x * (1.0 / s)
    } else {
        x / s
    }
}

/// The scales whose values [`quotient`] multiplies by the reciprocal: 2^-88 ..= 2^125.
pub const QUOT_MIN: f32 = f32::from_bits((127 - 88) << 23);
pub const QUOT_MAX: f32 = f32::from_bits((127 + 125) << 23);

fn amax_of(it: impl Iterator<Item = f32>) -> f32 {
    let mut m = 0.0f32;
    for v in it {
        if v.is_nan() {
            return f32::NAN;
        }
        m = m.max(v.abs());
    }
    m
}

/// A quantized row-major `[rows, cols]` matrix.
#[derive(Clone, Debug)]
pub struct Fp8Matrix {
    pub rows: usize,
    pub cols: usize,
    pub grouping: Grouping,
    /// E4M3 codes, row-major `[rows, cols]`.
    pub codes: Vec<u8>,
    /// The decoded codes (exact), kept so GEMMs need not decode again.
    pub values: Vec<f32>,
    /// Scales in the layout documented on [`Grouping`].
    pub scales: Vec<f32>,
}

impl Fp8Matrix {
    /// Quantize `x [rows, cols]` with the given grouping.
    pub fn quantize(x: &[f32], rows: usize, cols: usize, grouping: Grouping) -> Fp8Matrix {
        assert_eq!(
            x.len(),
            rows * cols,
            "quantize: {} values for [{rows}, {cols}]",
            x.len()
        );
        let (sr, sc) = scale_shape(rows, cols, grouping);
        let mut scales = vec![0.0f32; sr * sc];
        for (i, s) in scales.iter_mut().enumerate() {
            let (a, b) = (i / sc, i % sc);
            let (r0, r1, c0, c1) = match grouping {
                Grouping::Row1x128 => (a, a + 1, b * GROUP, ((b + 1) * GROUP).min(cols)),
                Grouping::Col128x1 => (a * GROUP, ((a + 1) * GROUP).min(rows), b, b + 1),
                Grouping::Block128 => (
                    a * GROUP,
                    ((a + 1) * GROUP).min(rows),
                    b * GROUP,
                    ((b + 1) * GROUP).min(cols),
                ),
            };
            *s = scale_for(amax_of(
                (r0..r1).flat_map(|r| x[r * cols + c0..r * cols + c1].iter().copied()),
            ));
        }
        let mut m = Fp8Matrix {
            rows,
            cols,
            grouping,
            codes: vec![0; rows * cols],
            values: vec![0.0; rows * cols],
            scales,
        };
        for r in 0..rows {
            for c in 0..cols {
                let code = encode(quotient(x[r * cols + c], m.scale(r, c)));
                m.codes[r * cols + c] = code;
                m.values[r * cols + c] = decode(code);
            }
        }
        m
    }

    /// The scale that applies to element (r, c).
    #[inline]
    pub fn scale(&self, r: usize, c: usize) -> f32 {
        let (_, sc) = scale_shape(self.rows, self.cols, self.grouping);
        match self.grouping {
            Grouping::Row1x128 => self.scales[r * sc + c / GROUP],
            Grouping::Col128x1 => self.scales[(r / GROUP) * sc + c],
            Grouping::Block128 => self.scales[(r / GROUP) * sc + c / GROUP],
        }
    }

    /// `values * scales` as f32, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows * self.cols];
        for r in 0..self.rows {
            for c in 0..self.cols {
                out[r * self.cols + c] = self.values[r * self.cols + c] * self.scale(r, c);
            }
        }
        out
    }

    /// Whether the scales are constant along the 128-groups of the columns
    /// (contraction along columns) or of the rows.
    fn grouped_along(&self, along_cols: bool) -> bool {
        matches!(
            (self.grouping, along_cols),
            (Grouping::Row1x128, true) | (Grouping::Col128x1, false) | (Grouping::Block128, _)
        )
    }
}

/// Shape `[a, b]` of the scale array.
pub fn scale_shape(rows: usize, cols: usize, g: Grouping) -> (usize, usize) {
    match g {
        Grouping::Row1x128 => (rows, cols.div_ceil(GROUP)),
        Grouping::Col128x1 => (rows.div_ceil(GROUP), cols),
        Grouping::Block128 => (rows.div_ceil(GROUP), cols.div_ceil(GROUP)),
    }
}

/// One operand of [`fp8_gemm`]: a quantized matrix, used as stored (`[M, K]`,
/// contraction along its columns) or transposed (stored `[K, M]`).
#[derive(Clone, Copy)]
pub struct Fp8Operand<'a> {
    pub mat: &'a Fp8Matrix,
    pub transposed: bool,
}

impl<'a> Fp8Operand<'a> {
    pub fn plain(mat: &'a Fp8Matrix) -> Self {
        Fp8Operand {
            mat,
            transposed: false,
        }
    }
    pub fn t(mat: &'a Fp8Matrix) -> Self {
        Fp8Operand {
            mat,
            transposed: true,
        }
    }
    fn outer(&self) -> usize {
        if self.transposed {
            self.mat.cols
        } else {
            self.mat.rows
        }
    }
    fn inner(&self) -> usize {
        if self.transposed {
            self.mat.rows
        } else {
            self.mat.cols
        }
    }
    fn view(&self) -> MatRef<'a, f32> {
        let v = MatRef::new(&self.mat.values, self.mat.rows, self.mat.cols);
        if self.transposed {
            v.t()
        } else {
            v
        }
    }
    /// Scale for outer index i and contraction index k.
    fn scale(&self, i: usize, k: usize) -> f32 {
        if self.transposed {
            self.mat.scale(k, i)
        } else {
            self.mat.scale(i, k)
        }
    }
}

/// `y[M,N] = sum_g (sa[m,g] * sb[n,g]) * sum_{k in g} a[m,k] b[n,k]` with f32
/// accumulation: the FP8 GEMM's specification. Both operands are indexed
/// `[outer, K]`; their scales must be constant on each 128-run of K.
pub fn fp8_gemm(a: Fp8Operand, b: Fp8Operand) -> Vec<f32> {
    let (m, n, k) = (a.outer(), b.outer(), a.inner());
    assert_eq!(k, b.inner(), "fp8_gemm: contraction {k} vs {}", b.inner());
    assert!(
        a.mat.grouped_along(!a.transposed),
        "fp8_gemm: operand A is not grouped along K"
    );
    assert!(
        b.mat.grouped_along(!b.transposed),
        "fp8_gemm: operand B is not grouped along K"
    );
    let mut y = vec![0.0f32; m * n];
    let mut p = vec![0.0f32; m * n];
    let (av, bv) = (a.view(), b.view());
    for g in 0..k.div_ceil(GROUP) {
        let (k0, k1) = (g * GROUP, ((g + 1) * GROUP).min(k));
        // p[m,n] = a[:, k0..k1] b[:, k0..k1]^T: exact products, f32 sums.
        gemm(
            1.0,
            av.cols_range(k0, k1),
            bv.cols_range(k0, k1).t(),
            0.0,
            &mut p,
        );
        let sb: Vec<f32> = (0..n).map(|j| b.scale(j, k0)).collect();
        for i in 0..m {
            let sa = a.scale(i, k0);
            let (yr, pr) = (&mut y[i * n..(i + 1) * n], &p[i * n..(i + 1) * n]);
            for j in 0..n {
                yr[j] += (sa * sb[j]) * pr[j];
            }
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn rnd(n: usize, seed: u64, amp: f32) -> Vec<f32> {
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| r.random_range(-amp..amp)).collect()
    }

    #[test]
    fn codes_round_trip_and_max_is_448() {
        for c in 0..=255u8 {
            let v = decode(c);
            if v.is_nan() {
                continue;
            }
            assert_eq!(encode(v), c, "code {c:#04x} value {v}");
        }
        assert_eq!(decode(encode(448.0)), 448.0);
        assert_eq!(decode(encode(1e9)), 448.0, "saturates");
        assert_eq!(decode(encode(-1e9)), -448.0, "saturates");
        assert_eq!(decode(encode(f32::INFINITY)), 448.0);
        assert!(decode(encode(f32::NAN)).is_nan());
        let finite: Vec<f32> = (0..=255u8).map(decode).filter(|v| v.is_finite()).collect();
        assert_eq!(finite.iter().cloned().fold(0.0, f32::max), 448.0);
        assert_eq!(
            finite.len(),
            254,
            "E4M3fn has two NaN codes and no infinities"
        );
    }

    /// Every midpoint between neighbouring E4M3 values goes to the one with an
    /// even mantissa; points just off the midpoint go to the nearer one.
    #[test]
    fn rounds_to_nearest_even() {
        let mut pos: Vec<(u8, f32)> = (0..=0x7eu8).map(|c| (c, decode(c))).collect();
        pos.sort_by(|a, b| a.1.partial_cmp(&b.1).unwrap());
        for w in pos.windows(2) {
            let ((c0, v0), (c1, v1)) = (w[0], w[1]);
            let mid = (v0 + v1) / 2.0;
            let even = if c0 & 1 == 0 { c0 } else { c1 };
            assert_eq!(encode(mid), even, "midpoint of {v0} and {v1}");
            assert_eq!(
                encode(-mid),
                even | 0x80,
                "negative midpoint of {v0} and {v1}"
            );
            let below = f32::from_bits(mid.to_bits() - 1);
            let above = f32::from_bits(mid.to_bits() + 1);
            assert_eq!(encode(below), c0);
            assert_eq!(encode(above), c1);
        }
    }

    #[test]
    fn quotient_range_is_two_to_the_minus_88_to_125() {
        assert_eq!(QUOT_MIN, 2f32.powi(-88));
        assert_eq!(QUOT_MAX, 2f32.powi(125));
        // Inside: the product with the correctly rounded reciprocal, here an ulp
        // above the correctly rounded quotient (1/3 rounds, then the product).
        let (x, s) = (5.0f32, 3.0f32);
        assert_eq!(quotient(x, s), x * (1.0 / s));
        assert_eq!(quotient(x, s).to_bits(), (x / s).to_bits() + 1);
        // Outside: the division (a tiny scale's reciprocal would overflow).
        let tiny = 2f32.powi(-120);
        assert_eq!(quotient(0.0, tiny), 0.0);
        assert_eq!(quotient(tiny, tiny), 1.0);
        assert!(quotient(1.0, f32::NAN).is_nan());
        assert_eq!(quotient(-1.0, f32::INFINITY), -0.0);
    }

    #[test]
    fn scale_is_amax_over_448_and_zero_groups_are_valid() {
        let mut x = rnd(3 * 300, 1, 2.0);
        x[5] = -7.0; // row 0, group 0
        for v in &mut x[300 + 128..300 + 256] {
            *v = 0.0; // row 1, group 1 all zero
        }
        let q = Fp8Matrix::quantize(&x, 3, 300, Grouping::Row1x128);
        assert_eq!(q.scales.len(), 3 * 3);
        assert_eq!(q.scales[0], 7.0 / 448.0);
        assert_eq!(q.scales[3 + 1], 1.0);
        assert!(q.values[300 + 128..300 + 256].iter().all(|&v| v == 0.0));
        // The element at amax quantizes to +-448 exactly.
        assert_eq!(q.values[5], -448.0);
        for (i, &s) in q.scales.iter().enumerate() {
            let (r, g) = (i / 3, i % 3);
            let amax = x[r * 300 + g * 128..r * 300 + ((g + 1) * 128).min(300)]
                .iter()
                .fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(s, if amax == 0.0 { 1.0 } else { amax / 448.0 });
        }
    }

    #[test]
    fn relative_error_is_bounded_by_e4m3_precision() {
        // E4M3 has 3 mantissa bits: relative rounding error <= 2^-4 for normals.
        for g in [Grouping::Row1x128, Grouping::Col128x1, Grouping::Block128] {
            let (r, c) = (200, 896);
            let x = rnd(r * c, 7, 3.0);
            let q = Fp8Matrix::quantize(&x, r, c, g);
            let d = q.dequantize();
            for i in 0..x.len() {
                let s = q.scale(i / c, i % c);
                let err = (d[i] - x[i]).abs();
                // normal range: |x/s| >= 2^-6; below it the absolute step is 2^-9 * s.
                let bound = (x[i].abs() / 16.0).max(s * 2f32.powi(-10)) * 1.0001;
                assert!(err <= bound, "{g:?} at {i}: {} vs {}", d[i], x[i]);
            }
        }
    }

    #[test]
    fn edge_groups_and_layouts() {
        let (r, c) = (130, 896);
        let x = rnd(r * c, 9, 1.0);
        assert_eq!(
            Fp8Matrix::quantize(&x, r, c, Grouping::Row1x128)
                .scales
                .len(),
            130 * 7
        );
        assert_eq!(
            Fp8Matrix::quantize(&x, r, c, Grouping::Col128x1)
                .scales
                .len(),
            2 * 896
        );
        assert_eq!(
            Fp8Matrix::quantize(&x, r, c, Grouping::Block128)
                .scales
                .len(),
            2 * 7
        );
        // The last, 2-row block has its own scale from its own amax.
        let q = Fp8Matrix::quantize(&x, r, c, Grouping::Block128);
        let amax = x[128 * c..130 * c]
            .chunks(c)
            .flat_map(|row| &row[768..896])
            .fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(q.scale(129, 895), amax / 448.0);
    }

    #[test]
    fn nan_poisons_its_group_only() {
        let mut x = rnd(2 * 256, 3, 1.0);
        x[3] = f32::NAN;
        let q = Fp8Matrix::quantize(&x, 2, 256, Grouping::Row1x128);
        assert!(q.scales[0].is_nan());
        assert!(q.scales[1..].iter().all(|s| s.is_finite()));
    }

    #[test]
    fn gemm_matches_its_definition_and_dequantized_product() {
        let (m, k, n) = (5, 300, 140);
        let x = rnd(m * k, 11, 2.0);
        let w = rnd(n * k, 12, 0.1);
        let qx = Fp8Matrix::quantize(&x, m, k, Grouping::Row1x128);
        let qw = Fp8Matrix::quantize(&w, n, k, Grouping::Block128);
        let y = fp8_gemm(Fp8Operand::plain(&qx), Fp8Operand::plain(&qw));
        let (dx, dw) = (qx.dequantize(), qw.dequantize());
        for i in 0..m {
            for j in 0..n {
                let r: f64 = (0..k)
                    .map(|t| dx[i * k + t] as f64 * dw[j * k + t] as f64)
                    .sum();
                assert!(
                    (y[i * n + j] as f64 - r).abs() < 1e-4 * (1.0 + r.abs()),
                    "({i},{j})"
                );
            }
        }
        // DGrad form: y2[m,k] = dy[m,n] W[n,k] with W's forward blocks, transposed.
        let dy = rnd(m * n, 13, 1.0);
        let qdy = Fp8Matrix::quantize(&dy, m, n, Grouping::Row1x128);
        let y2 = fp8_gemm(Fp8Operand::plain(&qdy), Fp8Operand::t(&qw));
        let ddy = qdy.dequantize();
        for i in 0..m {
            for j in 0..k {
                let r: f64 = (0..n)
                    .map(|t| ddy[i * n + t] as f64 * dw[t * k + j] as f64)
                    .sum();
                assert!((y2[i * k + j] as f64 - r).abs() < 1e-4 * (1.0 + r.abs()));
            }
        }
        // WGrad form: dW[n,k] = dy[m,n]^T x[m,k], both grouped along tokens.
        let qdy_t = Fp8Matrix::quantize(&dy, m, n, Grouping::Col128x1);
        let qx_t = Fp8Matrix::quantize(&x, m, k, Grouping::Col128x1);
        let g = fp8_gemm(Fp8Operand::t(&qdy_t), Fp8Operand::t(&qx_t));
        let (a, b) = (qdy_t.dequantize(), qx_t.dequantize());
        for i in 0..n {
            for j in 0..k {
                let r: f64 = (0..m)
                    .map(|t| a[t * n + i] as f64 * b[t * k + j] as f64)
                    .sum();
                assert!((g[i * k + j] as f64 - r).abs() < 1e-4 * (1.0 + r.abs()));
            }
        }
    }

    #[test]
    fn fp8_gemm_rows_are_independent_of_the_batch() {
        let (m, k, n) = (9, 896, 64);
        let x = rnd(m * k, 21, 1.0);
        let w = rnd(n * k, 22, 1.0);
        let qw = Fp8Matrix::quantize(&w, n, k, Grouping::Block128);
        let qx = Fp8Matrix::quantize(&x, m, k, Grouping::Row1x128);
        let y = fp8_gemm(Fp8Operand::plain(&qx), Fp8Operand::plain(&qw));
        for i in 0..m {
            let qi = Fp8Matrix::quantize(&x[i * k..(i + 1) * k], 1, k, Grouping::Row1x128);
            let yi = fp8_gemm(Fp8Operand::plain(&qi), Fp8Operand::plain(&qw));
            for j in 0..n {
                assert_eq!(y[i * n + j].to_bits(), yi[j].to_bits());
            }
        }
    }
}
