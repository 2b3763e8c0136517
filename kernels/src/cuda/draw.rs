//! The plain tempered draw on the device by inverse CDF (`draw.cu`), and its CPU
//! specification [`draw_reference`].
//!
//! An untruncated draw (temperature > 0, no top-k / top-p) picks token `j` with
//! probability `softmax(z)_j` of the tempered logits `z`. Each entry weighs a
//! fixed-point integer: the row is cut into the log-softmax's chunks of
//! [`LS_CHUNK`] entries, entry `j` of chunk `c` weighs `U_j = draw_units(z_j, m_c)`
//! (about `exp(z_j - m_c) 2^40`, [`entry_units`]' fixed f32 sequence), chunk `c`
//! weighs `W_c = (sum of its U_j) * draw_units(m_c, m)` as a 128-bit integer (`m_c`
//! the chunk's max, `m` the row's). With `r` the row's 64-bit draw (its seed's key
//! hashed once more), the target is `T = floor(r * total / 2^64)` and the token is the
//! first entry, in index order, whose running weight exceeds `T`. Every sum is an
//! integer sum, so the device adds in any order and CPU and GPU pick the same token by
//! construction. An entry's weight is its softmax share within about 2^-22 relative
//! plus one unit absolute for each truncation (its own, and its chunk's scale: 2^-40
//! of the row max's weight), so a whole chunk far under the row's max carries up to
//! `1 / E_c` relative error, and an entry under about `e^-27.7` (2^-40) of its chunk's
//! max, or a chunk that far under the row's, weighs nothing: total variation from
//! softmax under 1e-6 at a 151,936-entry vocabulary.
//!
//! On the device the chunk masses ride in the log-softmax stats pass
//! (`softmax_chunk_stats_mass`) and one block a row reads only the drawn chunk again
//! (`draw_pick`), where the Gumbel-max ([`super::sample`]) hashed every entry in a
//! second pass over the row. The recorded logprob is the row's log-softmax entry,
//! `(z_t - m) - ln S`, the bits training computes. Greedy draws and top-k / top-p
//! keep their own kernels.

use cudarc::driver::CudaSlice;

use super::context::{Arg, LOGSOFTMAX};
use super::logsoftmax::{mass_stats, LS_CHUNK, LS_THREADS};
use super::sample::{mix64, row_key, GpuSampled};
use super::sample_top::entry_units;
use super::{ensure, Gpu, Result};

/// The draw's mass of a tempered logit `z` in a chunk (or row) of max `m`
/// (`draw_units` in `mass.cuh`): [`entry_units`]`(z - m)`, with `z == m` weighing
/// 2^40 also where `m` is +inf; NaN weighs 0, as does -inf.
fn draw_units(z: f32, m: f32) -> u64 {
    if z.is_nan() {
        return 0;
    }
    entry_units(if z == m { 0.0 } else { z - m })
}

/// `floor(r t / 2^64)` (`u128_scale`), below `t` for any `r`; `t < 2^127`.
fn scale(r: u64, t: u128) -> u128 {
    let r = r as u128;
    r * (t >> 64) + ((r * (t & u64::MAX as u128)) >> 64)
}

/// The row's 64-bit draw: its key ([`row_key`]) hashed once more.
fn row_draw(seed: u64) -> u64 {
    mix64(row_key(seed))
}

/// One row's token (tempered logits `row`, any length above 0).
fn draw_row(row: &[f32], seed: u64) -> u32 {
    let chunks: Vec<&[f32]> = row.chunks(LS_CHUNK).collect();
    // f32::max, as fmaxf: NaN gives way to the other argument.
    let max = |v: &[f32]| v.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let maxes: Vec<f32> = chunks.iter().map(|c| max(c)).collect();
    let mass: Vec<u64> = chunks
        .iter()
        .zip(&maxes)
        .map(|(c, &mc)| match mc == f32::NEG_INFINITY {
            true => 0, // the stats pass skips a chunk of no finite max
            false => c.iter().map(|&z| draw_units(z, mc)).sum(),
        })
        .collect();
    let m = max(&maxes);
    let scale_of = |c: usize| draw_units(maxes[c], m) as u128;
    let weight = |c: usize| mass[c] as u128 * scale_of(c);
    let total: u128 = (0..chunks.len()).map(weight).sum();
    let t = scale(row_draw(seed), total);
    let mut before = 0u128;
    for (c, chunk) in chunks.iter().enumerate() {
        let w = weight(c);
        if t < before + w {
            let (tin, e, mc) = (t - before, scale_of(c), maxes[c]);
            let mut cum = 0u128;
            for (i, &z) in chunk.iter().enumerate() {
                cum += draw_units(z, mc) as u128;
                if tin < cum * e {
                    return (c * LS_CHUNK + i) as u32;
                }
            }
            unreachable!("a chunk's masses sum to its weight");
        }
        before += w;
    }
    0 // no mass: every entry NaN or -inf
}

