//! Models: configuration of the supported HF architectures (Llama, Qwen2,
//! Qwen3), f32 weights with HF tensor names, loading and saving HF folders,
//! and random initialization.

mod arch;
pub mod config;
pub mod error;
pub mod init;
pub(crate) mod json;
pub mod load;
pub mod save;
pub mod weights;

#[cfg(test)]
mod tests;

pub use config::{Arch, ModelConfig, RopeScaling};
pub use error::ModelError;
pub use init::init_random;
pub use load::{load_model, load_weights};
pub use save::save_model;
pub use weights::{
    tensor_layout, tensor_specs, LayerWeights, ModelWeights, TensorKind, TensorSpec,
};
