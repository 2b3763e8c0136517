//! Random initialization as HF does it for these models: normal(0, 0.02) for
//! matrices and embeddings, ones for norms, zeros for biases.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::config::ModelConfig;
use super::weights::{tensor_layout, ModelWeights, TensorKind};

/// HF `initializer_range`.
pub const INIT_STD: f64 = 0.02;

/// Fresh weights for `cfg`, the same for the same seed. Tensor number `i` (in
/// [`super::weights::tensor_specs`] order) draws from ChaCha8 stream `i`, so
/// one tensor's values do not depend on the sizes of the others.
pub fn init_random(cfg: &ModelConfig, seed: u64) -> ModelWeights {
    let mut w = ModelWeights::empty(cfg);
    for (i, ((_, slot), spec)) in w
        .tensors_mut()
        .into_iter()
        .zip(tensor_layout(cfg))
        .enumerate()
    {
        let n = spec.numel();
        *slot = match spec.kind {
            TensorKind::Norm => vec![1.0; n],
            TensorKind::Bias => vec![0.0; n],
            TensorKind::Embedding | TensorKind::Matrix => {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(i as u64);
                normal_vec(&mut rng, n, INIT_STD)
            }
        };
    }
    w
}

/// `n` draws from normal(0, std) by Box-Muller (both outputs used).
fn normal_vec(rng: &mut impl Rng, n: usize, std: f64) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        // u1 in (0, 1] so that ln(u1) is finite.
        let u1: f64 = 1.0 - rng.random::<f64>();
        let u2: f64 = rng.random::<f64>();
        let r = (-2.0 * u1.ln()).sqrt() * std;
        let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
        out.push((r * c) as f32);
        if out.len() < n {
            out.push((r * s) as f32);
        }
    }
    out
}
