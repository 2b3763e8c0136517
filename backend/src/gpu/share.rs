//! A GRPO group's prompt through the training pass once.
//!
//! The G samples of a prompt begin with the same prompt tokens, and every op of
//! the forward but the attention works row by row (with batch-invariant GEMMs, the
//! BF16 and FP8 flows' default), so a prompt's rows are the same bits in each
//! sample's sequence. The sequences of
//! a micro-batch that share a prompt keep one copy of its rows, all but its last
//! token (the *compact* layout: the GEMMs, norms, RoPE and SwiGLU run over it).
//! The attention runs on every sequence whole (the *expanded* layout): its q, k, v
//! rows are copied out of the compact rows and its output copied back from each
//! row's first copy, so every row's attention output has the bits of the unshared
//! forward and rollout == training stays exact. In the backward a shared row's dq
//! is its first copy's (the other copies' outputs are not read, so their dO is
//! zero and so is their dq), its dk and dv the sum of its copies' in sequence order.
//! The prompt's last token stays with each sequence: its row scores the first
//! response token.
//!
//! A prompt of P tokens shared by G sequences of P + R tokens saves (G - 1)(P - 1)
//! of the G (P + R) rows of everything but the attention.

use std::collections::HashMap;

use cudarc::driver::{CudaSlice, DeviceRepr};
use jet_kernels::cuda::act::ActRef;
use jet_kernels::cuda::flash::{
    flash_backward_kernels, flash_backward_prep, with_dv, BwdKernel, Dout, FlashPlan, FlashSaved,
};
use jet_kernels::cuda::row_map::{RowMap, RowSums};
use jet_kernels::cuda::{Gpu, Result};
use jet_kernels::ops::attention::AttnShape;

use crate::trainer::pass::{scored_rows_at, TrainSeq};

/// The compact layout of a micro-batch whose sequences share prompts, and the maps
/// between it and the expanded one (each sequence whole, in order).
#[derive(Debug)]
pub struct PromptShare {
    /// The compact rows' tokens and positions.
    pub tokens: Vec<u32>,
    pub positions: Vec<usize>,
    /// Each sequence's length: the expanded layout packs them whole, in order.
    pub seq_lens: Vec<usize>,
    /// Expanded row -> the compact row it copies.
    pub expand: Vec<usize>,
    /// Compact row -> its expanded copies, in order (the first one first).
    pub copies: Vec<Vec<usize>>,
    /// Per sequence: the first position it holds rows of its own, and the compact
    /// row of that position.
    own: Vec<(usize, usize)>,
}

impl PromptShare {
    /// The compact layout of `seqs`, or None where no two of them share a prompt of
    /// two or more tokens (nothing to save).
    pub fn plan(seqs: &[TrainSeq]) -> Option<PromptShare> {
        fn prompt(s: &TrainSeq) -> &[u32] {
            &s.tokens[..s.prompt_len.min(s.tokens.len())]
        }
        let mut count: HashMap<&[u32], usize> = HashMap::new();
        for s in seqs.iter().filter(|s| s.prompt_len >= 2) {
            *count.entry(prompt(s)).or_default() += 1;
        }
        let shared = |s: &TrainSeq| s.prompt_len >= 2 && count.get(prompt(s)) > Some(&1);
        if !seqs.iter().any(shared) {
            return None;
        }
        let mut p = PromptShare {
            tokens: Vec::new(),
            positions: Vec::new(),
            seq_lens: Vec::with_capacity(seqs.len()),
            expand: Vec::new(),
            copies: Vec::new(),
            own: Vec::with_capacity(seqs.len()),
        };
        // The compact row of each shared prompt's first row.
        let mut prefix: HashMap<&[u32], usize> = HashMap::new();
        for s in seqs {
            let len = s.tokens.len();
            let from = match shared(s) {
                true => s.prompt_len - 1,
                false => 0,
            };
            if from > 0 {
                let start = *prefix.entry(prompt(s)).or_insert_with(|| {
                    let start = p.tokens.len();
                    p.tokens.extend_from_slice(&s.tokens[..from]);
                    p.positions.extend(0..from);
                    start
                });
                p.expand.extend(start..start + from);
            }
            let start = p.tokens.len();
            p.own.push((from, start));
            p.tokens.extend_from_slice(&s.tokens[from..]);
            p.positions.extend(from..len);
            p.expand.extend(start..start + len - from);
            p.seq_lens.push(len);
        }
        p.copies = vec![Vec::new(); p.tokens.len()];
        for (e, &c) in p.expand.iter().enumerate() {
            p.copies[c].push(e);
        }
        Some(p)
    }

    /// Rows of the compact layout.
    pub fn rows(&self) -> usize {
        self.tokens.len()
    }

    /// The compact rows that score a response token (sequence after sequence, as
    /// `trainer::pass::scored_rows` lists them) and those tokens: all of them rows
    /// of their own sequence, since its rows start at the prompt's last token.
    pub fn scored_rows(&self, seqs: &[TrainSeq]) -> (Vec<usize>, Vec<u32>) {
        scored_rows_at(seqs, &self.own)
    }
}

