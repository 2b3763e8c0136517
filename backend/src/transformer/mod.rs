//! The decoder-only transformer (Llama / Qwen2 / Qwen3) on the CPU reference ops.
//!
//! One layer stack serves training and rollout: `layers::run_layers` does norms,
//! projections, RoPE and the MLP for any set of rows and asks an attention
//! strategy for the attention itself — full causal attention per sequence when
//! training, one row against the KV cache when decoding. Both strategies go
//! through `attend_row`, and every GEMM's rows are independent of the batch, so
//! a token's logits are the same bits whether they were computed while sampling
//! or while training (in the flows whose rollout GEMMs are the training GEMMs).

mod backward;
mod forward;
mod kv_cache;
mod layers;
mod prepared;

pub use backward::backward;
pub use forward::{check_head_rows, forward, forward_rows, Activations, ForwardOut};
pub use kv_cache::{decode_step, prefill, prefill_into, KvCache};
pub use prepared::{rope_table, PreparedModel};

#[cfg(test)]
pub(crate) mod tests;

/// Small configurations for other modules' tests.
#[cfg(test)]
pub(crate) mod tests_support {
    use crate::model::{Arch, ModelConfig};

    pub fn tiny_config() -> ModelConfig {
        super::tests::tiny_config(Arch::Qwen3, false)
    }
}
