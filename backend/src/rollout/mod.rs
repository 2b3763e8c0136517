//! The rollout engine: batched generation with a KV cache.

pub mod engine;
pub mod sampler;

#[cfg(test)]
mod engine_tests;