/// The specification of [`draw_logits`]: per row of tempered logits
/// `z [rows, vocab]` (`rows = z.len() / vocab`) and its seed, the drawn token (token 0
/// for a row whose every entry is NaN or -inf).
pub fn draw_reference(z: &[f32], vocab: usize, seeds: &[u64]) -> Vec<u32> {
    assert!(vocab > 0, "draw_reference: vocab must be positive");
    let rows = z.len() / vocab;
    assert_eq!(seeds.len(), rows, "draw_reference: one seed a row");
    (0..rows)
        .map(|r| draw_row(&z[r * vocab..(r + 1) * vocab], seeds[r]))
        .collect()
}

/// The untruncated draw of tempered `logits [rows, vocab]` with the seeds on the
/// device (`seeds [>= rows]`): [`draw_reference`]'s tokens, each with its logprob
/// `(z_t - m) - ln S` ([`super::logsoftmax::log_softmax_rows`]' entry, bit for bit).
/// Two launches: the log-softmax stats with each chunk's mass, then one block a row.
pub fn draw_logits(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
    seeds: &CudaSlice<u64>,
) -> Result<GpuSampled> {
    ensure(seeds.len() >= rows, || {
        format!("draw_logits: {} seeds for {rows} rows", seeds.len())
    })?;
    let (st, mass) = mass_stats(gpu, logits, rows, vocab)?;
    let out = GpuSampled::new(gpu, rows)?;
    if rows == 0 {
        return Ok(out);
    }
    let [tokens, logp] = out.args(gpu);
    gpu.launch(
        &LOGSOFTMAX,
        "draw_pick",
        (rows as u32, 1, 1),
        (LS_THREADS, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(logits)),
            Arg::P(gpu.ptr(&st)),
            Arg::P(gpu.ptr(&mass)),
            Arg::I(vocab as i32),
            Arg::I(vocab.div_ceil(LS_CHUNK) as i32),
            Arg::P(gpu.ptr(seeds)),
            tokens,
            logp,
        ],
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::sample::tests::chi2;
    use super::*;

    /// `floor(r t / 2^64)` against the 192-bit product, at the extremes.
    #[test]
    fn scale_is_the_top_of_the_product() {
        for (r, t) in [
            (u64::MAX, (1u128 << 111) - 1),
            (u64::MAX, 1),
            (1, u128::from(u64::MAX)),
            (1 << 63, 3),
            (0x1234_5678_9abc_def0, 0xdead_beef_u128 << 70 | 0x77),
        ] {
            let got = scale(r, t);
            assert!(got < t, "{r:#x} {t:#x}");
            // got = floor(r t / 2^64) iff got 2^64 <= r t < (got + 1) 2^64; both sides
            // split into (t >> 64, t mod 2^64) parts to stay inside u128.
            let (hi, lo) = (t >> 64, t & u64::MAX as u128);
            let lo_prod = r as u128 * lo;
            let exact_hi = r as u128 * hi + (lo_prod >> 64);
            assert_eq!(got, exact_hi);
        }
    }

    /// Counts of `n` draws of `row` with consecutive seeds.
    fn counts(row: &[f32], n: u64, at: &[usize]) -> Vec<usize> {
        let mut c = vec![0; at.len()];
        for s in 0..n {
            let t = draw_row(row, s) as usize;
            let k = at.iter().position(|&j| j == t);
            c[k.unwrap_or_else(|| panic!("drew {t}, outside {at:?}"))] += 1;
        }
        c
    }

    /// The draw samples softmax: within one chunk (five entries), and over entries in
    /// three chunks whose maxima differ (-inf between them), so the chunk weights
    /// carry the shares; chi-square (dof 4 and 3) below 25.
    #[test]
    fn draws_sample_softmax() {
        let p = [0.5, 0.2, 0.15, 0.1, 0.05];
        let row: Vec<f32> = p.iter().map(|&x: &f64| x.ln() as f32 + 3.0).collect();
        let c = counts(&row, 20_000, &[0, 1, 2, 3, 4]);
        assert!(chi2(&c, &p) < 25.0, "{c:?}");

        let p = [0.4, 0.3, 0.2, 0.1];
        let at = [100, LS_CHUNK + 7, 2 * LS_CHUNK + 1, 2 * LS_CHUNK + 2];
        let mut row = vec![f32::NEG_INFINITY; 2 * LS_CHUNK + 500];
        for (&j, &pj) in at.iter().zip(&p) {
            row[j] = (pj as f32).ln() - 1.5;
        }
        let c = counts(&row, 20_000, &at);
        assert!(chi2(&c, &p) < 25.0, "{c:?}");
    }

    /// A flat row of three chunks: every entry in reach, the draws spread over the row
    /// (each chunk's share within 4 sigma of its length's share, chi-square below 25).
    #[test]
    fn flat_rows_spread_over_every_chunk() {
        let vocab = 2 * LS_CHUNK + 1_000;
        let row = vec![0.25f32; vocab];
        let n = 6_000u64;
        let mut per_chunk = [0usize; 3];
        let mut seen = std::collections::HashSet::new();
        for s in 0..n {
            let t = draw_row(&row, s) as usize;
            per_chunk[t / LS_CHUNK] += 1;
            seen.insert(t);
        }
        let p: Vec<f64> = [LS_CHUNK, LS_CHUNK, 1_000]
            .iter()
            .map(|&l| l as f64 / vocab as f64)
            .collect();
        let x = chi2(&per_chunk, &p);
        assert!(x < 25.0, "chi-square {x} for {per_chunk:?}");
        assert!(seen.len() > 5_000, "{} distinct of {n}", seen.len());
    }

    /// NaN and -inf are never drawn (a row of nothing else draws token 0); +inf
    /// entries take all the mass, shared evenly.
    #[test]
    fn special_values() {
        let (nan, ninf, inf) = (f32::NAN, f32::NEG_INFINITY, f32::INFINITY);
        for s in 0..50 {
            assert_eq!(draw_row(&[ninf; 9], s), 0);
            assert_eq!(draw_row(&[nan; 9], s), 0);
            assert_eq!(draw_row(&[nan, ninf, nan, -3.0, ninf, nan], s), 3);
            let t = draw_row(&[0.0, inf, 5.0, nan, inf, ninf], s);
            assert!(t == 1 || t == 4, "{t}");
        }
        let mut row = vec![1.0f32; LS_CHUNK + 10];
        row[LS_CHUNK + 3] = inf;
        row[2] = inf;
        let c = counts(&row, 2_000, &[2, LS_CHUNK + 3]);
        assert!(c[0] > 850 && c[1] > 850, "{c:?}");
    }

    /// The same seed draws the same token; different seeds spread.
    #[test]
    fn seeds_reproduce_and_spread() {
        let row = vec![0.0f32; 1000];
        assert_eq!(
            draw_reference(&row, 1000, &[42]),
            draw_reference(&row, 1000, &[42])
        );
        let distinct: std::collections::HashSet<u32> = (0..50).map(|s| draw_row(&row, s)).collect();
        assert!(distinct.len() > 40, "{distinct:?}");
        // Rows are drawn with their own seeds.
        let two: Vec<f32> = row.iter().chain(&row).copied().collect();
        let got = draw_reference(&two, 1000, &[7, 9]);
        assert_eq!(got, vec![draw_row(&row, 7), draw_row(&row, 9)]);
    }

    /// A token the reference can never draw: one whose logit sits e^-30 under the
    /// row's max weighs nothing, and 4,000 draws of two entries at -1 and 0 give each
    /// its softmax share (chi-square, 1 dof, below 20).
    #[test]
    fn negligible_entries_weigh_nothing() {
        assert_eq!(draw_units(-30.0, 0.0), 0);
        assert_eq!(draw_units(0.0, 0.0), 1 << 40);
        assert_eq!(draw_units(f32::NAN, 0.0), 0);
        let p1 = 1.0 / (1.0 + (-1.0f64).exp());
        let c = counts(&[-1.0, 0.0, -31.0], 4_000, &[0, 1]);
        let x = chi2(&c, &[1.0 - p1, p1]);
        assert!(x < 20.0, "chi-square {x} for {c:?}");
    }
}