/// [`PromptShare`]'s maps on the device, uploaded once for every layer.
pub struct SharedRows {
    /// Expanded <- compact (the attention's inputs).
    expand: RowMap,
    /// Compact <- each row's first copy (the attention's output, dq).
    first: RowMap,
    /// Expanded <- compact at each row's first copy, zero at the others (dO).
    dout: RowMap,
    /// Compact <- the sum of each row's copies (dk, dv).
    sums: RowSums,
}

impl SharedRows {
    pub fn upload(gpu: &Gpu, p: &PromptShare) -> Result<SharedRows> {
        let (c, e) = (p.rows(), p.expand.len());
        let expand: Vec<Option<usize>> = p.expand.iter().map(|&r| Some(r)).collect();
        let first: Vec<Option<usize>> = p.copies.iter().map(|x| Some(x[0])).collect();
        let dout: Vec<Option<usize>> = (0..e)
            .map(|r| Some(p.expand[r]).filter(|&c| p.copies[c][0] == r))
            .collect();
        Ok(SharedRows {
            expand: RowMap::new(gpu, &expand, c)?,
            first: RowMap::new(gpu, &first, e)?,
            dout: RowMap::new(gpu, &dout, c)?,
            sums: RowSums::new(gpu, &p.copies, e)?,
        })
    }

    /// Rows of the compact layout.
    pub fn rows(&self) -> usize {
        self.first.len()
    }

    /// Compact rows `x [rows, cols]` copied out to the expanded layout.
    pub fn expand<T: DeviceRepr>(
        &self,
        gpu: &Gpu,
        x: &CudaSlice<T>,
        cols: usize,
    ) -> Result<CudaSlice<T>> {
        self.expand.gather(gpu, x, cols)
    }

    /// The attention's q, k, v (`[rows, nh * hd]`, `[rows, nkv * hd]` twice)
    /// copied out to the expanded layout.
    pub fn expand_qkv<T: DeviceRepr>(
        &self,
        gpu: &Gpu,
        shape: AttnShape,
        [q, k, v]: [&CudaSlice<T>; 3],
    ) -> Result<[CudaSlice<T>; 3]> {
        let (qd, kvd) = (
            shape.n_heads * shape.head_dim,
            shape.n_kv_heads * shape.head_dim,
        );
        Ok([
            self.expand(gpu, q, qd)?,
            self.expand(gpu, k, kvd)?,
            self.expand(gpu, v, kvd)?,
        ])
    }

    /// Expanded rows `x` brought back: each compact row its first copy's.
    pub fn compact<T: DeviceRepr>(
        &self,
        gpu: &Gpu,
        x: &CudaSlice<T>,
        cols: usize,
    ) -> Result<CudaSlice<T>> {
        self.first.gather(gpu, x, cols)
    }

