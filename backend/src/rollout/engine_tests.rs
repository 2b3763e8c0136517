//! Continuous batching: a sample's tokens and logprobs do not depend on the
//! batch it was decoded in, slots are reused only once free, and never more than
//! `max_batch` sequences are live.

use std::collections::HashSet;

use jet_kernels::cuda::CudaError;
use jet_kernels::Flow;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use jet_kernels::cuda::flash::PAGE_ROWS;

use super::engine::{generate_with, CpuDecoder, Decoder, Finish, GenConfig, Sample};
use super::sampler::SamplingParams;
use crate::gpu::kv_pages::KvPages;
use crate::model::Arch;
use crate::transformer::tests::{tiny_config, weights};
use crate::transformer::PreparedModel;

fn gen(max_batch: usize, temperature: f64) -> GenConfig {
    GenConfig {
        max_new_tokens: 12,
        sampling: SamplingParams {
            temperature,
            top_p: 1.0,
            top_k: 0,
        },
        // Several stop tokens, so that responses end at different lengths.
        stop_token_ids: vec![0, 5, 9, 13, 21],
        stop_strings: vec![],
        max_batch,
    }
}

fn prompts() -> Vec<Vec<u32>> {
    (0..7u32)
        .map(|i| {
            (0..2 + i as usize % 4)
                .map(|j| 1 + (i * 7 + j as u32) % 30)
                .collect()
        })
        .collect()
}

fn bits(s: &[Sample]) -> Vec<(usize, Vec<u32>, Vec<u32>, Finish)> {
    s.iter()
        .map(|x| {
            let lp = x.logprobs.iter().map(|v| v.to_bits()).collect();
            (x.prompt_index, x.tokens.clone(), lp, x.finish)
        })
        .collect()
}

#[test]
fn greedy_samples_do_not_depend_on_the_batch() {
    let cfg = tiny_config(Arch::Qwen3, false);
    let w = weights(&cfg, 5);
    let ps = prompts();
    for flow in [Flow::F32, Flow::Fp8] {
        let model = PreparedModel::new(&cfg, &w, flow);
        let run = |max_batch: usize| {
            let mut rng = ChaCha8Rng::seed_from_u64(1);
            let mut dec = CpuDecoder::new(&model);
            let out = generate_with(
                &mut dec,
                64,
                &ps,
                3,
                &gen(max_batch, 0.0),
                &|_| String::new(),
                &mut rng,
            );
            bits(&out.unwrap())
        };
        let all = run(0);
        let lens: HashSet<usize> = all.iter().map(|s| s.1.len()).collect();
        assert!(
            lens.len() > 2,
            "responses should end at different lengths: {lens:?}"
        );
        for b in [1, 3, 5, 21, 100] {
            assert_eq!(run(b), all, "{flow}: max_batch {b} changed a greedy sample");
        }
    }
}

#[test]
fn sampling_with_a_bounded_batch_is_reproducible() {
    let cfg = tiny_config(Arch::Llama, true);
    let w = weights(&cfg, 6);
    let model = PreparedModel::new(&cfg, &w, Flow::Bf16);
    let ps = prompts();
    let run = |seed: u64| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut dec = CpuDecoder::new(&model);
        bits(
            &generate_with(
                &mut dec,
                64,
                &ps,
                4,
                &gen(3, 1.0),
                &|_| String::new(),
                &mut rng,
            )
            .unwrap(),
        )
    };
    let a = run(11);
    assert_eq!(a, run(11));
    assert_ne!(a, run(12));
    assert_eq!(a.len(), ps.len() * 4);
    for (i, s) in a.iter().enumerate() {
        assert_eq!(s.0, i / 4, "samples stay in prompt order");
        assert!(!s.1.is_empty() && s.1.len() <= 12);
    }
}

/// A decoder that checks the engine's use of slots: prefill only into free
/// slots, step and release only live ones, never more live than reserved.
struct Checker {
    slots: usize,
    live: Vec<Option<u32>>,
    pending: Vec<usize>,
    most_live: usize,
    prefilled: usize,
    prefills: usize,
    /// The slots `ending` flagged for the coming draw, and how many so far.
    ending: Vec<usize>,
    flagged: usize,
}

