//! Top-k / top-p sampling on the device (`sample_top.cu`) and its CPU specification
//! [`sample_top_reference`].
//!
//! A row's kept set is its entries in the order (logp descending, index ascending)
//! up to the first at which the count reaches `top_k` (0: off) or the probability
//! mass reaches `top_p` (1: off); NaN is never kept. The mass is fixed point: entry
//! `j` weighs about `min(exp(logp_j), 1) * 2^40` (`entry_units`: a fixed f32
//! sequence the kernel repeats), summed as integers, so the device may add in any
//! order and get the same sums; `top_p` becomes [`top_units`]. The token is the Gumbel-max of [`sample_reference`] over the kept
//! entries alone, with the same noise: `softmax(logp)` renormalized over the kept set,
//! and a seed whose kept set is the whole row draws `sample_reference`'s token.
//! As there, the recorded logprob is the untruncated `logp[token]`.
//!
//! CPU and GPU draw the same token and logprob for every row, bit for bit.
//!
//! [`sample_reference`]: super::sample::sample_reference

use cudarc::driver::CudaSlice;

use super::context::{Arg, SAMPLE};
use super::sample::{check_draw, draw_row, row_key, GpuSampled};
use super::{check_len, ensure, Gpu, Result};

/// `top_units`' "off" (`TOP_OFF` in `sample_top.cu`).
pub const TOP_OFF: u64 = u64::MAX;

/// The mass units of one probability: 2^-40.
const UNIT: f64 = (1u64 << 40) as f64;

/// `top_p` as the kernel's threshold: at least one unit, [`TOP_OFF`] from 1 up.
pub fn top_units(top_p: f64) -> u64 {
    if top_p >= 1.0 {
        TOP_OFF
    } else {
        ((top_p * UNIT) as u64).max(1)
    }
}

/// Entry `x`'s mass in units of 2^-40 (`mass_units` in `mass.cuh`): about
/// `min(exp(x), 1) 2^40`, truncated, by a fixed sequence of correctly rounded f32
/// operations that the kernel repeats one for one, so both sides weigh every entry
/// the same by construction (a library `exp` may differ in its last bit between
/// them). `x` is clamped to [-28, 0] (at -28 the mass is under one unit: -inf
/// weighs 0, and anything from 0 up 2^40); `n = rne(x log2 e)` in [-40, 0],
/// `r = x - n ln 2` by a two-part `ln 2` (|r| <= 0.35), `exp(r)` by its Taylor
/// polynomial of degree 7 in Horner form (truncation under 1e-8 relative), and
/// `exp(r) 2^(n + 40)` is exact in f32 before the truncation. Within ~2^-22 of
/// the true `exp`; `x` not NaN.
pub(super) fn entry_units(x: f32) -> u64 {
    const L2E: f32 = f32::from_bits(0x3fb8_aa3b);
    const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 16 bits: n LN2_HI is exact
    const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
    // 1/k! for k = 7 down to 0, rounded to f32.
    const C: [f32; 8] = [
        f32::from_bits(0x3950_0d01),
        f32::from_bits(0x3ab6_0b61),
        f32::from_bits(0x3c08_8889),
        f32::from_bits(0x3d2a_aaab),
        f32::from_bits(0x3e2a_aaab),
        0.5,
        1.0,
        1.0,
    ];
    let x = x.clamp(-28.0, 0.0);
    let n = (x * L2E).round_ties_even();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let p = C[1..].iter().fold(C[0], |p, &c| p.mul_add(r, c));
    let scale = f32::from_bits(((n as i32 + 40 + 127) as u32) << 23);
    (p * scale) as u64
}

/// `x`'s place in the order as an unsigned key (larger logp, larger key; -0 as
/// +0), `None` for NaN (`top_key`).
fn order_key(x: f32) -> Option<u32> {
    if x.is_nan() {
        return None;
    }
    let b = if x.to_bits() == 0x8000_0000 {
        0
    } else {
        x.to_bits()
    };
    Some(if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    })
}

/// Which entries of `row` the kept set holds ([`sample_top_reference`]'s rule):
/// sorted by (logp descending, index ascending), up to the first entry at which
/// the count reaches `top_k` (when not 0) or the mass reaches `units` (when not
/// [`TOP_OFF`]); the whole row (NaN aside) when neither is reached.
pub fn kept_set(row: &[f32], top_k: usize, units: u64) -> Vec<bool> {
    let mut order: Vec<(u32, usize)> = row
        .iter()
        .enumerate()
        .filter_map(|(j, &x)| order_key(x).map(|k| (k, j)))
        .collect();
    order.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut kept = vec![false; row.len()];
    let mut mass = 0u64;
    for (n, &(_, j)) in order.iter().enumerate() {
        kept[j] = true;
        mass += entry_units(row[j]);
        if (top_k > 0 && n + 1 >= top_k) || (units != TOP_OFF && mass >= units) {
            break;
        }
    }
    kept
}

