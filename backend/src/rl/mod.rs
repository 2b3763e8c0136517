//! The RL algorithm: GRPO advantages, the clipped policy loss, mismatch
//! metrics, and the optimizer.

pub mod advantage;
pub mod loss;
pub mod mismatch;
pub mod optim;
