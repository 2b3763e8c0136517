//! The KV cache and the rollout's prefill and decode steps.

use jet_kernels::ops::attention::{attend_row, AttnShape};
use jet_kernels::GemmRole;

use super::forward::forward;
use super::layers::{head, run_layers, Attention};
use super::prepared::PreparedModel;

/// Per sequence, per layer: k and v after RoPE, `[len, kv*hd]` each, growing by
/// one row per decoded token. Finished sequences are simply not stepped again.
pub struct KvCache {
    kvd: usize,
    seqs: Vec<Vec<(Vec<f32>, Vec<f32>)>>,
}

impl KvCache {
    /// A cache of `slots` empty sequence slots.
    pub fn with_slots(model: &PreparedModel, slots: usize) -> KvCache {
        let kvd = model.cfg.num_key_value_heads * model.cfg.head_dim;
        let layers = model.cfg.num_hidden_layers;
        KvCache {
            kvd,
            seqs: (0..slots)
                .map(|_| vec![(Vec::new(), Vec::new()); layers])
                .collect(),
        }
    }
    /// Number of cached positions of sequence `seq`.
    pub fn len(&self, seq: usize) -> usize {
        self.seqs[seq]
            .first()
            .map_or(0, |(k, _)| k.len() / self.kvd)
    }
    pub fn num_seqs(&self) -> usize {
        self.seqs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
    /// Drop a sequence's cache (it finished) to bound memory; the slot may take
    /// another sequence ([`prefill_into`]).
    pub fn release(&mut self, seq: usize) {
        for (k, v) in &mut self.seqs[seq] {
            *k = Vec::new();
            *v = Vec::new();
        }
    }
}

/// Run the prompts through the model, fill the cache, and return the logits of
/// each prompt's last position `[B, vocab]`.
pub fn prefill(model: &PreparedModel, prompts: &[&[u32]], role: GemmRole) -> (KvCache, Vec<f32>) {
    let mut cache = KvCache::with_slots(model, prompts.len());
    let slots: Vec<usize> = (0..prompts.len()).collect();
    let logits = prefill_into(model, &mut cache, &slots, prompts, role);
    (cache, logits)
}

/// Run the prompts through the model into cache slots `slots` (replacing what
/// they held) and return the logits of each prompt's last position `[B, vocab]`.
pub fn prefill_into(
    model: &PreparedModel,
    cache: &mut KvCache,
    slots: &[usize],
    prompts: &[&[u32]],
    role: GemmRole,
) -> Vec<f32> {
    assert_eq!(slots.len(), prompts.len());
    let kvd = cache.kvd;
    let vocab = model.cfg.vocab_size;
    let out = forward(model, prompts, role, false, true);
    let mut last = Vec::with_capacity(prompts.len() * vocab);
    let mut start = 0;
    for (p, &slot) in prompts.iter().zip(slots) {
        let (a, b) = (start * kvd, (start + p.len()) * kvd);
        cache.seqs[slot] = out
            .kv
            .iter()
            .map(|(k, v)| (k[a..b].to_vec(), v[a..b].to_vec()))
            .collect();
        let r = start + p.len() - 1;
        last.extend_from_slice(&out.logits[r * vocab..(r + 1) * vocab]);
        start += p.len();
    }
    last
}

struct Decode<'a> {
    cache: &'a mut KvCache,
    seq_ids: &'a [usize],
    shape: AttnShape,
}

impl Attention for Decode<'_> {
    fn attend(
        &mut self,
        layer: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
    ) -> (Vec<f32>, Vec<Vec<f32>>) {
        let (qd, kvd) = (self.shape.n_heads * self.shape.head_dim, self.cache.kvd);
        let mut out = vec![0.0f32; q.len()];
        for (r, &s) in self.seq_ids.iter().enumerate() {
            let (kc, vc) = &mut self.cache.seqs[s][layer];
            kc.extend_from_slice(&k[r * kvd..(r + 1) * kvd]);
            vc.extend_from_slice(&v[r * kvd..(r + 1) * kvd]);
            let len = kc.len() / kvd;
            attend_row(
                &q[r * qd..(r + 1) * qd],
                kc,
                vc,
                len,
                self.shape,
                &mut out[r * qd..(r + 1) * qd],
                None,
            );
        }
        (out, Vec::new())
    }
}

/// Append one token to each sequence in `seq_ids` and return their next-token
/// logits `[B, vocab]`.
pub fn decode_step(
    model: &PreparedModel,
    cache: &mut KvCache,
    seq_ids: &[usize],
    tokens: &[u32],
    role: GemmRole,
) -> Vec<f32> {
    assert_eq!(seq_ids.len(), tokens.len());
    let positions: Vec<usize> = seq_ids.iter().map(|&s| cache.len(s)).collect();
    let shape = model.attn_shape();
    let mut attn = Decode {
        cache,
        seq_ids,
        shape,
    };
    let h = run_layers(model, tokens, &positions, role, &mut attn, None);
    head(model, &h, role, None).2
}
