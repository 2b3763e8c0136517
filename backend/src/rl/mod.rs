//! The RL algorithm: GRPO advantages, the clipped policy loss, mismatch
//! metrics (over the step and per response-length bucket), and the optimizer.

pub mod advantage;
pub mod by_length;
pub mod loss;
pub mod mismatch;
pub mod optim;
