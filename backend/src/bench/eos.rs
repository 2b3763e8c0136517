//! The bench's rollout decoder wrapper: counts forward passes and the KV rows each
//! generated token reads (for the decode floor), times the prefills (between two
//! synchronisations, so the decode phase's own rate can be told from the
//! rollout's), and ends each sequence at its length: gen_len, or with
//! `--eos-random` one drawn uniformly from 1..=gen_len (random weights do not
//! choose when to stop), as RL responses end at very different lengths. A
//! sequence the engine preempts (a bounded KV cache) keeps its drawn length and
//! count when it is prefilled again.

use std::collections::HashMap;
use std::time::Instant;

use jet_kernels::cuda::CudaError;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::rollout::engine::Decoder;
use crate::rollout::sampler::SamplingParams;

/// The token `EosAt` writes when a sequence reaches its drawn length.
pub const EOS: u32 = 0;

pub struct EosAt<'d> {
    pub inner: &'d mut dyn Decoder,
    /// Draws each sequence's length; None: sequences run to gen_len.
    lengths: Option<ChaCha8Rng>,
    gen_len: usize,
    /// Per slot: the drawn length, tokens so far, cache rows (prompt + tokens).
    target: Vec<usize>,
    count: Vec<usize>,
    rows: Vec<usize>,
    /// Slots of the pending rows, in the decoder's order, and whether a decode
    /// step (not a prefill) made each row's logits.
    pending: Vec<(usize, bool)>,
    /// Forward passes (decode steps and prefills): one weight read each.
    pub steps: usize,
    /// Sum over generated tokens of the cache rows their step read.
    pub kv_rows: usize,
    pub tokens: usize,
    /// Of those: the prefill passes, and the tokens decode steps made and the
    /// cache rows those steps read (a sequence's first token comes from its
    /// prefill's logits).
    pub prefills: usize,
    pub decode_tokens: usize,
    pub decode_kv_rows: usize,
    /// Seconds of the prefill calls, each timed from a synchronised stream to its
    /// end (0 without a `sync`).
    pub prefill_s: f64,
    /// Waits for the device's queued work (the bench's GPU); None: prefills are
    /// not timed.
    sync: Option<&'d dyn Fn() -> Result<(), CudaError>>,
    /// Per slot: the sequence so far (prompt and drawn tokens).
    seqs: Vec<Vec<u32>>,
    /// Preempted sequences by their content: their drawn length and count.
    /// (Equal sequences, e.g. a group's greedy samples, each keep their own.)
    waiting: HashMap<Vec<u32>, Vec<(usize, usize)>>,
    /// Sequences released before their drawn length (preempted).
    pub preempted: usize,
}

impl<'d> EosAt<'d> {
    pub fn new(inner: &'d mut dyn Decoder, gen_len: usize, random: Option<u64>) -> Self {
        EosAt {
            inner,
            lengths: random.map(ChaCha8Rng::seed_from_u64),
            gen_len,
            target: Vec::new(),
            count: Vec::new(),
            rows: Vec::new(),
            pending: Vec::new(),
            steps: 0,
            kv_rows: 0,
            tokens: 0,
            prefills: 0,
            decode_tokens: 0,
            decode_kv_rows: 0,
            prefill_s: 0.0,
            sync: None,
            seqs: Vec::new(),
            waiting: HashMap::new(),
            preempted: 0,
        }
    }

    /// Time each prefill call between `sync`s: the first waits for what is
    /// queued (a refill follows a decode step still on the stream), so that
    /// step's time stays out of the prefill's.
    pub fn timing_prefills(mut self, sync: &'d dyn Fn() -> Result<(), CudaError>) -> Self {
        self.sync = Some(sync);
        self
    }
}

