//! Bad inputs give errors that name the file and the tensor or field.

use std::path::Path;

use safetensors::Dtype;
use serde_json::{json, Value};

use super::super::{init_random, load_model, Arch, ModelConfig};
use super::{
    assert_mentions, encode, err_msg, raw_tensors, tempdir, tiny, write_config, write_safetensors,
    RawTensor,
};

fn good_raw(cfg: &ModelConfig) -> Vec<RawTensor> {
    raw_tensors(cfg, &init_random(cfg, 1), Dtype::F32)
}

/// A model folder with `config` as config.json and `tensors` as model.safetensors.
fn folder(config: &Value, tensors: &[RawTensor]) -> tempfile::TempDir {
    let dir = tempdir();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), tensors);
    dir
}

/// The error of loading a folder whose config.json is `cfg`'s JSON edited by `edit`.
fn config_error(arch: Arch, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> String {
    let cfg = tiny(arch, false);
    let mut v = cfg.to_hf_json();
    edit(v.as_object_mut().unwrap());
    let dir = folder(&v, &good_raw(&cfg));
    err_msg(load_model(dir.path()))
}

#[test]
fn missing_files() {
    let dir = tempdir();
    let msg = err_msg(load_model(dir.path()));
    assert_mentions(&msg, &["config.json", "not found"]);
    let msg = err_msg(load_model(&dir.path().join("nope")));
    assert_mentions(&msg, &["nope/config.json", "not found"]);
    write_config(dir.path(), &tiny(Arch::Llama, true));
    let msg = err_msg(load_model(dir.path()));
    assert_mentions(&msg, &["no weights", "model.safetensors"]);
}

#[test]
fn bad_config_json() {
    let dir = tempdir();
    std::fs::write(dir.path().join("config.json"), "{\"vocab_size\": 3,,}").unwrap();
    let msg = err_msg(load_model(dir.path()));
    assert_mentions(&msg, &["config.json", "invalid JSON", "line 1"]);
    std::fs::write(dir.path().join("config.json"), "[1, 2]").unwrap();
    let msg = err_msg(load_model(dir.path()));
    assert_mentions(&msg, &["config.json", "an object"]);
}

#[test]
fn missing_and_mistyped_fields() {
    let msg = config_error(Arch::Llama, |m| {
        m.remove("hidden_size");
    });
    assert_mentions(&msg, &["config.json", "missing field `hidden_size`"]);
    let msg = config_error(Arch::Qwen2, |m| {
        m.insert("num_hidden_layers".into(), json!("2"));
    });
    assert_mentions(&msg, &["config.json", "`num_hidden_layers`", "a string"]);
    let msg = config_error(Arch::Qwen3, |m| {
        m.insert("rms_norm_eps".into(), json!(true));
    });
    assert_mentions(&msg, &["config.json", "`rms_norm_eps`", "a number"]);
    let msg = config_error(Arch::Llama, |m| {
        m.insert("eos_token_id".into(), json!([2, "x"]));
    });
    assert_mentions(&msg, &["config.json", "`eos_token_id`"]);
    let msg = config_error(Arch::Llama, |m| {
        m.insert("num_attention_heads".into(), json!(-4));
    });
    assert_mentions(
        &msg,
        &["config.json", "`num_attention_heads`", "non-negative"],
    );
    let msg = config_error(Arch::Llama, |m| {
        m.remove("architectures");
        m.remove("model_type");
    });
    assert_mentions(&msg, &["config.json", "`architectures`"]);
}

#[test]
fn unsupported_architecture_and_fields() {
    let msg = config_error(Arch::Llama, |m| {
        m.insert("architectures".into(), json!(["MistralForCausalLM"]));
    });
    assert_mentions(
        &msg,
        &[
            "config.json",
            "unsupported architecture",
            "MistralForCausalLM",
        ],
    );
    let msg = config_error(Arch::Llama, |m| {
        m.remove("architectures");
        m.insert("model_type".into(), json!("gemma"));
    });
    assert_mentions(&msg, &["config.json", "gemma", "model_type"]);
    let msg = config_error(Arch::Llama, |m| {
        m.insert("model_type".into(), json!("qwen2"));
    });
    assert_mentions(&msg, &["config.json", "model_type", "LlamaForCausalLM"]);
    let msg = config_error(Arch::Qwen2, |m| {
        m.insert(
            "rope_scaling".into(),
            json!({"type": "yarn", "factor": 4.0}),
        );
    });
    assert_mentions(
        &msg,
        &[
            "config.json",
            "unsupported field `rope_scaling.type`",
            "yarn",
        ],
    );
    let msg = config_error(Arch::Llama, |m| {
        m.insert(
            "rope_scaling".into(),
            json!({"rope_type": "dynamic", "factor": 2.0}),
        );
    });
    assert_mentions(
        &msg,
        &["config.json", "`rope_scaling.rope_type`", "dynamic"],
    );
    let msg = config_error(Arch::Llama, |m| {
        m.insert(
            "rope_scaling".into(),
            json!({"rope_type": "llama3", "factor": 2.0}),
        );
    });
    assert_mentions(&msg, &["config.json", "rope_scaling.low_freq_factor"]);
    let msg = config_error(Arch::Llama, |m| {
        m.insert("mlp_bias".into(), json!(true));
    });
    assert_mentions(&msg, &["config.json", "unsupported field `mlp_bias`"]);
    let msg = config_error(Arch::Llama, |m| {
        m.insert("attention_bias".into(), json!(true));
    });
    assert_mentions(
        &msg,
        &[
            "config.json",
            "unsupported field `attention_bias`",
            "o_proj",
        ],
    );
    let msg = config_error(Arch::Qwen3, |m| {
        m.insert("attention_bias".into(), json!(true));
    });
    assert_mentions(&msg, &["config.json", "unsupported field `attention_bias`"]);
    let msg = config_error(Arch::Qwen3, |m| {
        m.insert("hidden_act".into(), json!("gelu"));
    });
    assert_mentions(
        &msg,
        &["config.json", "unsupported field `hidden_act`", "gelu"],
    );
    let msg = config_error(Arch::Qwen2, |m| {
        m.insert("use_sliding_window".into(), json!(true));
        m.insert("max_window_layers".into(), json!(1));
    });
    assert_mentions(
        &msg,
        &["config.json", "unsupported field `use_sliding_window`"],
    );
    let msg = config_error(Arch::Qwen3, |m| {
        m.insert(
            "layer_types".into(),
            json!(["full_attention", "sliding_attention"]),
        );
    });
    assert_mentions(&msg, &["config.json", "`layer_types`", "sliding_attention"]);
    let msg = config_error(Arch::Llama, |m| {
        m.insert("quantization_config".into(), json!({"quant_method": "fp8"}));
    });
    assert_mentions(&msg, &["config.json", "`quantization_config`"]);
}

#[test]
fn inconsistent_sizes() {
    let msg = config_error(Arch::Llama, |m| {
        m.insert("num_key_value_heads".into(), json!(3));
    });
    assert_mentions(
        &msg,
        &["config.json", "`num_key_value_heads`", "not a multiple"],
    );
    let msg = config_error(Arch::Llama, |m| {
        m.remove("head_dim");
        m.insert("hidden_size".into(), json!(18));
    });
    assert_mentions(
        &msg,
        &["config.json", "`hidden_size`", "num_attention_heads"],
    );
    let msg = config_error(Arch::Qwen2, |m| {
        m.insert("intermediate_size".into(), json!(0));
    });
    assert_mentions(&msg, &["config.json", "`intermediate_size`", "positive"]);
    let msg = config_error(Arch::Qwen3, |m| {
        m.insert("head_dim".into(), json!(5));
    });
    assert_mentions(&msg, &["config.json", "`head_dim`", "even"]);
}

fn weights_error(arch: Arch, edit: impl FnOnce(&mut Vec<RawTensor>)) -> String {
    let cfg = tiny(arch, false);
    let mut raw = good_raw(&cfg);
    edit(&mut raw);
    let dir = folder(&cfg.to_hf_json(), &raw);
    err_msg(load_model(dir.path()))
}

fn find<'a>(raw: &'a mut [RawTensor], name: &str) -> &'a mut RawTensor {
    raw.iter_mut()
        .find(|t| t.0 == name)
        .expect("tensor in test data")
}

