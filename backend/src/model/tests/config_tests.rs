//! Parsing real HF config.json texts, defaults, and the to_hf_json round trip.

use super::super::{Arch, ModelConfig, RopeScaling};
use super::{tiny, ALL_ARCHS};

/// meta-llama/Llama-3.2-1B-Instruct
pub(crate) const LLAMA_3_2_1B: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}"#;

/// Qwen/Qwen2.5-0.5B-Instruct
pub(crate) const QWEN2_5_0_5B: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 21,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}"#;

/// Qwen/Qwen3-0.6B
pub(crate) const QWEN3_0_6B: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}"#;

#[test]
fn llama_3_2_with_llama3_rope() {
    let c = ModelConfig::from_json_str(LLAMA_3_2_1B).unwrap();
    assert_eq!(
        c,
        ModelConfig {
            arch: Arch::Llama,
            vocab_size: 128256,
            hidden_size: 2048,
            intermediate_size: 8192,
            num_hidden_layers: 16,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            head_dim: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 500000.0,
            rope_scaling: Some(RopeScaling {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            }),
            max_position_embeddings: 131072,
            tie_word_embeddings: true,
            attention_bias: false,
            qk_norm: false,
            bos_token_id: Some(128000),
            eos_token_ids: vec![128001, 128008, 128009],
        }
    );
    assert_eq!(c.param_count(), 1_235_814_400);
}

#[test]
fn qwen2_5() {
    let c = ModelConfig::from_json_str(QWEN2_5_0_5B).unwrap();
    assert_eq!(c.arch, Arch::Qwen2);
    assert_eq!(c.head_dim, 64);
    assert_eq!(c.num_key_value_heads, 2);
    assert!(c.attention_bias);
    assert!(!c.qk_norm);
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.rope_scaling, None);
    assert_eq!(c.eos_token_ids, vec![151645]);
    assert_eq!(c.bos_token_id, Some(151643));
    assert!(c.tie_word_embeddings);
    assert_eq!(c.param_count(), 494_032_768);
}

#[test]
fn qwen3_head_dim_independent_of_hidden() {
    let c = ModelConfig::from_json_str(QWEN3_0_6B).unwrap();
    assert_eq!(c.arch, Arch::Qwen3);
    assert_eq!(c.head_dim, 128);
    assert_ne!(c.hidden_size, c.num_attention_heads * c.head_dim);
    assert!(c.qk_norm);
    assert!(!c.attention_bias);
    assert_eq!(c.max_position_embeddings, 40960);
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.param_count(), 596_049_920);
}

#[test]
fn transformers_v5_rope_parameters() {
    let text = r#"{"architectures":["LlamaForCausalLM"],"vocab_size":64,"hidden_size":32,
        "intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":4,
        "rope_parameters":{"rope_type":"llama3","rope_theta":500000.0,"factor":8.0,
        "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}"#;
    let c = ModelConfig::from_json_str(text).unwrap();
    assert_eq!(c.rope_theta, 500000.0);
    assert_eq!(c.rope_scaling.unwrap().factor, 8.0);
    let text = r#"{"model_type":"qwen3","vocab_size":64,"hidden_size":32,"intermediate_size":64,
        "num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,
        "rope_parameters":{"rope_type":"default","rope_theta":1000000.0},
        "layer_types":["full_attention"]}"#;
    let c = ModelConfig::from_json_str(text).unwrap();
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.rope_scaling, None);
}

#[test]
fn hf_defaults() {
    // Llama: kv heads = heads, head_dim = hidden / heads, bos 1, eos 2,
    // theta 10000, 2048 positions, untied.
    let text = r#"{"architectures":["LlamaForCausalLM"],"vocab_size":64,"hidden_size":32,
        "intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":4}"#;
    let c = ModelConfig::from_json_str(text).unwrap();
    assert_eq!((c.num_key_value_heads, c.head_dim), (4, 8));
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(1), vec![2])
    );
    assert_eq!(c.rope_theta, 10000.0);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(c.max_position_embeddings, 2048);
    assert!(!c.tie_word_embeddings);
    // Explicit nulls mean "none" for token ids, and heads for kv heads.
    let text = r#"{"model_type":"qwen3","vocab_size":64,"hidden_size":32,"intermediate_size":64,
        "num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":null,
        "bos_token_id":null,"eos_token_id":null}"#;
    let c = ModelConfig::from_json_str(text).unwrap();
    assert_eq!((c.num_key_value_heads, c.head_dim), (4, 128));
    assert_eq!((c.bos_token_id, c.eos_token_ids.clone()), (None, vec![]));
    assert_eq!(c.max_position_embeddings, 32768);
}

#[test]
fn to_hf_json_round_trips() {
    for arch in ALL_ARCHS {
        for tied in [false, true] {
            let c = tiny(arch, tied);
            c.validate().unwrap();
            let v = c.to_hf_json();
            assert_eq!(v["architectures"][0], arch.hf_class());
            assert_eq!(v["model_type"], arch.model_type());
            assert_eq!(v["torch_dtype"], "float32");
            assert_eq!(v["hidden_act"], "silu");
            let text = serde_json::to_string(&v).unwrap();
            assert_eq!(ModelConfig::from_json_str(&text).unwrap(), c, "{arch:?}");
        }
    }
    // Single and absent eos ids.
    let mut c = tiny(Arch::Qwen2, true);
    c.eos_token_ids = vec![5];
    assert_eq!(c.to_hf_json()["eos_token_id"], 5);
    let back = ModelConfig::from_json_str(&c.to_hf_json().to_string()).unwrap();
    assert_eq!(back, c);
    c.eos_token_ids.clear();
    c.bos_token_id = None;
    let back = ModelConfig::from_json_str(&c.to_hf_json().to_string()).unwrap();
    assert_eq!(back, c);
}

#[test]
fn validate_rejects_inconsistent_configs() {
    let mut c = tiny(Arch::Llama, false);
    c.num_key_value_heads = 3;
    let msg = c.validate().unwrap_err().to_string();
    assert!(msg.contains("num_key_value_heads"), "{msg}");
    let mut c = tiny(Arch::Qwen2, false);
    c.attention_bias = false;
    let msg = c.validate().unwrap_err().to_string();
    assert!(msg.contains("attention_bias"), "{msg}");
    let mut c = tiny(Arch::Llama, false);
    c.hidden_size = 0;
    let msg = c.validate().unwrap_err().to_string();
    assert!(msg.contains("hidden_size"), "{msg}");
    let mut c = tiny(Arch::Llama, false);
    c.eos_token_ids = vec![32];
    let msg = c.validate().unwrap_err().to_string();
    assert!(msg.contains("eos_token_id"), "{msg}");
    let mut c = tiny(Arch::Llama, false);
    c.vocab_size = usize::MAX / 2;
    let msg = c.validate().unwrap_err().to_string();
    assert!(msg.contains("too large"), "{msg}");
}
