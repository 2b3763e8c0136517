//! Grouped-query causal self-attention of one sequence. Query head `h` reads kv
//! head `h / (n_heads / n_kv_heads)`; scores are scaled by `1/sqrt(head_dim)`; the
//! softmax runs in `T` with the max subtracted.
//!
//! [`attend_row`] is the whole computation of one query row, and both the
//! training forward and the decode step against a KV cache call it, so that they
//! agree bitwise.

use crate::Real;

/// Head counts and size.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl AttnShape {
    /// Query heads per kv head.
    fn group(&self) -> usize {
        assert!(
            self.n_kv_heads > 0 && self.n_heads.is_multiple_of(self.n_kv_heads),
            "attention: {} query heads do not group over {} kv heads",
            self.n_heads,
            self.n_kv_heads
        );
        self.n_heads / self.n_kv_heads
    }
    fn q_width(&self) -> usize {
        self.n_heads * self.head_dim
    }
    fn kv_width(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    fn scale<T: Real>(&self) -> T {
        T::of_f64(1.0 / (self.head_dim as f64).sqrt())
    }
}

fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let mut s = T::zero();
    for (&x, &y) in a.iter().zip(b) {
        s += x * y;
    }
    s
}

/// One query row `q [n_heads * head_dim]` attending to rows `0..len` of
/// `k`, `v` (each `[>= len, n_kv_heads * head_dim]`; only the first `len` rows are
/// read). Writes `out [n_heads * head_dim]` and, if given, the softmax
/// probabilities `probs [n_heads, len]`.
pub fn attend_row<T: Real>(
    q: &[T],
    k: &[T],
    v: &[T],
    len: usize,
    shape: AttnShape,
    out: &mut [T],
    mut probs: Option<&mut [T]>,
) {
    let (hd, group) = (shape.head_dim, shape.group());
    let (qw, kvw) = (shape.q_width(), shape.kv_width());
    assert_eq!(
        q.len(),
        qw,
        "attend_row: q holds {} values for [{qw}]",
        q.len()
    );
    assert_eq!(
        out.len(),
        qw,
        "attend_row: out holds {} values for [{qw}]",
        out.len()
    );
    assert!(
        k.len() >= len * kvw && v.len() >= len * kvw,
        "attend_row: k, v hold {}, {} values, fewer than [{len}, {kvw}]",
        k.len(),
        v.len()
    );
    if let Some(p) = probs.as_deref() {
        assert_eq!(
            p.len(),
            shape.n_heads * len,
            "attend_row: probs hold {} values for [{}, {len}]",
            p.len(),
            shape.n_heads
        );
    }
    let scale = shape.scale::<T>();
    let mut s = vec![T::zero(); len];
    for h in 0..shape.n_heads {
        let qh = &q[h * hd..(h + 1) * hd];
        let off = (h / group) * hd;
        // s[j] = q_h . k_j * scale
        for (j, sj) in s.iter_mut().enumerate() {
            *sj = dot(qh, &k[j * kvw + off..j * kvw + off + hd]) * scale;
        }
        // softmax over j, max subtracted
        let m = s.iter().fold(T::neg_infinity(), |a, &b| a.max(b));
        let mut sum = T::zero();
        for sj in s.iter_mut() {
            *sj = (*sj - m).exp();
            sum += *sj;
        }
        for sj in s.iter_mut() {
            *sj /= sum;
        }
        // out_h = sum_j p_j v_j
        let oh = &mut out[h * hd..(h + 1) * hd];
        oh.fill(T::zero());
        for (j, &p) in s.iter().enumerate() {
            for (o, &vv) in oh.iter_mut().zip(&v[j * kvw + off..j * kvw + off + hd]) {
                *o += p * vv;
            }
        }
        if let Some(pr) = probs.as_deref_mut() {
            pr[h * len..(h + 1) * len].copy_from_slice(&s);
        }
    }
}

/// Forward: `q [seq, n_heads * hd]`, `k`, `v [seq, n_kv_heads * hd]` ->
/// `(out [seq, n_heads * hd], probs [seq, n_heads, seq])`, probs zero above the
/// diagonal. Row `t` is `attend_row` with `len = t + 1`.
pub fn attention_forward<T: Real>(
    q: &[T],
    k: &[T],
    v: &[T],
    seq: usize,
    shape: AttnShape,
) -> (Vec<T>, Vec<T>) {
    let (qw, kvw, nh) = (shape.q_width(), shape.kv_width(), shape.n_heads);
    assert_eq!(
        q.len(),
        seq * qw,
        "attention: q holds {} values for [{seq}, {qw}]",
        q.len()
    );
    assert_eq!(
        k.len(),
        seq * kvw,
        "attention: k holds {} values for [{seq}, {kvw}]",
        k.len()
    );
    assert_eq!(
        v.len(),
        seq * kvw,
        "attention: v holds {} values for [{seq}, {kvw}]",
        v.len()
    );
    let mut out = vec![T::zero(); seq * qw];
    let mut probs = vec![T::zero(); seq * nh * seq];
    let mut row_p = vec![T::zero(); nh * seq];
    for t in 0..seq {
        let len = t + 1;
        let rp = &mut row_p[..nh * len];
        attend_row(
            &q[t * qw..(t + 1) * qw],
            k,
            v,
            len,
            shape,
            &mut out[t * qw..(t + 1) * qw],
            Some(rp),
        );
        for h in 0..nh {
            let dst = (t * nh + h) * seq;
            probs[dst..dst + len].copy_from_slice(&rp[h * len..(h + 1) * len]);
        }
    }
    (out, probs)
}