#[test]
fn bad_tensors() {
    let name = "model.layers.1.mlp.up_proj.weight";
    let msg = weights_error(Arch::Llama, |raw| raw.retain(|t| t.0 != name));
    assert_mentions(&msg, &["model.safetensors", "missing tensor", name]);

    let msg = weights_error(Arch::Qwen2, |raw| {
        let t = find(raw, name);
        t.2 = vec![16, 24];
    });
    assert_mentions(
        &msg,
        &["model.safetensors", name, "[16, 24]", "expected [24, 16]"],
    );

    let msg = weights_error(Arch::Qwen3, |raw| {
        let t = find(raw, "model.layers.0.self_attn.q_proj.weight");
        t.1 = Dtype::I64;
        t.2 = vec![24, 16];
        t.3 = vec![0; 24 * 16 * 8];
    });
    assert_mentions(
        &msg,
        &[
            "model.safetensors",
            "model.layers.0.self_attn.q_proj.weight",
            "I64",
        ],
    );

    let msg = weights_error(Arch::Llama, |raw| {
        let t = find(raw, "model.norm.weight");
        t.1 = Dtype::F8_E4M3;
        t.3 = vec![0; 16];
    });
    assert_mentions(&msg, &["model.safetensors", "model.norm.weight", "F8_E4M3"]);

    // A Qwen2 checkpoint read as Llama: the biases are unexpected.
    let qwen2 = tiny(Arch::Qwen2, false);
    let mut llama = qwen2.clone();
    llama.arch = Arch::Llama;
    llama.attention_bias = false;
    let dir = folder(&llama.to_hf_json(), &good_raw(&qwen2));
    let msg = err_msg(load_model(dir.path()));
    assert_mentions(
        &msg,
        &[
            "model.safetensors",
            "unexpected tensor",
            "_proj.bias`",
            "LlamaForCausalLM",
        ],
    );

    // Untied config, lm_head absent.
    let msg = weights_error(Arch::Llama, |raw| raw.retain(|t| t.0 != "lm_head.weight"));
    assert_mentions(
        &msg,
        &["model.safetensors", "missing tensor `lm_head.weight`"],
    );

    // Tied config with a stored lm_head of the wrong shape.
    let cfg = tiny(Arch::Llama, true);
    let mut raw = good_raw(&cfg);
    raw.push((
        "lm_head.weight".into(),
        Dtype::F32,
        vec![16, 32],
        vec![0; 32 * 16 * 4],
    ));
    let dir = folder(&cfg.to_hf_json(), &raw);
    let msg = err_msg(load_model(dir.path()));
    assert_mentions(
        &msg,
        &["model.safetensors", "lm_head.weight", "expected [32, 16]"],
    );
}

