//! `configs/qwen3-0.6b-gsm8k.toml` end to end on the CPU, without a GPU or a
//! network: a tiny random Qwen3 in Hugging Face's layout (config.json and bf16
//! safetensors written here with the safetensors crate, as HF names the
//! tensors) carrying Qwen3's real tokenizer.json and chat template
//! (tests/fixtures/qwen3-tokenizer, see its README), GSM8K-style train and
//! held-out JSONL files written here, and the shipped config with only its
//! paths and sizes shrunk. `jetd run` must finish, evaluate on the held-out
//! file with pass@k, and keep rollout and trainer on-policy (fp8 flow).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use half::bf16;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const CONFIG: &str = include_str!("../configs/qwen3-0.6b-gsm8k.toml");
const TOKENIZER_XZ: &[u8] = include_bytes!("fixtures/qwen3-tokenizer/tokenizer.json.xz");
const TOKENIZER_CONFIG: &str = include_str!("fixtures/qwen3-tokenizer/tokenizer_config.json");
const TOKENIZER_SHA256: &str = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4";

/// Qwen3-0.6B's config.json with the sizes of a tiny model (the vocabulary is
/// the real one: its embedding rows are the tokenizer's ids).
fn model_config() -> Value {
    json!({
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "max_position_embeddings": 512,
        "max_window_layers": 28,
        "model_type": "qwen3",
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-6,
        "rope_scaling": null,
        "rope_theta": 1000000,
        "sliding_window": null,
        "tie_word_embeddings": true,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": 151936
    })
}

/// Random bf16 weights under HF's Qwen3 tensor names (a fixed LCG: the same
/// model every time).
fn write_model(dir: &Path) {
    let c = model_config();
    let u = |k: &str| c[k].as_u64().unwrap() as usize;
    let (v, h, i, hd) = (
        u("vocab_size"),
        u("hidden_size"),
        u("intermediate_size"),
        u("head_dim"),
    );
    let (nh, nkv) = (u("num_attention_heads"), u("num_key_value_heads"));
    let mut shapes: Vec<(String, Vec<usize>, bool)> = vec![
        ("model.embed_tokens.weight".into(), vec![v, h], false),
        ("model.norm.weight".into(), vec![h], true),
    ];
    for l in 0..u("num_hidden_layers") {
        let p = format!("model.layers.{l}");
        shapes.extend([
            (format!("{p}.input_layernorm.weight"), vec![h], true),
            (
                format!("{p}.post_attention_layernorm.weight"),
                vec![h],
                true,
            ),
            (
                format!("{p}.self_attn.q_proj.weight"),
                vec![nh * hd, h],
                false,
            ),
            (
                format!("{p}.self_attn.k_proj.weight"),
                vec![nkv * hd, h],
                false,
            ),
            (
                format!("{p}.self_attn.v_proj.weight"),
                vec![nkv * hd, h],
                false,
            ),
            (
                format!("{p}.self_attn.o_proj.weight"),
                vec![h, nh * hd],
                false,
            ),
            (format!("{p}.self_attn.q_norm.weight"), vec![hd], true),
            (format!("{p}.self_attn.k_norm.weight"), vec![hd], true),
            (format!("{p}.mlp.gate_proj.weight"), vec![i, h], false),
            (format!("{p}.mlp.up_proj.weight"), vec![i, h], false),
            (format!("{p}.mlp.down_proj.weight"), vec![h, i], false),
        ]);
    }
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let mut bytes: HashMap<String, (Vec<usize>, Vec<u8>)> = HashMap::new();
    for (name, shape, norm) in shapes {
        let n: usize = shape.iter().product();
        let data: Vec<u8> = (0..n)
            .flat_map(|_| {
                let x = if norm {
                    1.0 + 0.1 * next()
                } else {
                    0.1 * next()
                };
                bf16::from_f32(x).to_le_bytes()
            })
            .collect();
        bytes.insert(name, (shape, data));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
        .iter()
        .map(|(k, (shape, data))| {
            let t =
                safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, shape.clone(), data)
                    .unwrap();
            (k.clone(), t)
        })
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &dir.join("model.safetensors")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&c).unwrap(),
    )
    .unwrap();
}

