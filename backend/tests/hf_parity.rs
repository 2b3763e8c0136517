//! Parity with Hugging Face transformers: our loader and forward against the
//! logits HF computed for the fixtures (tests/fixtures/make_fixtures.py), and
//! our tokenizer against HF's ids.
//!
//! Tolerances, as max |ours - HF| / max |HF| over all logits of a model:
//! - f32 flow: 1e-4 (both sides are f32; only summation order differs).
//! - bf16 flow: 3e-2 (BF16 GEMM operands and outputs, 8-bit mantissa).
//! - fp8 flow: 0.25 (E4M3, 4-bit mantissa; a sanity bound, reported not tuned).

mod common;

use common::{expected, fixture};
use jet_backend::model::load_model;
use jet_backend::tokenizer::Tokenizer;
use jet_backend::transformer::{forward, PreparedModel};
use jet_kernels::{Flow, GemmRole};

fn rel_err(name: &str, flow: Flow) -> f64 {
    let (cfg, w) = load_model(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let model = PreparedModel::new(&cfg, &w, flow);
    let cases = expected(name);
    assert_eq!(cases.len(), 3, "{name}: fixture sequences");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (toks, hf) in &cases {
        let out = forward(
            &model,
            &[toks.as_slice()],
            GemmRole::TrainForward,
            false,
            false,
        );
        assert_eq!(out.logits.len(), hf.len());
        for (a, b) in out.logits.iter().zip(hf) {
            num = num.max((a - b).abs() as f64);
            den = den.max(b.abs() as f64);
        }
    }
    num / den
}

#[test]
fn f32_forward_matches_hf_logits() {
    for name in ["qwen3-tiny", "llama-tiny", "qwen2-tiny"] {
        let e = rel_err(name, Flow::F32);
        assert!(e < 1e-4, "{name}: f32 relative error {e:.3e}");
    }
}

#[test]
fn bf16_and_fp8_flows_stay_close_to_hf_logits() {
    for name in ["qwen3-tiny", "llama-tiny", "qwen2-tiny"] {
        let b = rel_err(name, Flow::Bf16);
        assert!(b < 3e-2, "{name}: bf16 relative error {b:.3e}");
        let f = rel_err(name, Flow::Fp8);
        assert!(f < 0.25, "{name}: fp8 relative error {f:.3e}");
        eprintln!("{name}: bf16 {b:.2e}, fp8 {f:.2e}");
    }
}

#[test]
fn tokenizer_matches_hf_ids() {
    for name in ["qwen3-tiny", "llama-tiny", "qwen2-tiny"] {
        let dir = fixture(name);
        let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        let check: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("tokenizer_check.json")).unwrap(),
        )
        .unwrap();
        for c in check.as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            let want: Vec<u32> = c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(tok.encode(text, true).unwrap(), want, "{name}: {text:?}");
            assert_eq!(tok.decode(&want, false).unwrap(), text);
        }
    }
}