impl Decoder for Checker {
    fn reserve(&mut self, slots: usize, _max_len: usize) -> Result<(), CudaError> {
        assert!(self.live.is_empty(), "reserve called twice");
        self.slots = slots;
        self.live = vec![None; slots];
        Ok(())
    }
    fn prefill(&mut self, slots: &[usize], seqs: &[&[u32]]) -> Result<(), CudaError> {
        for (&s, q) in slots.iter().zip(seqs) {
            assert!(
                s < self.slots && self.live[s].is_none(),
                "prefill into busy slot {s}"
            );
            self.live[s] = Some(q.iter().sum());
            self.pending.push(s);
        }
        self.prefilled += seqs.len();
        self.prefills += 1;
        self.most_live = self.most_live.max(self.live.iter().flatten().count());
        Ok(())
    }
    fn sample(
        &mut self,
        _: &SamplingParams,
        _: &mut dyn RngCore,
    ) -> Result<Vec<(u32, f32)>, CudaError> {
        // A slot's state decides its token: it ends (token 0) after a few steps.
        Ok(std::mem::take(&mut self.pending)
            .into_iter()
            .map(|s| {
                let v = self.live[s].unwrap();
                (!v.is_multiple_of(4) as u32 * (1 + v % 7), -0.5)
            })
            .collect())
    }
    fn ending(&mut self, rows: &[bool]) {
        assert_eq!(rows.len(), self.pending.len(), "one flag a pending row");
        self.ending = self
            .pending
            .iter()
            .zip(rows)
            .filter(|x| *x.1)
            .map(|x| *x.0)
            .collect();
        self.flagged += self.ending.len();
    }
    fn release(&mut self, slot: usize) {
        assert!(self.live[slot].is_some(), "release of free slot {slot}");
        self.live[slot] = None;
    }
    fn step(&mut self, slots: &[usize], tokens: &[u32]) -> Result<(), CudaError> {
        for (&s, &t) in slots.iter().zip(tokens) {
            assert!(
                !self.ending.contains(&s),
                "slot {s} flagged as ending was stepped"
            );
            let v = self.live[s].expect("step of a free slot");
            self.live[s] = Some(v + t + 1);
            self.pending.push(s);
        }
        Ok(())
    }
}