#[test]
fn corrupt_safetensors() {
    let cfg = tiny(Arch::Qwen2, true);
    let dir = folder(&cfg.to_hf_json(), &good_raw(&cfg));
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    // Truncated: the header promises more data than the file has.
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    let msg = err_msg(load_model(dir.path()));
    assert_mentions(&msg, &["model.safetensors", "invalid safetensors"]);
    // Cut inside the header.
    std::fs::write(&path, &bytes[..20]).unwrap();
    let msg = err_msg(load_model(dir.path()));
    assert_mentions(&msg, &["model.safetensors", "invalid safetensors"]);
    // Empty and garbage files.
    std::fs::write(&path, b"").unwrap();
    let msg = err_msg(load_model(dir.path()));
    assert_mentions(&msg, &["model.safetensors", "invalid safetensors"]);
    let mut garbage = (u64::MAX / 2).to_le_bytes().to_vec();
    garbage.extend_from_slice(b"{not json");
    std::fs::write(&path, &garbage).unwrap();
    let msg = err_msg(load_model(dir.path()));
    assert_mentions(&msg, &["model.safetensors", "invalid safetensors"]);
    let mut bad_header = 9u64.to_le_bytes().to_vec();
    bad_header.extend_from_slice(b"{\"a\": 1} ");
    std::fs::write(&path, &bad_header).unwrap();
    let msg = err_msg(load_model(dir.path()));
    assert_mentions(&msg, &["model.safetensors", "invalid safetensors"]);
}

/// A two-shard folder; `edit` may change the index before it is written.
fn sharded(edit: impl FnOnce(&mut Value, &Path)) -> String {
    let cfg = tiny(Arch::Llama, false);
    let dir = tempdir();
    write_config(dir.path(), &cfg);
    let raw = good_raw(&cfg);
    let (a, b) = raw.split_at(5);
    let mut weight_map = serde_json::Map::new();
    for (part, shard) in [a, b].into_iter().zip(["s1.safetensors", "s2.safetensors"]) {
        write_safetensors(&dir.path().join(shard), part);
        for (n, ..) in part {
            weight_map.insert(n.clone(), json!(shard));
        }
    }
    let mut index = json!({ "metadata": {}, "weight_map": weight_map });
    edit(&mut index, dir.path());
    let text = match index {
        Value::String(s) => s,
        v => v.to_string(),
    };
    std::fs::write(dir.path().join("model.safetensors.index.json"), text).unwrap();
    err_msg(load_model(dir.path()))
}

