//! Rotary position embedding, HF "rotate_half" convention: in a head vector `x [d]`
//! the pairs are `(i, i + d/2)` for `i < d/2`, rotated by `pos * inv_freq[i]`:
//! `out[i] = x[i] cos - x[i+d/2] sin`, `out[i+d/2] = x[i+d/2] cos + x[i] sin`.
//!
//! The table follows HF's f32 numerics step by step:
//! - `inv_freq = 1.0 / (theta ** (arange(0, d, 2).float() / d))` in f32: the
//!   exponent `2i / d` is an f32 division, `theta ** e` is `powf` evaluated in f64
//!   and rounded to f32 (correctly rounded; torch's vectorized `pow` is within an
//!   ulp of that), and the reciprocal is an f32 division.
//! - Llama 3 scaling ([`Llama3Scaling`]) is `_compute_llama3_parameters`, each
//!   operation rounded to f32 as torch does it; `a / tensor` is evaluated the way
//!   torch does, as `reciprocal(tensor) * a`.
//! - The angle `pos * inv_freq` is an f32 product (HF: an f32 matmul with K = 1).
//! - `cos`, `sin` of that f32 angle are stored in f64; `T::of_f64` then rounds
//!   them to the working precision (for f32, the correctly rounded f32 `cos`,
//!   where torch's f32 `cos` is within an ulp).
//!
//! The attention scaling factor of Llama 3 RoPE is 1, so none is applied.

use crate::Real;

/// HF `rope_scaling` of `rope_type = "llama3"` (Llama 3.1 and later).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

impl Llama3Scaling {
    /// `_compute_llama3_parameters` applied to one f32 inverse frequency.
    fn apply(&self, inv_freq: f32) -> f32 {
        let factor = self.factor as f32;
        let (low, high) = (self.low_freq_factor, self.high_freq_factor);
        let old_context_len = self.original_max_position_embeddings as f64;
        // Python floats, compared against f32 tensors as f32.
        let low_freq_wavelen = (old_context_len / low) as f32;
        let high_freq_wavelen = (old_context_len / high) as f32;
        let two_pi = (2.0 * std::f64::consts::PI) as f32;
        let wavelen = (1.0 / inv_freq) * two_pi;
        if wavelen > low_freq_wavelen {
            inv_freq / factor
        } else if wavelen < high_freq_wavelen {
            inv_freq
        } else {
            let smooth =
                ((1.0 / wavelen) * old_context_len as f32 - low as f32) / (high - low) as f32;
            (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
        }
    }
}

/// Cos and sin of every position and frequency.
#[derive(Clone, Debug)]
pub struct RopeTable {
    pub head_dim: usize,
    /// The f32 inverse frequencies `[head_dim / 2]`, scaling applied.
    pub inv_freq: Vec<f32>,
    /// `[max_positions, head_dim / 2]`
    pub cos: Vec<f64>,
    /// `[max_positions, head_dim / 2]`
    pub sin: Vec<f64>,
}

impl RopeTable {
    /// The table for positions `0..max_positions`; `head_dim` must be even.
    pub fn new(
        head_dim: usize,
        max_positions: usize,
        theta: f64,
        scaling: Option<Llama3Scaling>,
    ) -> RopeTable {
        assert!(
            head_dim >= 2 && head_dim.is_multiple_of(2),
            "rope: head_dim {head_dim} must be even and positive"
        );
        let half = head_dim / 2;
        let base = theta as f32;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| {
                let e = (2 * i) as f32 / head_dim as f32;
                let f = 1.0 / ((base as f64).powf(e as f64) as f32);
                scaling.map_or(f, |s| s.apply(f))
            })
            .collect();
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for pos in 0..max_positions {
            for &f in &inv_freq {
                let angle = (pos as f32 * f) as f64;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        RopeTable {
            head_dim,
            inv_freq,
            cos,
            sin,
        }
    }

    /// Positions `0..max_positions()` are in the table.
    pub fn max_positions(&self) -> usize {
        self.cos.len() / (self.head_dim / 2)
    }
}

/// Rotates `x [n, n_heads * head_dim]` in place: row `t` by `positions[t]`, with
/// `sign = 1` (forward) or `-1` (backward: the inverse rotation, as the rotation
/// is orthogonal).
fn rotate<T: Real>(x: &mut [T], positions: &[usize], n_heads: usize, table: &RopeTable, sign: T) {
    let (hd, half) = (table.head_dim, table.head_dim / 2);
    let width = n_heads * hd;
    assert_eq!(
        x.len(),
        positions.len() * width,
        "rope: x holds {} values for [{}, {n_heads} * {hd}]",
        x.len(),
        positions.len()
    );
    if width == 0 {
        return;
    }
    let max = table.max_positions();
    for (row, &pos) in x.chunks_exact_mut(width).zip(positions) {
        assert!(
            pos < max,
            "rope: position {pos} is beyond the table's {max} positions"
        );
        let cs = &table.cos[pos * half..(pos + 1) * half];
        let sn = &table.sin[pos * half..(pos + 1) * half];
        for head in row.chunks_exact_mut(hd) {
            let (a, b) = head.split_at_mut(half);
            for (((xa, xb), &c), &s) in a.iter_mut().zip(b.iter_mut()).zip(cs).zip(sn) {
                let (c, s) = (T::of_f64(c), sign * T::of_f64(s));
                let (u, v) = (*xa, *xb);
                *xa = u * c - v * s;
                *xb = v * c + u * s;
            }
        }
    }
}

/// Forward, in place: `x [positions.len(), n_heads * head_dim]`, row `t` rotated by
/// `positions[t]`. Panics if a position is `>= table.max_positions()`.
pub fn rope_forward<T: Real>(x: &mut [T], positions: &[usize], n_heads: usize, table: &RopeTable) {
    rotate(x, positions, n_heads, table, T::one());
}

/// Backward, in place: `dx [positions.len(), n_heads * head_dim]` holds dy on entry
/// and dx on return (the rotation by the negative angle).
pub fn rope_backward<T: Real>(
    dx: &mut [T],
    positions: &[usize],
    n_heads: usize,
    table: &RopeTable,
) {
    rotate(dx, positions, n_heads, table, -T::one());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::{check_grad, rand_vec};

    const LLAMA31: Llama3Scaling = Llama3Scaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };

    fn dot(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn backward_matches_finite_differences() {
        let table = RopeTable::new(6, 20, 10000.0, None);
        let positions = [0, 3, 19, 7];
        let n_heads = 3;
        let x = rand_vec(positions.len() * n_heads * 6, 1, 1.0);
        let dy = rand_vec(x.len(), 2, 1.0);
        let mut dx = dy.clone();
        rope_backward(&mut dx, &positions, n_heads, &table);
        check_grad("rope dx", &x, &dx, |x| {
            let mut y = x.to_vec();
            rope_forward(&mut y, &positions, n_heads, &table);
            dot(&y, &dy)
        });
    }

    #[test]
    fn forward_then_backward_is_identity() {
        let table = RopeTable::new(8, 64, 500000.0, Some(LLAMA31));
        let positions = [63, 1, 0, 40, 5];
        let x: Vec<f32> = rand_vec(positions.len() * 2 * 8, 3, 2.0)
            .iter()
            .map(|&v| v as f32)
            .collect();
        let mut y = x.clone();
        rope_forward(&mut y, &positions, 2, &table);
        assert_ne!(x, y);
        rope_backward(&mut y, &positions, 2, &table);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }

    #[test]
    fn scores_depend_only_on_relative_position() {
        let hd = 10;
        for scaling in [None, Some(LLAMA31)] {
            let table = RopeTable::new(hd, 100, 10000.0, scaling);
            let q = rand_vec(hd, 4, 1.0);
            let k = rand_vec(hd, 5, 1.0);
            let score = |p1: usize, p2: usize| {
                let (mut a, mut b) = (q.clone(), k.clone());
                rope_forward(&mut a, &[p1], 1, &table);
                rope_forward(&mut b, &[p2], 1, &table);
                dot(&a, &b)
            };
            let base = score(5, 2);
            // f32 angles: agreement to about f32 precision of the angle.
            for (p1, p2) in [(3, 0), (13, 10), (50, 47)] {
                let s = score(p1, p2);
                assert!(
                    (s - base).abs() < 1e-4,
                    "{scaling:?}: ({p1},{p2}) {s} vs {base}"
                );
            }
            assert!((score(6, 2) - base).abs() > 1e-3);
        }
    }

    #[test]
    fn inverse_frequencies() {
        let hd = 128;
        let plain = RopeTable::new(hd, 1, 500000.0, None);
        assert_eq!(plain.inv_freq[0], 1.0);
        for (i, &f) in plain.inv_freq.iter().enumerate() {
            let want = 1.0 / 500000f64.powf(2.0 * i as f64 / hd as f64);
            assert!(((f as f64) - want).abs() <= 2e-7 * want, "inv_freq[{i}]");
        }
        let scaled = RopeTable::new(hd, 1, 500000.0, Some(LLAMA31));
        let (mut low, mut mid, mut high) = (0, 0, 0);
        for (&f, &s) in plain.inv_freq.iter().zip(&scaled.inv_freq) {
            let wavelen = 2.0 * std::f64::consts::PI / f as f64;
            if wavelen < 2048.0 {
                assert_eq!(s, f);
                high += 1;
            } else if wavelen > 8192.0 {
                assert_eq!(s, f / 8.0);
                low += 1;
            } else {
                assert!(s < f && s > f / 8.0);
                mid += 1;
            }
        }
        assert!(low > 0 && mid > 0 && high > 0, "{low} {mid} {high}");
        // Position 0 is the identity; the table has the asked-for size.
        let t = RopeTable::new(4, 7, 10000.0, None);
        assert_eq!(t.max_positions(), 7);
        assert!(t.cos[..2].iter().all(|&c| c == 1.0) && t.sin[..2].iter().all(|&s| s == 0.0));
    }

    #[test]
    #[should_panic(expected = "position 7 is beyond the table's 7 positions")]
    fn position_beyond_table_panics() {
        let t = RopeTable::new(4, 7, 10000.0, None);
        let mut x = vec![0f32; 8];
        rope_forward(&mut x, &[0, 7], 1, &t);
    }
}