impl Decoder for EosAt<'_> {
    fn reserve(&mut self, slots: usize, max_len: usize) -> Result<(), CudaError> {
        self.target = vec![0; slots];
        self.count = vec![0; slots];
        self.rows = vec![0; slots];
        self.seqs = vec![Vec::new(); slots];
        self.inner.reserve(slots, max_len)
    }
    fn prefill(&mut self, slots: &[usize], seqs: &[&[u32]]) -> Result<(), CudaError> {
        for (&s, q) in slots.iter().zip(seqs) {
            (self.target[s], self.count[s]) = match self.waiting.get_mut(*q).and_then(|v| v.pop()) {
                Some(kept) => kept,
                None => match self.lengths.as_mut() {
                    Some(r) => (r.random_range(1..=self.gen_len), 0),
                    None => (self.gen_len, 0),
                },
            };
            self.rows[s] = q.len();
            self.seqs[s] = q.to_vec();
            self.pending.push((s, false));
        }
        self.steps += 1;
        self.prefills += 1;
        let Some(sync) = self.sync else {
            return self.inner.prefill(slots, seqs);
        };
        sync()?;
        let t = Instant::now();
        self.inner.prefill(slots, seqs)?;
        sync()?;
        self.prefill_s += t.elapsed().as_secs_f64();
        Ok(())
    }
    fn sample(
        &mut self,
        p: &SamplingParams,
        rng: &mut dyn RngCore,
    ) -> Result<Vec<(u32, f32)>, CudaError> {
        let mut out = self.inner.sample(p, rng)?;
        for (o, (s, decoded)) in out.iter_mut().zip(std::mem::take(&mut self.pending)) {
            self.count[s] += 1;
            self.tokens += 1;
            self.kv_rows += self.rows[s];
            if decoded {
                self.decode_tokens += 1;
                self.decode_kv_rows += self.rows[s];
            }
            // Only the drawn length ends a sequence: a sampled EOS (1 in the
            // vocabulary's chance per token) would make flows differ in length.
            o.0 = match (self.count[s] >= self.target[s], o.0 == EOS) {
                (true, _) => EOS,
                (false, true) => EOS + 1,
                (false, false) => o.0,
            };
            self.seqs[s].push(o.0);
        }
        Ok(out)
    }
    fn ending(&mut self, rows: &[bool]) {
        // A row also ends where its drawn length says.
        let at_target = self
            .pending
            .iter()
            .map(|&(s, _)| self.count[s] + 1 >= self.target[s]);
        let rows: Vec<bool> = rows.iter().zip(at_target).map(|(&a, b)| a || b).collect();
        self.inner.ending(&rows)
    }
    fn release(&mut self, slot: usize) {
        if self.count[slot] < self.target[slot] {
            let seq = std::mem::take(&mut self.seqs[slot]);
            let kept = (self.target[slot], self.count[slot]);
            self.waiting.entry(seq).or_default().push(kept);
            self.preempted += 1;
        }
        self.inner.release(slot)
    }
    fn room(&mut self, seqs: &[&[u32]]) -> usize {
        self.inner.room(seqs)
    }
    fn shortfall(&mut self, slots: &[usize]) -> usize {
        self.inner.shortfall(slots)
    }
    fn step(&mut self, slots: &[usize], tokens: &[u32]) -> Result<(), CudaError> {
        for &s in slots {
            self.rows[s] += 1;
            self.pending.push((s, true));
        }
        self.steps += 1;
        self.inner.step(slots, tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Arch;
    use crate::rollout::engine::{generate_with, CpuDecoder, Finish, GenConfig};
    use crate::transformer::tests::{tiny_config, weights};
    use crate::transformer::PreparedModel;
    use jet_kernels::Flow;

    /// Lengths follow the draws, the counts match the samples, and a fixed length
    /// gives the closed form: gen_len forward passes (one prefill, gen_len - 1
    /// steps), b x the sum of the cache rows P .. P + gen_len - 1.
    #[test]
    fn counts_and_random_lengths() {
        let cfg = tiny_config(Arch::Qwen3, false);
        let w = weights(&cfg, 2);
        let model = PreparedModel::new(&cfg, &w, Flow::Bf16);
        let prompts: Vec<Vec<u32>> = (0..6).map(|i| vec![1 + i, 2, 3]).collect();
        let gen = |max_batch| GenConfig {
            max_new_tokens: 10,
            sampling: SamplingParams::default(),
            stop_token_ids: vec![EOS],
            stop_strings: vec![],
            max_batch,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        // fixed length, all at once: EOS never drawn by the wrapper before 10
        let mut cpu = CpuDecoder::new(&model);
        let mut d = EosAt::new(&mut cpu, 10, None);
        let s = generate_with(
            &mut d,
            64,
            &prompts,
            1,
            &gen(0),
            &|_| String::new(),
            &mut rng,
        )
        .unwrap();
        let n: usize = s.iter().map(|x| x.tokens.len()).sum();
        assert_eq!(d.tokens, n);
        if s.iter().all(|x| x.tokens.len() == 10) {
            assert_eq!(d.steps, 10);
            assert_eq!(d.kv_rows, 6 * (3..13).sum::<usize>());
            // one prefill; the decode steps made tokens 2..=10 of each
            assert_eq!((d.prefills, d.decode_tokens), (1, 6 * 9));
            assert_eq!(d.decode_kv_rows, 6 * (4..13).sum::<usize>());
        }
        assert_eq!(d.prefill_s, 0.0, "untimed without a sync");
        // random lengths, 2 at a time, prefills timed
        let mut cpu = CpuDecoder::new(&model);
        let synced = std::cell::Cell::new(0);
        let sync = || {
            synced.set(synced.get() + 1);
            Ok(())
        };
        let mut d = EosAt::new(&mut cpu, 10, Some(5)).timing_prefills(&sync);
        let s = generate_with(
            &mut d,
            64,
            &prompts,
            2,
            &gen(2),
            &|_| String::new(),
            &mut rng,
        )
        .unwrap();
        let lens: Vec<usize> = s.iter().map(|x| x.tokens.len()).collect();
        assert!(lens.iter().all(|&l| (1..=10).contains(&l)), "{lens:?}");
        assert!(lens.iter().collect::<std::collections::HashSet<_>>().len() > 2);
        assert!(s
            .iter()
            .all(|x| x.finish == Finish::StopToken || x.tokens.len() == 10));
        assert_eq!(d.tokens, lens.iter().sum::<usize>());
        assert!(
            d.steps >= lens.iter().sum::<usize>() / 2,
            "two live at most"
        );
        // every sample's first token came from a prefill, the rest from steps
        assert_eq!(d.prefills * 2, synced.get());
        assert_eq!(d.decode_tokens, d.tokens - s.len());
        assert!(d.prefill_s > 0.0 && d.decode_kv_rows < d.kv_rows);
    }
}