#[test]
fn bad_shards_and_index() {
    let idx = "model.safetensors.index.json";
    let msg = sharded(|_, dir| std::fs::remove_file(dir.join("s2.safetensors")).unwrap());
    assert_mentions(&msg, &[idx, "s2.safetensors", "missing"]);

    let msg = sharded(|v, _| *v = json!("{\"weight_map\": "));
    assert_mentions(&msg, &[idx, "invalid JSON"]);

    let msg = sharded(|v, _| {
        v.as_object_mut().unwrap().remove("weight_map");
    });
    assert_mentions(&msg, &[idx, "weight_map"]);

    let msg = sharded(|v, _| v["weight_map"]["model.norm.weight"] = json!(3));
    assert_mentions(&msg, &[idx, "model.norm.weight", "file name"]);

    let msg = sharded(|v, _| v["weight_map"]["model.norm.weight"] = json!("../x.safetensors"));
    assert_mentions(&msg, &[idx, "model.norm.weight", "../x.safetensors"]);

    // Listed in one shard, stored in the other.
    let msg = sharded(|v, _| v["weight_map"]["model.norm.weight"] = json!("s1.safetensors"));
    assert_mentions(&msg, &[idx, "model.norm.weight", "s2.safetensors"]);

    // Stored but not listed.
    let msg = sharded(|v, _| {
        v["weight_map"]
            .as_object_mut()
            .unwrap()
            .remove("model.norm.weight");
    });
    assert_mentions(&msg, &[idx, "model.norm.weight", "does not list"]);

    // Listed but not stored anywhere.
    let msg = sharded(|v, _| v["weight_map"]["model.extra.weight"] = json!("s1.safetensors"));
    assert_mentions(
        &msg,
        &[
            idx,
            "model.extra.weight",
            "s1.safetensors",
            "does not contain",
        ],
    );

    // Neither listed nor stored: missing from the model.
    let msg = sharded(|v, dir| {
        let name = "model.layers.1.mlp.down_proj.weight";
        v["weight_map"].as_object_mut().unwrap().remove(name);
        let mut raw = good_raw(&tiny(Arch::Llama, false));
        raw.drain(..5);
        raw.retain(|t| t.0 != name);
        write_safetensors(&dir.join("s2.safetensors"), &raw);
    });
    assert_mentions(
        &msg,
        &[idx, "missing tensor `model.layers.1.mlp.down_proj.weight`"],
    );

    // One tensor stored in both shards.
    let msg = sharded(|v, dir| {
        let cfg = tiny(Arch::Llama, false);
        let mut raw = good_raw(&cfg);
        let dup = raw[0].clone();
        let mut second: Vec<RawTensor> = raw.drain(5..).collect();
        second.push(dup);
        write_safetensors(&dir.join("s2.safetensors"), &second);
        let _ = v;
    });
    assert_mentions(
        &msg,
        &[
            "s1.safetensors",
            "model.embed_tokens.weight",
            "s2.safetensors",
            "twice",
        ],
    );
}

#[test]
fn tensor_in_shard_with_wrong_dtype_names_the_shard() {
    let cfg = tiny(Arch::Qwen3, false);
    let dir = tempdir();
    write_config(dir.path(), &cfg);
    let mut raw = good_raw(&cfg);
    let t = find(&mut raw, "model.layers.1.self_attn.q_norm.weight");
    t.1 = Dtype::F64;
    t.3 = encode(Dtype::F32, &[0.0; 12]);
    write_safetensors(&dir.path().join("only.safetensors"), &raw);
    let map: serde_json::Map<String, Value> = raw
        .iter()
        .map(|t| (t.0.clone(), json!("only.safetensors")))
        .collect();
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        json!({ "weight_map": map }).to_string(),
    )
    .unwrap();
    let msg = err_msg(load_model(dir.path()));
    assert_mentions(
        &msg,
        &[
            "only.safetensors",
            "model.layers.1.self_attn.q_norm.weight",
            "F64",
        ],
    );
}