/// Backward: from `dout [seq, n_heads * hd]` and the forward's `q`, `k`, `v` and
/// `probs [seq, n_heads, seq]` -> `(dq [seq, n_heads * hd], dk, dv [seq, n_kv_heads * hd])`.
///
/// Per row `t`, head `h`, key `j <= t`: `dp_j = dout_h . v_j`, `dv_j += p_j dout_h`,
/// `ds_j = p_j (dp_j - sum_i p_i dp_i)`, `dq_h += scale ds_j k_j`,
/// `dk_j += scale ds_j q_h`.
pub fn attention_backward<T: Real>(
    dout: &[T],
    q: &[T],
    k: &[T],
    v: &[T],
    probs: &[T],
    seq: usize,
    shape: AttnShape,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let (hd, group) = (shape.head_dim, shape.group());
    let (qw, kvw, nh) = (shape.q_width(), shape.kv_width(), shape.n_heads);
    assert_eq!(
        dout.len(),
        seq * qw,
        "attention backward: dout holds {} values",
        dout.len()
    );
    assert_eq!(
        q.len(),
        seq * qw,
        "attention backward: q holds {} values",
        q.len()
    );
    assert_eq!(
        k.len(),
        seq * kvw,
        "attention backward: k holds {} values",
        k.len()
    );
    assert_eq!(
        v.len(),
        seq * kvw,
        "attention backward: v holds {} values",
        v.len()
    );
    assert_eq!(
        probs.len(),
        seq * nh * seq,
        "attention backward: probs hold {}",
        probs.len()
    );
    let scale = shape.scale::<T>();
    let mut dq = vec![T::zero(); seq * qw];
    let mut dk = vec![T::zero(); seq * kvw];
    let mut dv = vec![T::zero(); seq * kvw];
    let mut ds = vec![T::zero(); seq];
    for t in 0..seq {
        for h in 0..nh {
            let qo = t * qw + h * hd;
            let off = (h / group) * hd;
            let p = &probs[(t * nh + h) * seq..(t * nh + h) * seq + t + 1];
            let g = &dout[qo..qo + hd];
            // dp_j, and the softmax backward
            let mut pdp = T::zero();
            for (j, (d, &pj)) in ds.iter_mut().zip(p).enumerate() {
                let dp = dot(g, &v[j * kvw + off..j * kvw + off + hd]);
                *d = dp;
                pdp += pj * dp;
            }
            for (j, (d, &pj)) in ds.iter_mut().zip(p).enumerate() {
                *d = pj * (*d - pdp) * scale;
                let kv = j * kvw + off;
                for (dvv, &gv) in dv[kv..kv + hd].iter_mut().zip(g) {
                    *dvv += pj * gv;
                }
                for ((dqv, dkv), (&kv_, &qv)) in dq[qo..qo + hd]
                    .iter_mut()
                    .zip(dk[kv..kv + hd].iter_mut())
                    .zip(k[kv..kv + hd].iter().zip(&q[qo..qo + hd]))
                {
                    *dqv += *d * kv_;
                    *dkv += *d * qv;
                }
            }
        }
    }
    (dq, dk, dv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::{check_grad, rand_vec};

    fn f32s(n: usize, seed: u64) -> Vec<f32> {
        rand_vec(n, seed, 1.5).iter().map(|&v| v as f32).collect()
    }

    fn check(shape: AttnShape, seq: usize, seed: u64) {
        let (qw, kvw) = (shape.q_width(), shape.kv_width());
        let q = rand_vec(seq * qw, seed, 1.5);
        let k = rand_vec(seq * kvw, seed + 1, 1.5);
        let v = rand_vec(seq * kvw, seed + 2, 1.5);
        let dout = rand_vec(seq * qw, seed + 3, 1.0);
        let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
            let (o, _) = attention_forward(q, k, v, seq, shape);
            o.iter().zip(&dout).map(|(a, b)| a * b).sum()
        };
        let (_, probs) = attention_forward(&q, &k, &v, seq, shape);
        let (dq, dk, dv) = attention_backward(&dout, &q, &k, &v, &probs, seq, shape);
        check_grad("attention dq", &q, &dq, |q| loss(q, &k, &v));
        check_grad("attention dk", &k, &dk, |k| loss(&q, k, &v));
        check_grad("attention dv", &v, &dv, |v| loss(&q, &k, v));
    }

    #[test]
    fn backward_matches_finite_differences_gqa() {
        let shape = AttnShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 3,
        };
        check(shape, 5, 1);
    }

    #[test]
    fn backward_matches_finite_differences_mha() {
        let shape = AttnShape {
            n_heads: 3,
            n_kv_heads: 3,
            head_dim: 5,
        };
        check(shape, 4, 10);
        check(
            AttnShape {
                n_heads: 1,
                n_kv_heads: 1,
                head_dim: 1,
            },
            1,
            20,
        );
    }

    #[test]
    fn probs_are_causal_rows_summing_to_one() {
        let shape = AttnShape {
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: 6,
        };
        let seq = 7;
        let q = f32s(seq * 24, 30);
        let k = f32s(seq * 6, 31);
        let v = f32s(seq * 6, 32);
        let (_, probs) = attention_forward(&q, &k, &v, seq, shape);
        for t in 0..seq {
            for h in 0..4 {
                let p = &probs[(t * 4 + h) * seq..(t * 4 + h + 1) * seq];
                assert!(p[t + 1..].iter().all(|&x| x == 0.0));
                let s: f32 = p.iter().sum();
                assert!((s - 1.0).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn forward_is_bitwise_a_decode_against_a_kv_cache() {
        let shape = AttnShape {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 16,
        };
        let (seq, cap) = (9, 32);
        let (qw, kvw) = (shape.q_width(), shape.kv_width());
        let q = f32s(seq * qw, 40);
        let k = f32s(seq * kvw, 41);
        let v = f32s(seq * kvw, 42);
        let (out, probs) = attention_forward(&q, &k, &v, seq, shape);
        // A cache with spare capacity and garbage beyond the filled rows.
        let mut kc = vec![f32::NAN; cap * kvw];
        let mut vc = vec![f32::NAN; cap * kvw];
        for t in 0..seq {
            kc[t * kvw..(t + 1) * kvw].copy_from_slice(&k[t * kvw..(t + 1) * kvw]);
            vc[t * kvw..(t + 1) * kvw].copy_from_slice(&v[t * kvw..(t + 1) * kvw]);
            let mut o = vec![0f32; qw];
            let mut p = vec![0f32; shape.n_heads * (t + 1)];
            attend_row(
                &q[t * qw..(t + 1) * qw],
                &kc,
                &vc,
                t + 1,
                shape,
                &mut o,
                Some(&mut p),
            );
            for (a, b) in o.iter().zip(&out[t * qw..(t + 1) * qw]) {
                assert_eq!(a.to_bits(), b.to_bits(), "row {t}");
            }
            for h in 0..shape.n_heads {
                let row = &probs[(t * shape.n_heads + h) * seq..][..t + 1];
                for (a, b) in p[h * (t + 1)..(h + 1) * (t + 1)].iter().zip(row) {
                    assert_eq!(a.to_bits(), b.to_bits(), "probs row {t} head {h}");
                }
            }
        }
    }

    #[test]
    fn rows_do_not_see_the_future() {
        let shape = AttnShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 5,
        };
        let seq = 6;
        let (qw, kvw) = (shape.q_width(), shape.kv_width());
        let (q, k, v) = (f32s(seq * qw, 50), f32s(seq * kvw, 51), f32s(seq * kvw, 52));
        let (out, _) = attention_forward(&q, &k, &v, seq, shape);
        for t in 0..seq {
            // Change every row after t, and also run on the prefix alone.
            let (mut q2, mut k2, mut v2) = (q.clone(), k.clone(), v.clone());
            let noise = f32s(seq * qw, 60 + t as u64);
            q2[(t + 1) * qw..].copy_from_slice(&noise[(t + 1) * qw..]);
            k2[(t + 1) * kvw..].copy_from_slice(&noise[(t + 1) * kvw..seq * kvw]);
            v2[(t + 1) * kvw..].iter_mut().for_each(|x| *x = -*x * 3.0);
            let (out2, _) = attention_forward(&q2, &k2, &v2, seq, shape);
            let (prefix, _) = attention_forward(
                &q[..(t + 1) * qw],
                &k[..(t + 1) * kvw],
                &v[..(t + 1) * kvw],
                t + 1,
                shape,
            );
            let row = &out[t * qw..(t + 1) * qw];
            assert_eq!(
                row,
                &out2[t * qw..(t + 1) * qw],
                "row {t} changed with later rows"
            );
            assert_eq!(row, &prefix[t * qw..], "row {t} differs from the prefix's");
        }
    }
}