/// The real tokenizer files, unpacked into the model folder.
fn write_tokenizer(dir: &Path) {
    let mut json = Vec::new();
    lzma_rs::xz_decompress(&mut &TOKENIZER_XZ[..], &mut json).expect("the fixture unpacks");
    let hash: String = Sha256::digest(&json)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(hash, TOKENIZER_SHA256, "tokenizer.json is Qwen3's");
    std::fs::write(dir.join("tokenizer.json"), json).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), TOKENIZER_CONFIG).unwrap();
}

/// GSM8K-style lines: a question and a worked answer ending in `#### N`
/// (a different question for each `i`).
fn gsm8k_line(i: u32) -> String {
    let (a, b) = (3 + i, 4 + i % 5);
    json!({
        "question": format!("Tom has {a} apples and buys {b} more. How many apples does Tom have now?"),
        "answer": format!("Tom has {a}+{b} = <<{a}+{b}={}>>{} apples.\n#### {}", a + b, a + b, a + b),
    })
    .to_string()
}

/// The shipped config with its paths pointed at the test's files and its
/// sizes made CPU-sized; every other setting (flow, task format, reward,
/// template flags, schedule) is the shipped one.
fn test_config(model: &Path, train: &Path, test: &Path) -> String {
    let mut c: toml::Table = toml::from_str(CONFIG).expect("the shipped config parses");
    let set = |c: &mut toml::Table, table: &str, key: &str, v: toml::Value| {
        c.get_mut(table)
            .and_then(|t| t.as_table_mut())
            .unwrap_or_else(|| panic!("[{table}] in the shipped config"))
            .insert(key.into(), v);
    };
    let path = |p: &Path| toml::Value::String(p.display().to_string());
    set(&mut c, "model", "path", path(model));
    set(&mut c, "task", "path", path(train));
    set(&mut c, "task", "heldout_path", path(test));
    set(&mut c, "run", "device", "cpu".into());
    set(&mut c, "run", "steps", 2.into());
    set(&mut c, "run", "eval_every", 1.into());
    set(&mut c, "run", "eval_size", 3.into());
    set(&mut c, "run", "eval_pass_k", 2.into());
    set(&mut c, "rollout", "prompts_per_step", 2.into());
    set(&mut c, "rollout", "group_size", 2.into());
    set(&mut c, "rollout", "max_new_tokens", 12.into());
    toml::to_string(&c).unwrap()
}

fn jetd() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_jetd"))
}

