//! Seeded train/held-out split for generated tasks.
//!
//! The held-out problems are the first `n` distinct prompts of their own seeded stream.
//! Training problem `i` comes from a stream seeded by `(seed, i)`; a candidate whose
//! prompt is held out is skipped and the next draw of the same stream is taken, so the
//! i-th training problem is a pure function of `(seed, i)` and never a held-out prompt.

use std::collections::HashSet;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::error::TaskError;
use super::problem::Problem;

/// What a generator produces; the split adds the id.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Generated {
    pub prompt: String,
    pub answer: String,
    pub demonstration: String,
}

const HELDOUT_STREAM: u64 = 0x4845_4c44; // "HELD"
const TRAIN_STREAM: u64 = 0x5452_4e21; // "TRN!"

/// Bound on draws of one training problem. A config check keeps the held-out share of
/// the prompt distribution at or below one half, so hitting it has probability < 2^-4096.
const TRAIN_ATTEMPTS: usize = 4096;

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A well-mixed hash of (seed, stream, index).
pub(crate) fn mix(seed: u64, stream: u64, index: u64) -> u64 {
    splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index)
}

/// The RNG of one stream, seeded by `mix(seed, stream, index)`.
pub(crate) fn stream_rng(seed: u64, stream: u64, index: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(mix(seed, stream, index))
}

/// A pseudo-random permutation of `0..n` keyed by `key`: `permute(i, n, key)` for
/// `i < n` visits every value in `0..n` once. A 4-round Feistel network on the next
/// even power of two, cycle-walked into range (fewer than 4 steps expected).
pub(crate) fn permute(index: u64, n: u64, key: u64) -> u64 {
    if n <= 1 {
        return 0;
    }
    let index = index % n;
    let bits = (64 - (n - 1).leading_zeros()).max(2);
    let half = bits.div_ceil(2);
    let mask = (1u64 << half) - 1;
    let mut x = index;
    loop {
        let (mut l, mut r) = (x >> half, x & mask);
        for round in 0..4u64 {
            let f = splitmix64(r ^ splitmix64(key ^ round)) & mask;
            (l, r) = (r, l ^ f);
        }
        x = (l << half) | r;
        if x < n {
            return x;
        }
    }
}

/// Held-out problems of a generated task and the set of their prompts.
#[derive(Debug)]
pub(crate) struct SeededSplit {
    seed: u64,
    prefix: &'static str,
    heldout: Vec<Problem>,
    heldout_prompts: HashSet<String>,
}

impl SeededSplit {
    /// Draws `n` distinct held-out problems from `gen`.
    pub(crate) fn new(
        prefix: &'static str,
        seed: u64,
        n: usize,
        gen: impl Fn(&mut ChaCha8Rng) -> Generated,
    ) -> Result<Self, TaskError> {
        let mut rng = stream_rng(seed, HELDOUT_STREAM, 0);
        let mut heldout = Vec::with_capacity(n);
        let mut heldout_prompts = HashSet::with_capacity(n);
        let max_attempts = n.saturating_mul(64).saturating_add(10_000);
        let mut attempts = 0;
        while heldout.len() < n {
            if attempts == max_attempts {
                return Err(TaskError::HeldoutExhausted {
                    task: prefix,
                    got: heldout.len(),
                    wanted: n,
                });
            }
            attempts += 1;
            let g = gen(&mut rng);
            if heldout_prompts.insert(g.prompt.clone()) {
                heldout.push(Problem {
                    id: format!("{prefix}-heldout-{}", heldout.len()),
                    prompt: g.prompt,
                    answer: g.answer,
                    demonstration: g.demonstration,
                });
            }
        }
        Ok(SeededSplit {
            seed,
            prefix,
            heldout,
            heldout_prompts,
        })
    }

    pub(crate) fn heldout_size(&self) -> usize {
        self.heldout.len()
    }

    /// The held-out problem `index` (wrapping); a placeholder if there are none.
    pub(crate) fn heldout(&self, index: u64) -> Problem {
        if self.heldout.is_empty() {
            return Problem {
                id: format!("{}-heldout-none", self.prefix),
                prompt: String::new(),
                answer: String::new(),
                demonstration: String::new(),
            };
        }
        self.heldout[(index % self.heldout.len() as u64) as usize].clone()
    }

    /// The training problem `index`.
    pub(crate) fn train(&self, index: u64, gen: impl Fn(&mut ChaCha8Rng) -> Generated) -> Problem {
        let mut rng = stream_rng(self.seed, TRAIN_STREAM, index);
        let mut g = gen(&mut rng);
        let mut attempts = 1;
        while self.heldout_prompts.contains(&g.prompt) && attempts < TRAIN_ATTEMPTS {
            g = gen(&mut rng);
            attempts += 1;
        }
        Problem {
            id: format!("{}-train-{index}", self.prefix),
            prompt: g.prompt,
            answer: g.answer,
            demonstration: g.demonstration,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    fn gen(rng: &mut ChaCha8Rng) -> Generated {
        let a: u32 = rng.random_range(0..40);
        Generated {
            prompt: a.to_string(),
            answer: a.to_string(),
            demonstration: a.to_string(),
        }
    }

    #[test]
    fn train_avoids_heldout_and_is_deterministic() {
        let s = SeededSplit::new("t", 3, 20, gen).unwrap();
        assert_eq!(s.heldout_size(), 20);
        let held: HashSet<String> = (0..20).map(|i| s.heldout(i).prompt).collect();
        assert_eq!(held.len(), 20);
        for i in 0..2000 {
            let p = s.train(i, gen);
            assert!(!held.contains(&p.prompt));
            assert_eq!(p, s.train(i, gen));
        }
        let s2 = SeededSplit::new("t", 3, 20, gen).unwrap();
        assert_eq!(s.heldout, s2.heldout);
    }

    #[test]
    fn permute_is_a_bijection() {
        for n in [1u64, 2, 3, 5, 16, 17, 100, 1000, 4097] {
            for key in [0u64, 1, 99] {
                let mut seen = vec![false; n as usize];
                for i in 0..n {
                    let j = permute(i, n, key);
                    assert!(j < n && !seen[j as usize], "n={n} key={key} i={i}");
                    seen[j as usize] = true;
                }
            }
        }
        let a: Vec<u64> = (0..100).map(|i| permute(i, 100, 1)).collect();
        let b: Vec<u64> = (0..100).map(|i| permute(i, 100, 2)).collect();
        assert_ne!(a, b);
        assert_ne!(a, (0..100).collect::<Vec<u64>>());
    }

    #[test]
    fn too_many_heldout_is_an_error() {
        let e = SeededSplit::new("t", 3, 41, gen).unwrap_err();
        assert!(matches!(
            e,
            TaskError::HeldoutExhausted {
                got: 40,
                wanted: 41,
                ..
            }
        ));
    }
}
