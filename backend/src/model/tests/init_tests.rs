//! Random initialization.

use super::super::{init_random, tensor_layout, TensorKind};
use super::{tiny, ALL_ARCHS};

#[test]
fn deterministic_per_seed() {
    for arch in ALL_ARCHS {
        let cfg = tiny(arch, false);
        let a = init_random(&cfg, 42);
        assert_eq!(a, init_random(&cfg, 42));
        assert_ne!(a, init_random(&cfg, 43));
        a.check(&cfg).unwrap();
    }
}

#[test]
fn values_by_kind() {
    let mut cfg = tiny(super::Arch::Qwen2, false);
    cfg.vocab_size = 4096;
    cfg.hidden_size = 64;
    let w = init_random(&cfg, 0);
    for ((name, t), spec) in w.tensors().into_iter().zip(tensor_layout(&cfg)) {
        match spec.kind {
            TensorKind::Norm => assert!(t.iter().all(|&x| x == 1.0), "{name}"),
            TensorKind::Bias => assert!(t.iter().all(|&x| x == 0.0), "{name}"),
            TensorKind::Matrix | TensorKind::Embedding => {
                let n = t.len() as f64;
                let mean = t.iter().map(|&x| x as f64).sum::<f64>() / n;
                let var = t.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
                assert!(t.iter().all(|x| x.is_finite()));
                if t.len() >= 100_000 {
                    assert!(mean.abs() < 1e-3, "{name} mean {mean}");
                    assert!(
                        (var.sqrt() - 0.02).abs() < 5e-4,
                        "{name} std {}",
                        var.sqrt()
                    );
                }
            }
        }
    }
    // Different tensors draw different values.
    assert_ne!(w.layers[0].gate_proj, w.layers[0].up_proj);
    assert_ne!(w.embed_tokens[..16], w.lm_head.as_ref().unwrap()[..16]);
}
