//! Loading folders written by HF transformers' `save_pretrained`.

use super::super::{load_model, save_model, Arch, ModelWeights};
use super::{fixture, tempdir};

fn all_bf16_exact(w: &ModelWeights) -> bool {
    w.tensors()
        .iter()
        .all(|(_, t)| t.iter().all(|x| x.to_bits() & 0xffff == 0))
}

#[test]
fn llama_tiny_bf16_tied_llama3_rope() {
    let (cfg, w) = load_model(&fixture("llama-tiny")).unwrap();
    assert_eq!(cfg.arch, Arch::Llama);
    assert_eq!(
        (cfg.hidden_size, cfg.head_dim, cfg.num_key_value_heads),
        (128, 32, 2)
    );
    assert!(cfg.tie_word_embeddings);
    assert!(w.lm_head.is_none());
    assert_eq!(cfg.rope_theta, 500000.0);
    let rs = cfg.rope_scaling.expect("llama3 rope scaling");
    assert_eq!(rs.original_max_position_embeddings, 32);
    assert_eq!(
        (cfg.bos_token_id, cfg.eos_token_ids.clone()),
        (Some(0), vec![0])
    );
    assert!(all_bf16_exact(&w));
    // Norms were perturbed away from 1 by the fixture script.
    assert!(w.layers[0].input_layernorm.iter().any(|&x| x != 1.0));
}

#[test]
fn qwen2_tiny_sharded_with_bias() {
    let (cfg, w) = load_model(&fixture("qwen2-tiny")).unwrap();
    assert_eq!(cfg.arch, Arch::Qwen2);
    assert_eq!(
        (cfg.hidden_size, cfg.head_dim, cfg.num_key_value_heads),
        (64, 16, 1)
    );
    assert!(!cfg.tie_word_embeddings);
    assert!(w.lm_head.is_some());
    let b = w.layers[1].k_bias.as_ref().expect("k bias");
    assert_eq!(b.len(), 16);
    assert!(b.iter().any(|&x| x != 0.0));
}

#[test]
fn qwen3_tiny_head_dim_not_hidden_over_heads() {
    let (cfg, w) = load_model(&fixture("qwen3-tiny")).unwrap();
    assert_eq!(cfg.arch, Arch::Qwen3);
    assert_eq!(
        (cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim),
        (96, 4, 32)
    );
    assert_eq!(cfg.rope_theta, 1e6);
    assert_eq!(w.layers[0].q_norm.as_ref().map(Vec::len), Some(32));
    assert_eq!(w.layers[0].q_proj.len(), 128 * 96);
}

#[test]
fn fixtures_survive_save_and_load() {
    for name in ["llama-tiny", "qwen2-tiny", "qwen3-tiny"] {
        let (cfg, w) = load_model(&fixture(name)).unwrap();
        let dir = tempdir();
        save_model(dir.path(), &cfg, &w).unwrap();
        let (cfg2, w2) = load_model(dir.path()).unwrap();
        assert_eq!(cfg2, cfg, "{name}");
        assert_eq!(w2, w, "{name}");
    }
}