#[test]
fn qwen3_gsm8k_config_runs_end_to_end_on_the_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("Qwen3-tiny");
    std::fs::create_dir(&model).unwrap();
    write_model(&model);
    write_tokenizer(&model);
    let (train, test) = (
        tmp.path().join("train.jsonl"),
        tmp.path().join("test.jsonl"),
    );
    let lines = |r: std::ops::Range<u32>| r.map(gsm8k_line).collect::<Vec<_>>().join("\n") + "\n";
    std::fs::write(&train, lines(0..12)).unwrap();
    // Held out: three new questions and one that is also in train.jsonl.
    std::fs::write(&test, lines(40..43) + &gsm8k_line(0) + "\n").unwrap();

    // The tokenizer and chat template as HF's give them (ids from Python's
    // `tokenizers` with the template rendered by Jinja2, see the fixture README).
    let tok = jet_backend::tokenizer::Tokenizer::from_dir(&model).unwrap();
    let q = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?";
    let prompt = tok.render_prompt_with(q, Some(false)).unwrap();
    assert_eq!(
        prompt,
        format!("<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    );
    let ids = tok.encode(&prompt, true).unwrap();
    assert_eq!(
        ids,
        [
            151644, 872, 198, 45, 4212, 685, 6088, 26111, 311, 220, 19, 23, 315, 1059, 4780, 304,
            5813, 11, 323, 1221, 1340, 6088, 4279, 438, 1657, 26111, 304, 3217, 13, 2585, 1657,
            26111, 1521, 41601, 685, 4559, 30055, 304, 5813, 323, 3217, 30, 151645, 198, 151644,
            77091, 198, 151667, 271, 151668, 271
        ]
    );
    assert_eq!(
        tok.encode("Hello world! #### 72", true).unwrap(),
        [9707, 1879, 0, 26274, 220, 22, 17]
    );
    assert_eq!(
        tok.end_token_id(),
        Some(151645),
        "<|im_end|> ends a response"
    );
    // Thinking left to the template's default: no empty think block.
    assert!(tok
        .render_prompt_with(q, None)
        .unwrap()
        .ends_with("<|im_start|>assistant\n"));

    // GSM8K answers: the reference after ####, the model's final number.
    use jet_backend::tasks::Task;
    let task = jet_backend::tasks::JsonlTask::with_heldout_file(
        &train,
        &test,
        jet_backend::tasks::DatasetFormat::Gsm8k,
        0,
        "{question}",
    )
    .unwrap();
    assert_eq!((task.train_size(), task.heldout_size()), (11, 4));
    let p = task.heldout_problem(0);
    assert_eq!(p.answer, "47");
    for (response, correct) in [
        ("43 + 4 = 47 apples.\n#### 47", true),
        ("He has 43+4=47 apples, so the answer is 47.", true),
        ("The answer is $\\boxed{47}$", true),
        ("#### 1,047", false),
        ("47 apples? No: #### 48", false),
        ("I do not know", false),
    ] {
        assert_eq!(task.verify(&p, response).correct, correct, "{response:?}");
    }

    // The shipped config, shrunk, through `jetd run`.
    let cfg = tmp.path().join("qwen3-gsm8k.toml");
    std::fs::write(&cfg, test_config(&model, &train, &test)).unwrap();
    let metrics = tmp.path().join("metrics.jsonl");
    let out = Command::new(jetd())
        .arg("run")
        .arg(&cfg)
        .arg("--metrics-out")
        .arg(&metrics)
        .arg("--data-dir")
        .arg(tmp.path().join("data"))
        .env_remove("JET_KERNEL_CACHE_DIR")
        .output()
        .unwrap();
    let log =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "jetd run failed:\n{log}");
    let mut text = String::new();
    std::fs::File::open(&metrics)
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    let rl: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|m| m["phase"] == "rl")
        .collect();
    assert_eq!(rl.len(), 2, "{text}");
    for m in &rl {
        assert_eq!(m["flow"], "fp8");
        // Evaluated on the held-out file at every step (eval_every = 1).
        let h = m["heldout_accuracy"].as_f64().expect("held-out accuracy");
        let pk = m["heldout_pass_at_k"].as_f64().expect("pass@k");
        assert_eq!(m["heldout_pass_k"], 2);
        assert!((0.0..=1.0).contains(&h) && (0.0..=1.0).contains(&pk), "{m}");
        assert!(m["response_len_mean"].as_f64().unwrap() <= 12.0, "{m}");
        // Jet's point: rollout and trainer agree exactly in the fp8 flow.
        assert_eq!(m["mismatch_kl"], 0.0, "{m}");
        assert!(m["loss"].as_f64().unwrap().is_finite(), "{m}");
    }
    assert!(
        log.contains("left out of training"),
        "the duplicate is reported:\n{log}"
    );
    // The final model is saved in HF layout with the tokenizer beside it.
    let saved = std::fs::read_dir(tmp.path().join("data"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("final"))
        .find(|p| p.join("model.safetensors").exists())
        .expect("a final model folder");
    assert!(saved.join("config.json").exists() && saved.join("tokenizer.json").exists());
}
