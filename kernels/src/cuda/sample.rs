//! Token sampling on the device (`sample.cu`) from log-probability rows, greedy
//! draws straight from logits, and its CPU specification [`sample_reference`].
//! Seeded draws from logits go to [`super::draw::draw_logits`] (an inverse CDF);
//! the Gumbel-max here is [`sample_rows`]' and the final draw over the kept set of
//! top-k / top-p ([`super::sample_top`]).
//!
//! Sampling here is Gumbel-max: the token is `argmax_j (logp_j + G_j)` with standard
//! Gumbel noise `G_j = -ln(-ln u_j)`, which draws `j` with probability
//! `softmax(logp)_j` exactly. `u_j` comes from a counter-based hash of
//! `(seeds[row], j)` (splitmix64), so a row's draw depends on its seed alone, not on
//! the thread layout, and the CPU and the GPU agree. The noise is f64, so ties
//! between perturbed scores are vanishingly rare; exact ties go to the lowest index.
//! The one possible CPU/GPU difference: CUDA's f64 `log` may differ from Rust's `ln`
//! in the last bit, which changes a token only when the top two scores are within
//! about 1e-16 relative.

use cudarc::driver::CudaSlice;

use super::context::{Arg, SAMPLE};
use super::logsoftmax::row_stats;
use super::{check_len, ensure, Gpu, Result};

/// Tokens and their logprobs on the device, in one buffer `[2][rows]` (the tokens,
/// then the logprobs' bits), so the rollout brings both back in one copy.
pub struct GpuSampled {
    buf: CudaSlice<i32>,
    rows: usize,
}

impl GpuSampled {
    pub(super) fn new(gpu: &Gpu, rows: usize) -> Result<GpuSampled> {
        Ok(GpuSampled {
            buf: gpu.uninit(2 * rows)?,
            rows,
        })
    }

    /// The kernels' `tokens` and `out_logp` arguments.
    pub(super) fn args(&self, gpu: &Gpu) -> [Arg; 2] {
        let p = gpu.ptr(&self.buf);
        [Arg::P(p), Arg::P(p + 4 * self.rows as u64)]
    }

    /// Each row's token and logprob (one copy, one wait for the stream).
    pub fn download(&self, gpu: &Gpu) -> Result<Vec<(u32, f32)>> {
        Self::unpack(&gpu.download_n(&self.buf, 2 * self.rows)?, self.rows)
    }

    /// The whole `[2][rows]` buffer, for a copy the caller waits for itself
    /// ([`super::pinned::PinnedOut`]); [`GpuSampled::unpack`] reads it.
    pub fn buffer(&self) -> &CudaSlice<i32> {
        &self.buf
    }

    /// Rows `(token, logprob)` from the first `2 rows` values of a copy of
    /// [`GpuSampled::buffer`].
    pub fn unpack(v: &[i32], rows: usize) -> Result<Vec<(u32, f32)>> {
        ensure(v.len() >= 2 * rows, || {
            format!("a draw of {rows} rows read back as {} values", v.len())
        })?;
        let (t, lp) = v[..2 * rows].split_at(rows);
        Ok(t.iter()
            .zip(lp)
            .map(|(&t, &b)| (t as u32, f32::from_bits(b as u32)))
            .collect())
    }
}

/// The splitmix64 finalizer.
pub(super) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
const SEED_SALT: u64 = 0x6a09_e667_f3bc_c909;

/// A row's hash key: its seed mixed once, so that nearby seeds give unrelated rows.
pub(super) fn row_key(seed: u64) -> u64 {
    mix64(seed ^ SEED_SALT)
}

/// The Gumbel noise of entry `j`: `u = (top 53 bits + 1/2) * 2^-53` in f64, inside
/// (0, 1) but for all-ones top bits (the add rounds to 2^53: u = 1, noise +inf, once
/// in 2^53 draws); then `-ln(-ln u)`.
fn gumbel(key: u64, j: usize) -> f64 {
    gumbel_of_hash(entry_hash(key, j as u64))
}

/// The splitmix64 hash of entry `j` of a row with key `key` (`gumbel_hash` in
/// `sample.cu`).
fn entry_hash(key: u64, j: u64) -> u64 {
    mix64(key.wrapping_add((j + 1).wrapping_mul(GOLDEN_GAMMA)))
}

