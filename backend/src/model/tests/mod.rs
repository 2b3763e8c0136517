//! Tests of model I/O; helpers shared by them.

mod config_tests;
mod error_tests;
mod fixture_tests;
mod init_tests;
mod io_tests;

use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::Dtype;

use super::{tensor_layout, Arch, ModelConfig, ModelWeights, RopeScaling};

/// A tiny config of each architecture (GQA 4:2 heads, 2 layers).
pub(super) fn tiny(arch: Arch, tied: bool) -> ModelConfig {
    ModelConfig {
        arch,
        vocab_size: 32,
        hidden_size: 16,
        intermediate_size: 24,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        // Qwen3's head_dim need not be hidden / heads.
        head_dim: if arch == Arch::Qwen3 { 6 } else { 4 },
        rms_norm_eps: 1e-5,
        rope_theta: 500000.0,
        rope_scaling: (arch == Arch::Llama).then_some(RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        }),
        max_position_embeddings: 256,
        tie_word_embeddings: tied,
        attention_bias: arch == Arch::Qwen2,
        qk_norm: arch == Arch::Qwen3,
        bos_token_id: Some(1),
        eos_token_ids: vec![2, 3],
    }
}

pub(super) const ALL_ARCHS: [Arch; 3] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3];

pub(super) fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("create temp dir")
}

/// Values encoded little-endian in `dtype` (F32, F16 or BF16).
pub(super) fn encode(dtype: Dtype, xs: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for &x in xs {
        match dtype {
            Dtype::F32 => out.extend_from_slice(&x.to_le_bytes()),
            Dtype::F16 => out.extend_from_slice(&half::f16::from_f32(x).to_bits().to_le_bytes()),
            Dtype::BF16 => out.extend_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes()),
            other => panic!("test helper cannot encode {other}"),
        }
    }
    out
}

/// A raw tensor to write: name, dtype, shape, bytes.
pub(super) type RawTensor = (String, Dtype, Vec<usize>, Vec<u8>);

pub(super) fn write_safetensors(path: &Path, tensors: &[RawTensor]) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).expect("view")))
        .collect();
    safetensors::serialize_to_file(views, None, path).expect("write safetensors");
}

/// The tensors of `w` encoded in `dtype`, in layout order.
pub(super) fn raw_tensors(cfg: &ModelConfig, w: &ModelWeights, dtype: Dtype) -> Vec<RawTensor> {
    w.tensors()
        .into_iter()
        .zip(tensor_layout(cfg))
        .map(|((name, data), spec)| (name, dtype, spec.shape, encode(dtype, data)))
        .collect()
}

pub(super) fn write_config(dir: &Path, cfg: &ModelConfig) {
    let text = serde_json::to_string_pretty(&cfg.to_hf_json()).unwrap();
    std::fs::write(dir.join("config.json"), text).unwrap();
}

/// The error message of a result that must be an error.
#[track_caller]
pub(super) fn err_msg<T: std::fmt::Debug>(r: Result<T, super::ModelError>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

/// Asserts that `msg` contains every one of `parts`.
#[track_caller]
pub(super) fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} does not mention {p:?}");
    }
}

/// A folder of the HF reference fixtures (written by transformers, see
/// tests/fixtures/make_fixtures.py).
pub(crate) fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}