/// The specification of [`sample_top`]: `logp [rows, vocab]` log-softmax rows,
/// `seeds [rows]`; per row the token (the kept set's Gumbel-max, lowest index on
/// exact ties; token 0 where no kept entry is finite) and its stored logp.
pub fn sample_top_reference(
    logp: &[f32],
    vocab: usize,
    seeds: &[u64],
    top_k: usize,
    top_p: f64,
) -> Vec<(u32, f32)> {
    assert!(vocab > 0, "sample_top_reference: vocab must be positive");
    let rows = logp.len() / vocab;
    assert_eq!(seeds.len(), rows, "sample_top_reference: one seed a row");
    let units = top_units(top_p);
    (0..rows)
        .map(|r| {
            let row = &logp[r * vocab..(r + 1) * vocab];
            let kept = kept_set(row, top_k, units);
            draw_row(row, Some(row_key(seeds[r])), |j| kept[j])
        })
        .collect()
}

/// Top-k / top-p draws from `logp [rows, vocab]` (log-softmax rows, already
/// tempered) with one seed a row, as [`sample_top_reference`]: `top_k` 0 is off,
/// `top_p` in (0, 1] (1 is off). One block of 1024 threads a row (a cluster of
/// two, each half the row, where the GPU has two SMs a row: [`cluster_of`]): three
/// histogram passes over the row find the kept set's boundary, a fourth its ties,
/// a fifth draws.
pub fn sample_top(
    gpu: &Gpu,
    logp: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
    seeds: &[u64],
    top_k: usize,
    top_p: f64,
) -> Result<GpuSampled> {
    check_draw("sample_top", rows, vocab, false, seeds)?;
    let dseeds = gpu.upload(seeds)?;
    sample_top_seeded(gpu, logp, rows, vocab, &dseeds, top_k, top_p)
}

/// [`sample_top`] with the seeds already on the device (`seeds [>= rows]`), as a
/// decode step run ahead of the host stages them.
pub fn sample_top_seeded(
    gpu: &Gpu,
    logp: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
    seeds: &CudaSlice<u64>,
    top_k: usize,
    top_p: f64,
) -> Result<GpuSampled> {
    check_draw("sample_top", rows, vocab, true, &[])?;
    ensure(seeds.len() >= rows, || {
        format!("sample_top: {} seeds for {rows} rows", seeds.len())
    })?;
    ensure(top_p > 0.0 && top_p <= 1.0, || {
        format!("sample_top: top_p {top_p} (must be in (0, 1])")
    })?;
    check_len(
        "sample_top logp",
        logp,
        rows * vocab,
        format!("[{rows}, {vocab}]"),
    )?;
    let out = GpuSampled::new(gpu, rows)?;
    if rows == 0 {
        return Ok(out);
    }
    let [tokens, lps] = out.args(gpu);
    let cluster = cluster_of(gpu, rows);
    gpu.launch_clustered(
        &SAMPLE,
        "sample_top",
        (rows as u32 * cluster, 1, 1),
        (1024, 1, 1),
        0,
        cluster,
        &[
            Arg::P(gpu.ptr(logp)),
            Arg::I(rows as i32),
            Arg::I(vocab as i32),
            Arg::P(gpu.ptr(seeds)),
            Arg::I(top_k.min(i32::MAX as usize) as i32),
            Arg::L(top_units(top_p) as i64),
            tokens,
            lps,
        ],
    )?;
    Ok(out)
}