#[test]
fn slots_are_bounded_and_reused_only_when_free() {
    let ps = prompts();
    for b in [1, 2, 4, 16, 0] {
        let mut dec = Checker {
            slots: 0,
            live: vec![],
            pending: vec![],
            most_live: 0,
            prefilled: 0,
            prefills: 0,
            ending: vec![],
            flagged: 0,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let cfg = GenConfig {
            stop_token_ids: vec![0],
            max_new_tokens: 6,
            ..gen(b, 1.0)
        };
        let out = generate_with(&mut dec, 64, &ps, 3, &cfg, &|_| String::new(), &mut rng).unwrap();
        let cap = if b == 0 { ps.len() * 3 } else { b };
        assert_eq!(dec.slots, cap);
        assert_eq!(dec.most_live, cap, "max_batch {b}: the batch fills up");
        assert_eq!(dec.prefilled, ps.len() * 3, "every sample is admitted once");
        assert!(
            dec.live.iter().all(|s| s.is_none()),
            "every slot released at the end"
        );
        assert!(out.iter().all(|s| !s.tokens.is_empty()));
        // `ending` flags exactly each sample's draw at its length limit (it may
        // also draw the stop token there).
        let at_limit =
            |s: &Sample| s.tokens.len() == 6 || ps[s.prompt_index].len() + s.tokens.len() >= 64;
        let limited = out.iter().filter(|s| at_limit(s)).count();
        assert!(limited > 0, "some samples should reach the length limit");
        assert_eq!(dec.flagged, limited, "max_batch {b}: flagged draws");
    }
}

/// The CPU decoder under a page budget, as the GPU's paged cache keeps it
/// (`KvPages`: pages taken as sequences grow, admissions and steps bounded by
/// the free pages): what the engine's admission and preemption see.
struct Paged<'m, 'w> {
    inner: CpuDecoder<'m, 'w>,
    pages: usize,
    pool: Option<KvPages>,
    lens: Vec<usize>,
    preempted: usize,
    released: usize,
    most_in_use: usize,
}

impl Decoder for Paged<'_, '_> {
    fn reserve(&mut self, slots: usize, max_len: usize) -> Result<(), CudaError> {
        self.pool = Some(KvPages::new(slots, max_len, self.pages)?);
        self.lens = vec![0; slots];
        self.inner.reserve(slots, max_len)
    }
    fn prefill(&mut self, slots: &[usize], seqs: &[&[u32]]) -> Result<(), CudaError> {
        let pool = self.pool.as_mut().unwrap();
        for (&s, q) in slots.iter().zip(seqs) {
            assert_eq!(self.lens[s], 0, "prefill into busy slot {s}");
            for pos in (0..q.len()).step_by(PAGE_ROWS) {
                pool.grow(s, pos)?;
            }
            self.lens[s] = q.len();
        }
        self.most_in_use = self.most_in_use.max(pool.in_use());
        self.inner.prefill(slots, seqs)
    }
    fn sample(
        &mut self,
        p: &SamplingParams,
        rng: &mut dyn RngCore,
    ) -> Result<Vec<(u32, f32)>, CudaError> {
        self.inner.sample(p, rng)
    }
    fn release(&mut self, slot: usize) {
        self.pool.as_mut().unwrap().release(slot);
        self.lens[slot] = 0;
        self.released += 1;
        self.inner.release(slot)
    }
    fn room(&mut self, seqs: &[&[u32]]) -> usize {
        let live: Vec<(usize, usize)> = (0..self.lens.len())
            .filter(|&s| self.lens[s] > 0)
            .map(|s| (s, self.lens[s]))
            .collect();
        self.pool.as_ref().unwrap().admissible(&live, seqs)
    }
    fn shortfall(&mut self, slots: &[usize]) -> usize {
        let pool = self.pool.as_ref().unwrap();
        let short = pool.shortfall(slots.iter().map(|&s| (s, self.lens[s])));
        self.preempted += usize::from(short > 0);
        short
    }
    fn step(&mut self, slots: &[usize], tokens: &[u32]) -> Result<(), CudaError> {
        let pool = self.pool.as_mut().unwrap();
        for &s in slots {
            pool.grow(s, self.lens[s])?;
            self.lens[s] += 1;
        }
        self.most_in_use = self.most_in_use.max(pool.in_use());
        self.inner.step(slots, tokens)
    }
}

/// With a cache too small for the batch at full length, sequences wait for
/// room and the youngest are preempted and prefilled again later; every greedy
/// sample keeps its tokens and logprobs bit for bit, and the pool is never
/// overdrawn.
#[test]
fn preempted_greedy_samples_keep_their_bits() {
    let mut cfg = tiny_config(Arch::Qwen3, false);
    cfg.max_position_embeddings = 256;
    let w = weights(&cfg, 5);
    let ps = prompts();
    let gen = GenConfig {
        max_new_tokens: 150,
        stop_token_ids: vec![],
        ..gen(6, 0.0)
    };
    for flow in [Flow::F32, Flow::Fp8] {
        let model = PreparedModel::new(&cfg, &w, flow);
        let run = |pages: Option<usize>| {
            let mut rng = ChaCha8Rng::seed_from_u64(3);
            let mut plain = CpuDecoder::new(&model);
            let mut paged = pages.map(|pages| Paged {
                inner: CpuDecoder::new(&model),
                pages,
                pool: None,
                lens: vec![],
                preempted: 0,
                released: 0,
                most_in_use: 0,
            });
            let dec: &mut dyn Decoder = match paged.as_mut() {
                Some(p) => p,
                None => &mut plain,
            };
            let out = generate_with(dec, 256, &ps, 2, &gen, &|_| String::new(), &mut rng);
            (
                bits(&out.unwrap()),
                paged.map(|p| (p.preempted, p.released, p.most_in_use)),
            )
        };
        let (all, _) = run(None);
        assert!(all.iter().all(|s| s.1.len() == 150));
        // 6 sequences of up to 155 rows take 3 pages each at full length (18);
        // 8 pages hold two at full length and the scratch page.
        for pages in [8, 11] {
            let (got, stats) = run(Some(pages));
            let (preempted, released, most) = stats.unwrap();
            assert!(preempted > 0, "{flow}: {pages} pages should preempt");
            assert_eq!(released, ps.len() * 2 + preempted, "{flow}: releases");
            assert!(most < pages, "{flow}: {most} pages in use of {pages}");
            assert_eq!(got, all, "{flow}: a preempted greedy sample changed");
        }
    }
}