    /// The attention's backward for compact `dout` and output `out`, on the
    /// expanded layout of `plan` and `saved`: dO's BF16 values and each row's delta
    /// made on the compact rows (`flash_backward_prep`: row by row, so the bits
    /// the expanded rows would give) and copied to each row's first copy, zeros at
    /// the others (a zero dO row has a zero delta and gives zero dq); then the
    /// kernels on the expanded layout, dq each row's first copy's, dk and dv the
    /// sums of the copies' (dv rounded to BF16 values when `round`, as the kernel
    /// rounds it).
    #[allow(clippy::type_complexity)]
    pub fn backward(
        &self,
        gpu: &Gpu,
        plan: &FlashPlan,
        (dout, out): (Dout, ActRef),
        saved: &FlashSaved,
        shape: AttnShape,
        round: bool,
    ) -> Result<(CudaSlice<f32>, CudaSlice<f32>, CudaSlice<f32>)> {
        let (nh, hd, nkv) = (shape.n_heads, shape.head_dim, shape.n_kv_heads);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let prep = flash_backward_prep(gpu, (dout, out), self.rows(), shape)?;
        let dout16 = self.dout.gather(gpu, prep.dout16(dout)?, qd)?;
        let delta = self.dout.gather(gpu, &prep.delta, nh)?;
        let opts = (BwdKernel::default_for(gpu), round, None);
        let grads = flash_backward_kernels(gpu, plan, (&dout16, &delta), saved, shape, opts)?;
        let (dq, dk, dv) = with_dv(grads)?;
        Ok((
            self.first.gather(gpu, &dq, qd)?,
            self.sums.sum(gpu, &dk, kvd, false)?,
            self.sums.sum(gpu, &dv, kvd, round)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(tokens: &[u32], prompt_len: usize) -> TrainSeq {
        TrainSeq {
            tokens: tokens.to_vec(),
            prompt_len,
        }
    }

    #[test]
    fn a_shared_prompt_is_kept_once_and_every_sequence_expands_whole() {
        // Two samples of prompt [1 2 3], one of [7 8], one more of [1 2 3].
        let seqs = [
            seq(&[1, 2, 3, 10, 11], 3),
            seq(&[1, 2, 3, 12], 3),
            seq(&[7, 8, 13], 2),
            seq(&[1, 2, 3, 14, 15, 16], 3),
        ];
        let p = PromptShare::plan(&seqs).expect("shared");
        // [1 2] once, then each sequence from its prompt's last token.
        assert_eq!(p.tokens, [1, 2, 3, 10, 11, 3, 12, 7, 8, 13, 3, 14, 15, 16]);
        assert_eq!(p.positions, [0, 1, 2, 3, 4, 2, 3, 0, 1, 2, 2, 3, 4, 5]);
        assert_eq!(p.seq_lens, [5, 4, 3, 6]);
        // Expanding gives back every sequence's tokens and positions.
        let mut start = 0;
        for s in &seqs {
            let rows = &p.expand[start..start + s.tokens.len()];
            let toks: Vec<u32> = rows.iter().map(|&r| p.tokens[r]).collect();
            let pos: Vec<usize> = rows.iter().map(|&r| p.positions[r]).collect();
            assert_eq!(toks, s.tokens);
            assert_eq!(pos, (0..s.tokens.len()).collect::<Vec<_>>());
            start += s.tokens.len();
        }
        assert_eq!(start, p.expand.len());
        // The shared rows have three copies, in order; the others one.
        assert_eq!(p.copies[0], [0, 5, 12]);
        assert_eq!(p.copies[1], [1, 6, 13]);
        assert!(p.copies[2..].iter().all(|c| c.len() == 1));
        // Scored rows: the same tokens, at compact rows of the same positions.
        let (rows, targets) = p.scored_rows(&seqs);
        let (_, want) = crate::trainer::pass::scored_rows(&seqs);
        assert_eq!(targets, want);
        let mut k = 0;
        for s in &seqs {
            for t in 0..s.response_len() {
                assert_eq!(p.positions[rows[k]], s.prompt_len - 1 + t);
                assert_eq!(p.tokens[rows[k]], s.tokens[s.prompt_len - 1 + t]);
                k += 1;
            }
        }
        let mut distinct = rows.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), rows.len());
    }

    #[test]
    fn random_batches_expand_to_their_sequences_and_save_the_shared_rows() {
        // Groups of 1 to 4 samples of prompts of 1 to 9 tokens (some prompts twice,
        // in separate groups), interleaved: every expanded sequence is the sequence,
        // every compact row is read by its copies, and the rows saved are
        // (copies - 1) for each shared row.
        let mut s = 7u64;
        let mut rnd = |n: u64| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) % n
        };
        for _ in 0..200 {
            let prompts: Vec<Vec<u32>> = (0..1 + rnd(4))
                .map(|_| (0..1 + rnd(9)).map(|_| rnd(3) as u32).collect())
                .collect();
            let seqs: Vec<TrainSeq> = (0..1 + rnd(10))
                .map(|_| {
                    let p = &prompts[rnd(prompts.len() as u64) as usize];
                    let resp: Vec<u32> = (0..rnd(6)).map(|_| 10 + rnd(5) as u32).collect();
                    seq(&[p.as_slice(), &resp].concat(), p.len())
                })
                .collect();
            let Some(p) = PromptShare::plan(&seqs) else {
                // Nothing shared: no two sequences with one prompt of 2+ tokens.
                for (i, a) in seqs.iter().enumerate() {
                    for b in &seqs[i + 1..] {
                        let same = a.tokens[..a.prompt_len] == b.tokens[..b.prompt_len];
                        assert!(!(same && a.prompt_len >= 2));
                    }
                }
                continue;
            };
            let mut start = 0;
            for sq in &seqs {
                let rows = &p.expand[start..start + sq.tokens.len()];
                let toks: Vec<u32> = rows.iter().map(|&r| p.tokens[r]).collect();
                assert_eq!(toks, sq.tokens);
                assert!(rows.iter().enumerate().all(|(i, &r)| p.positions[r] == i));
                start += sq.tokens.len();
            }
            assert_eq!(start, p.expand.len());
            assert!(p.copies.iter().all(|c| !c.is_empty()));
            let saved: usize = p.copies.iter().map(|c| c.len() - 1).sum();
            assert_eq!(p.rows() + saved, p.expand.len());
            let (rows, targets) = p.scored_rows(&seqs);
            assert_eq!(targets, crate::trainer::pass::scored_rows(&seqs).1);
            // Scored rows are rows no other sequence reads.
            assert!(rows.iter().all(|&r| p.copies[r].len() == 1));
        }
    }

    #[test]
    fn nothing_shared_means_no_plan() {
        // Distinct prompts, and one-token prompts (no row to share before the last).
        assert!(PromptShare::plan(&[seq(&[1, 2, 3], 2), seq(&[1, 3, 3], 2)]).is_none());
        assert!(PromptShare::plan(&[seq(&[1, 2], 1), seq(&[1, 3], 1)]).is_none());
        assert!(PromptShare::plan(&[]).is_none());
    }
}