/// Blocks a row for [`sample_top_seeded`]: two (a cluster, each block half the
/// row) where two blocks a row of 1024 threads still fit the GPU at once, one an
/// SM, on sm_90 and later; else one. `JET_TOP_CLUSTER` (1 or 2) overrides it, for
/// A/B runs and tests. The draw is the same either way.
fn cluster_of(gpu: &Gpu, rows: usize) -> u32 {
    if let Some(c) = std::env::var("JET_TOP_CLUSTER")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|c| (1..=2).contains(c))
    {
        return c;
    }
    if gpu.compute_capability().0 >= 9 && 2 * rows <= gpu.sm_count() {
        2
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::super::sample::tests::log_softmax;
    use super::*;

    fn kept_indices(row: &[f32], top_k: usize, top_p: f64) -> Vec<usize> {
        let kept = kept_set(row, top_k, top_units(top_p));
        (0..row.len()).filter(|&j| kept[j]).collect()
    }

    /// The keys order logps as floats do, -0 with +0, NaN apart.
    #[test]
    fn order_keys_follow_the_floats() {
        let xs = [
            f32::NEG_INFINITY,
            -3.5,
            -1e-30,
            -0.0,
            0.0,
            1e-30,
            2.0,
            f32::INFINITY,
        ];
        for w in xs.windows(2) {
            let (a, b) = (order_key(w[0]).unwrap(), order_key(w[1]).unwrap());
            assert!(a < b || (w[0] == 0.0 && w[1] == 0.0 && a == b), "{w:?}");
        }
        assert_eq!(order_key(f32::NAN), None);
    }

    /// top-k keeps the k largest, ties lowest index first; top-p the shortest
    /// prefix whose probability reaches p; both: whichever ends first; neither
    /// reached: the whole row; NaN never.
    #[test]
    fn kept_sets() {
        // probabilities 0.4, 0.1, 0.2, 0.2, 0.1 (indices 2 and 3 tie, 1 and 4 tie)
        let row = log_softmax(&[0.4f64, 0.1, 0.2, 0.2, 0.1].map(f64::ln));
        assert_eq!(kept_indices(&row, 1, 1.0), vec![0]);
        assert_eq!(kept_indices(&row, 2, 1.0), vec![0, 2]);
        assert_eq!(kept_indices(&row, 4, 1.0), vec![0, 1, 2, 3]);
        assert_eq!(kept_indices(&row, 0, 0.5), vec![0, 2]);
        assert_eq!(kept_indices(&row, 0, 0.7), vec![0, 2, 3]);
        assert_eq!(kept_indices(&row, 0, 0.75), vec![0, 2, 3]);
        assert_eq!(kept_indices(&row, 0, 0.85), vec![0, 1, 2, 3]);
        assert_eq!(kept_indices(&row, 2, 0.75), vec![0, 2]);
        assert_eq!(kept_indices(&row, 0, 0.1), vec![0]);
        assert_eq!(kept_indices(&row, 9, 1.0), vec![0, 1, 2, 3, 4]);
        let mut with_nan = row.clone();
        with_nan[0] = f32::NAN;
        assert_eq!(kept_indices(&with_nan, 1, 1.0), vec![2]);
        assert_eq!(kept_indices(&with_nan, 0, 1.0 - 1e-9), vec![1, 2, 3, 4]);
    }

    /// Over 20000 seeds the kept set's draws follow softmax renormalized over it,
    /// and an entry outside it is never drawn.
    #[test]
    fn draws_follow_the_kept_distribution() {
        let p = [0.4f64, 0.1, 0.2, 0.2, 0.1];
        let lp = log_softmax(&p.map(f64::ln));
        let n = 20_000;
        let logp: Vec<f32> = (0..n).flat_map(|_| lp.iter().copied()).collect();
        let seeds: Vec<u64> = (0..n as u64).collect();
        // top-p 0.7 keeps 0, 2, 3 (0.8 of the mass).
        let got = sample_top_reference(&logp, 5, &seeds, 0, 0.7);
        let mut count = [0usize; 5];
        for &(t, l) in &got {
            count[t as usize] += 1;
            assert_eq!(l.to_bits(), lp[t as usize].to_bits());
        }
        assert_eq!(count[1] + count[4], 0, "{count:?}");
        for (j, q) in [(0, 0.5), (2, 0.25), (3, 0.25)] {
            let (e, sd) = (n as f64 * q, (n as f64 * q * (1.0 - q)).sqrt());
            assert!(
                (count[j] as f64 - e).abs() <= 4.0 * sd,
                "{count:?} for kept 0, 2, 3"
            );
        }
        // Nothing cut: sample_reference's tokens.
        let whole = sample_top_reference(&logp, 5, &seeds, 9, 1.0);
        assert_eq!(
            whole,
            super::super::sample::sample_reference(&logp, 5, false, &seeds)
        );
    }

    #[test]
    fn top_units_bounds() {
        assert_eq!(top_units(1.0), TOP_OFF);
        assert_eq!(top_units(0.5), 1 << 39);
        assert_eq!(top_units(1e-300), 1);
        assert_eq!(entry_units(0.0), 1 << 40);
        assert_eq!(entry_units(f32::NEG_INFINITY), 0);
        assert_eq!(entry_units(5.0), 1 << 40);
        assert_eq!(entry_units(-28.0), 0);
    }

    /// The fixed-sequence mass against f64's `exp` over [-30, 1]: within 2^-22
    /// relative (and one unit of truncation), never above one probability, and
    /// monotone.
    #[test]
    fn entry_units_track_exp() {
        let mut prev = 0u64;
        for i in 0..=310_000 {
            let x = -30.0 + i as f32 * 1e-4;
            let got = entry_units(x);
            let want = (x as f64).exp().min(1.0) * UNIT;
            assert!(
                (got as f64 - want).abs() <= want * 2f64.powi(-22) + 1.0,
                "x {x}: {got} against {want}"
            );
            assert!(got <= 1 << 40 && got >= prev, "x {x}: {got} after {prev}");
            prev = got;
        }
    }
}