/// The leading ones of `h`'s top 32 bits, which the kernels' first noise bound
/// reads (`gumbel_upper_ones`).
fn leading_ones(h: u64) -> u32 {
    (!(h >> 32) as u32).leading_zeros()
}

/// The noise of hash `h` ([`gumbel`]'s second half).
fn gumbel_of_hash(h: u64) -> f64 {
    let u = ((h >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64);
    -(-u.ln()).ln()
}

/// The Gumbel noise [`sample_reference`] adds to entry `j` of a row drawn with
/// `seed` (for tests that build rows around it).
#[doc(hidden)]
pub fn gumbel_noise(seed: u64, j: usize) -> f64 {
    gumbel(row_key(seed), j)
}

/// The leading ones of the top 32 bits of entry `j`'s hash in a row drawn with
/// `seed`, which the kernels' first noise bound reads (for tests that build rows
/// at that bound's edge).
#[doc(hidden)]
pub fn gumbel_leading_ones(seed: u64, j: usize) -> u32 {
    leading_ones(entry_hash(row_key(seed), j as u64))
}

/// The specification of [`sample_rows`]: `logp [rows, vocab]` with
/// `rows = logp.len() / vocab`; `seeds [rows]` (ignored, and may be empty, when
/// `greedy`). Per row the token (argmax of `logp_j`, or of `logp_j + G_j`; lowest
/// index on ties; NaN and -inf never win, a row of nothing else gives token 0) and
/// its stored logp.
pub fn sample_reference(
    logp: &[f32],
    vocab: usize,
    greedy: bool,
    seeds: &[u64],
) -> Vec<(u32, f32)> {
    assert!(vocab > 0, "sample_reference: vocab must be positive");
    let rows = logp.len() / vocab;
    assert!(
        greedy || seeds.len() == rows,
        "sample_reference: {} seeds for {rows} rows",
        seeds.len()
    );
    (0..rows)
        .map(|r| {
            let row = &logp[r * vocab..(r + 1) * vocab];
            draw_row(row, (!greedy).then(|| row_key(seeds[r])), |_| true)
        })
        .collect()
}

/// One row's draw over the entries `kept` admits: the argmax of `logp_j` (greedy,
/// `key` None) or of `logp_j + G_j` with the row's noise, lowest index on exact ties
/// (NaN and -inf never win; token 0 where nothing else is left), and its stored logp.
pub(super) fn draw_row(row: &[f32], key: Option<u64>, kept: impl Fn(usize) -> bool) -> (u32, f32) {
    let (mut best, mut tok) = (f64::NEG_INFINITY, None);
    for (j, &lp) in row.iter().enumerate() {
        if !kept(j) {
            continue;
        }
        let s = lp as f64 + key.map_or(0.0, |k| gumbel(k, j));
        if s > best {
            best = s;
            tok = Some(j);
        }
    }
    let t = tok.unwrap_or(0);
    (t as u32, row[t])
}

/// A vocabulary the kernels index with i32, and one seed a row unless greedy.
pub(super) fn check_draw(
    what: &str,
    rows: usize,
    vocab: usize,
    greedy: bool,
    seeds: &[u64],
) -> Result<()> {
    ensure(vocab > 0 && vocab <= i32::MAX as usize, || {
        format!("{what}: vocabulary of {vocab} (must be 1 ..= 2^31 - 1)")
    })?;
    ensure(greedy || seeds.len() == rows, || {
        format!("{what}: {} seeds for {rows} rows", seeds.len())
    })
}

/// Threads per row: 1024 threads cover a 151936-entry vocabulary in 149 steps each.
const THREADS: u32 = 1024;

/// `logp [rows, vocab]` holds log_softmax rows (already tempered). Greedy when
/// `greedy` (argmax, lowest index on ties); otherwise Gumbel-max with noise from
/// `seeds [rows]` (ignored, may be empty, when greedy), as [`sample_reference`].
/// Returns the chosen token and `logp[row, token]` (the exact stored value, so it
/// equals what `log_softmax_rows` gives at that index bit for bit). One block of
/// 1024 threads per row; `vocab` below 2^31.
pub fn sample_rows(
    gpu: &Gpu,
    logp: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
    greedy: bool,
    seeds: &[u64],
) -> Result<GpuSampled> {
    check_draw("sample_rows", rows, vocab, greedy, seeds)?;
    check_len(
        "sample_rows logp",
        logp,
        rows * vocab,
        format!("[{rows}, {vocab}]"),
    )?;

    // Greedy rows never read their seed: no upload, a null pointer.
    let dseeds = if greedy {
        None
    } else {
        Some(gpu.upload(seeds)?)
    };
    let out = GpuSampled::new(gpu, rows)?;
    gpu.launch(
        &SAMPLE,
        "sample_rows",
        (rows as u32, 1, 1),
        (THREADS, 1, 1),
        0,
        &[
            Arg::P(gpu.ptr(logp)),
            Arg::I(rows as i32),
            Arg::I(vocab as i32),
            Arg::I(greedy as i32),
            Arg::P(dseeds.as_ref().map_or(0, |d| gpu.ptr(d))),
            out.args(gpu)[0],
            out.args(gpu)[1],
        ],
    )?;
    Ok(out)
}

/// Resident `sample_chunks` blocks an SM (32 registers, 256 threads).
const SAMPLE_BLOCKS_PER_SM: usize = 8;

/// A draw from tempered `logits [rows, vocab]`: greedy (the same tokens and logprobs
/// bit for bit as [`sample_rows`] over
/// [`log_softmax_rows`](super::logsoftmax::log_softmax_rows)`(logits)`, without writing
/// the log-probability rows: each row's max and `ln S` as training's logprobs, then the
/// row scored in chunks by several blocks, one block a row having kept 64 SMs busy and
/// 68 idle at a decode batch of 64, then the best chunk), or untruncated sampling
/// with `seeds [rows]`: [`super::draw::draw_logits`], by inverse CDF.
pub fn sample_logits(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
    greedy: bool,
    seeds: &[u64],
) -> Result<GpuSampled> {
    check_draw("sample_logits", rows, vocab, greedy, seeds)?;
    // Greedy rows never read their seed: no upload, a null pointer.
    let dseeds = match greedy || rows == 0 {
        true => None,
        false => Some(gpu.upload(seeds)?),
    };
    sample_logits_seeded(gpu, logits, rows, vocab, dseeds.as_ref())
}

/// [`sample_logits`] with the seeds already on the device (`seeds [>= rows]`,
/// `None`: greedy), for a caller that stages them without waiting for the
/// stream (the decode loop's pinned uploads). Sampling runs
/// [`super::draw::draw_logits`]; greedy draws run `sample_chunks` below as a chunked
/// argmax of the logp values (`score_entries` of [`sample_rows`], greedy).
pub fn sample_logits_seeded(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
    seeds: Option<&CudaSlice<u64>>,
) -> Result<GpuSampled> {
    check_draw("sample_logits", rows, vocab, true, &[])?;
    if let Some(s) = seeds {
        return super::draw::draw_logits(gpu, logits, rows, vocab, s);
    }
    let (m, lns) = row_stats(gpu, logits, rows, vocab)?;
    let out = GpuSampled::new(gpu, rows)?;
    if rows == 0 {
        return Ok(out);
    }
    // One wave: eight blocks of 256 threads fit an SM (32 registers), so rows *
    // chunks stays at most eight an SM; chunks of at least 1,024 entries.
    let chunks = (SAMPLE_BLOCKS_PER_SM * gpu.sm_count() / rows).clamp(1, vocab.div_ceil(1024));
    let len = vocab.div_ceil(chunks);
    let chunks = vocab.div_ceil(len);
    let (cs, ci) = (
        gpu.uninit::<f64>(rows * chunks)?,
        gpu.uninit::<i32>(rows * chunks)?,
    );
    let stats = [
        Arg::P(gpu.ptr(logits)),
        Arg::P(gpu.ptr(&m)),
        Arg::P(gpu.ptr(&lns)),
    ];
    gpu.launch(
        &SAMPLE,
        "sample_chunks",
        (rows as u32, chunks as u32, 1),
        (256, 1, 1),
        0,
        &[
            &stats[..],
            &[
                Arg::I(rows as i32),
                Arg::I(vocab as i32),
                Arg::I(len as i32),
                Arg::P(gpu.ptr(&cs)),
                Arg::P(gpu.ptr(&ci)),
            ],
        ]
        .concat(),
    )?;
    gpu.launch(
        &SAMPLE,
        "sample_pick",
        (rows as u32, 1, 1),
        (32, 1, 1),
        0,
        &[
            &stats[..],
            &[
                Arg::I(vocab as i32),
                Arg::I(chunks as i32),
                Arg::P(gpu.ptr(&cs)),
                Arg::P(gpu.ptr(&ci)),
                out.args(gpu)[0],
                out.args(gpu)[1],
            ],
        ]
        .concat(),
    )?;
    Ok(out)
}

/// A decode step's inputs `[n]` each (`tokens`, `positions`, `kv0`, `len`)
/// from one staged copy `staged [5][n]` (on the device): each row's token,
/// position, offset into the page table `pages`, length, and the page holding
/// its new row, written into `pages` at the row's offset plus `(len - 1) /
/// page_rows`. With `drawn`, the tokens come from the last draw with no trip
/// through the host: the first fifth holds each row's draw row instead (`keep`,
/// then -1 for padding; checked here).
#[allow(clippy::too_many_arguments)]
pub fn feed_step(
    gpu: &Gpu,
    drawn: Option<(&GpuSampled, &[usize])>,
    staged: &CudaSlice<i32>,
    tokens: &mut CudaSlice<i32>,
    positions: &mut CudaSlice<i32>,
    kv0: &mut CudaSlice<i32>,
    len: &mut CudaSlice<i32>,
    (pages, page_rows): (&mut CudaSlice<i32>, usize),
) -> Result<()> {
    let n = tokens.len();
    ensure(page_rows > 0, || "feed_step: pages of 0 rows".to_string())?;
    ensure(
        staged.len() == 5 * n && [positions.len(), kv0.len(), len.len()] == [n; 3],
        || {
            format!(
                "feed_step: inputs of {n} rows, {} staged values",
                staged.len()
            )
        },
    )?;
    if let Some((d, keep)) = drawn {
        ensure(keep.len() <= n, || {
            format!("feed_step: {} drawn rows into {n}", keep.len())
        })?;
        if let Some(&r) = keep.iter().find(|&&r| r >= d.rows) {
            return Err(super::CudaError::Invalid(format!(
                "feed_step: row {r} of a draw of {} rows",
                d.rows
            )));
        }
    }
    gpu.launch(
        &SAMPLE,
        "feed_step",
        ((n as u32).div_ceil(128), 1, 1),
        (128, 1, 1),
        0,
        &[
            Arg::P(drawn.map_or(0, |(d, _)| gpu.ptr(&d.buf))),
            Arg::P(gpu.ptr(staged)),
            Arg::I(n as i32),
            Arg::P(gpu.ptr(tokens)),
            Arg::P(gpu.ptr(positions)),
            Arg::P(gpu.ptr(kv0)),
            Arg::P(gpu.ptr(len)),
            Arg::P(gpu.ptr(pages)),
            Arg::I(page_rows as i32),
        ],
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `gumbel_upper_ones` (`sample.cu`): `(L + 1) ln 2 + 1e-3` in f32 for `L < 32`
    /// leading ones in the hash's top 32 bits; the kernels skip an entry whose
    /// logp plus it falls short of the best score, so it must exceed the noise of
    /// every hash with `L` leading ones. Checked at each `L`'s largest noise (all
    /// other bits ones, the largest u) and on a million hashes, with 1e-4 to spare
    /// for CUDA's f64 logarithm.
    #[test]
    fn leading_ones_bound_exceeds_the_noise() {
        // LN_2 in f32 is the kernel's 0.6931472f, ln 2 rounded up.
        assert!(std::f32::consts::LN_2 as f64 > std::f64::consts::LN_2);
        let bound = |l: u32| ((l + 1) as f32).mul_add(std::f32::consts::LN_2, 1e-3) as f64;
        for l in 0..32u32 {
            let h = !0u64 ^ (1u64 << (63 - l));
            assert_eq!(leading_ones(h), l);
            let g = gumbel_of_hash(h);
            assert!(
                g + 1e-4 < bound(l),
                "L {l}: noise {g} against bound {}",
                bound(l)
            );
            // One leading one fewer has a bound ln 2 lower: the bound is tight to that.
            assert!(
                g > bound(l) - 0.7,
                "L {l}: noise {g} far under bound {}",
                bound(l)
            );
        }
        let key = row_key(7);
        for j in 0..1_000_000u64 {
            let h = entry_hash(key, j);
            let l = leading_ones(h);
            if l < 32 {
                assert!(gumbel_of_hash(h) + 1e-4 < bound(l), "hash {h:#x}");
            }
        }
    }

    /// log_softmax of `z` in f64, rounded to f32 (rows for the draws' tests).
    pub(crate) fn log_softmax(z: &[f64]) -> Vec<f32> {
        let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        z.iter().map(|v| (v - lse) as f32).collect()
    }

    /// Chi-square of `count` against probabilities `p`, after asserting each bin
    /// within 4 sigma of its expectation.
    pub(crate) fn chi2(count: &[usize], p: &[f64]) -> f64 {
        let n: usize = count.iter().sum();
        let mut chi2 = 0.0;
        for (&c, &pi) in count.iter().zip(p) {
            let (e, sd) = (n as f64 * pi, (n as f64 * pi * (1.0 - pi)).sqrt());
            assert!(
                (c as f64 - e).abs() <= 4.0 * sd,
                "counts {count:?} for p {p:?}"
            );
            chi2 += (c as f64 - e).powi(2) / e;
        }
        chi2
    }

    /// Gumbel-max over 20000 rows with consecutive seeds draws from softmax: every
    /// bin within 4 sigma, chi-square (4 dof) below 25 (p ~ 5e-5), and the pairs of
    /// rows (2k, 2k+1) independent (chi-square over 25 cells, 24 dof, below 55).
    #[test]
    fn gumbel_max_samples_softmax() {
        let p = [0.5, 0.2, 0.15, 0.1, 0.05];
        let lp = log_softmax(&p.map(f64::ln));
        let n = 20_000;
        let logp: Vec<f32> = (0..n).flat_map(|_| lp.iter().copied()).collect();
        let seeds: Vec<u64> = (0..n as u64).collect();
        let got = sample_reference(&logp, 5, false, &seeds);
        let mut count = [0usize; 5];
        for &(t, l) in &got {
            count[t as usize] += 1;
            assert_eq!(l.to_bits(), lp[t as usize].to_bits());
        }
        let x = chi2(&count, &p);
        assert!(x < 25.0, "chi-square {x} for counts {count:?}");
        let mut pairs = [[0usize; 5]; 5];
        for k in 0..n / 2 {
            pairs[got[2 * k].0 as usize][got[2 * k + 1].0 as usize] += 1;
        }
        let mut chi2 = 0.0;
        for a in 0..5 {
            for b in 0..5 {
                let e = (n / 2) as f64 * p[a] * p[b];
                chi2 += (pairs[a][b] as f64 - e).powi(2) / e;
            }
        }
        assert!(chi2 < 55.0, "pair chi-square {chi2}: {pairs:?}");
    }

    #[test]
    fn greedy_ties_nan_and_neg_inf() {
        let ninf = f32::NEG_INFINITY;
        let logp = [
            -1.0,
            -0.5,
            -0.5,
            -2.0, // tie: lowest index
            f32::NAN,
            -3.0,
            ninf,
            -4.0, // NaN never wins
            ninf,
            ninf,
            f32::NAN,
            ninf, // nothing valid: token 0
        ];
        let got = sample_reference(&logp, 4, true, &[]);
        assert_eq!(got[0], (1, -0.5));
        assert_eq!(got[1], (1, -3.0));
        assert_eq!(got[2].0, 0);
        // Sampling never picks a NaN or -inf entry either.
        let got = sample_reference(&logp, 4, false, &[1, 2, 3]);
        assert!(got[1].0 == 1 || got[1].0 == 3, "{got:?}");
        assert_eq!(got[2].0, 0);
    }

    #[test]
    fn same_seed_same_draw_different_seed_differs() {
        let lp = log_softmax(&[0.0; 1000]);
        let a = sample_reference(&lp, 1000, false, &[42]);
        assert_eq!(a, sample_reference(&lp, 1000, false, &[42]));
        let distinct: std::collections::HashSet<u32> = (0..50)
            .map(|s| sample_reference(&lp, 1000, false, &[s])[0].0)
            .collect();
        assert!(distinct.len() > 40, "{distinct:?}");
    }
}
