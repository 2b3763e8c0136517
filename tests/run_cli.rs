//! End to end: the `jetd` binary's `run` command, its outputs and its errors.

use std::path::Path;
use std::process::Command;

fn jetd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_jetd"))
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

#[test]
fn run_writes_metrics_and_a_loadable_model() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = dir.path().join("m.jsonl");
    let out = jetd()
        .args([
            "run",
            "configs/tiny-arith.toml",
            "--steps",
            "2",
            "--seed",
            "4",
            "--metrics-out",
        ])
        .arg(&metrics)
        .arg("--data-dir")
        .arg(dir.path())
        .current_dir(repo())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "jetd run failed: {err}");
    assert!(
        err.contains("rl     2/2"),
        "one progress line per step: {err}"
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let rl: Vec<_> = lines.iter().filter(|v| v["phase"] == "rl").collect();
    assert_eq!(rl.len(), 2);
    assert!(lines.iter().filter(|v| v["phase"] == "sft").count() > 0);
    assert!(
        rl.iter().all(|v| v["mismatch_kl"] == 0.0),
        "fp8 flow on the CPU: zero mismatch"
    );
    let saved = dir.path().join("tiny-arith-fp8-seed4/final");
    let (cfg, _) = jet_backend::model::load_model(&saved).expect("the saved model loads");
    assert_eq!(cfg.vocab_size, 17);
    assert!(saved.join("tokenizer.json").exists());
}

fn run_config(text: &str) -> (bool, String) {
    let tok = repo().join("configs/tiny-arith.tokenizer.json");
    let text = &text.replace("\"tiny-arith.tokenizer.json\"", &format!("{tok:?}"));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, text).unwrap();
    // A config that is accepted by mistake must not leave its run in the source
    // tree: everything goes under the temporary folder.
    let out = jetd()
        .arg("run")
        .arg(&p)
        .args(["--steps", "1", "--data-dir"])
        .arg(dir.path())
        .current_dir(dir.path())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const BASE: &str = include_str!("../configs/tiny-arith.toml");

#[test]
fn bad_configs_name_the_field() {
    let cases = [
        (
            BASE.replace("lr = 1e-4", "lr = 1e-4\nlrr = 1"),
            "train",
            "lrr",
        ),
        (
            BASE.replace("group_size = 8", "group_size = 1"),
            "rollout.group_size",
            "at least 2",
        ),
        (
            BASE.replace("prompts_per_step = 16", "prompts_per_step = 0"),
            "rollout.prompts_per_step",
            "at least 1",
        ),
        (
            BASE.replace("group_size = 8", "group_size = 8\nkv_cache_gib = -1"),
            "rollout.kv_cache_gib",
            "finite number >= 0",
        ),
        (
            BASE.replace("clip_low = 0.2", "clip_low = \"big\""),
            "train.clip_low",
            "invalid type",
        ),
        (
            BASE.replace("flow = \"fp8\"", "flow = \"fp4\""),
            "run.flow",
            "fp4",
        ),
        (
            BASE.replace("arch = \"qwen3\"", "arch = \"gpt2\""),
            "model.random.arch",
            "gpt2",
        ),
        (
            BASE.replace("digits = 2", "digits = 2\ncolour = 3"),
            "task",
            "colour",
        ),
        (BASE.replace("[train]", "[trian]"), "trian", "unknown field"),
    ];
    for (text, field, word) in cases {
        // A pattern that no longer matches the config would test a good config.
        assert_ne!(text, BASE, "the case for {field} changes nothing");
        let (ok, err) = run_config(&text);
        assert!(!ok, "config with a bad {field} was accepted");
        assert!(
            err.contains(field) && err.contains(word),
            "error for {field} should name it and say '{word}': {err}"
        );
        assert!(err.contains("bad.toml"), "error names the file: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn tokenizer_larger_than_the_model_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = repo().join("tests/fixtures/qwen2-tiny");
    // The fixture's tokenizer has 320 tokens; a model claiming 100 cannot embed them.
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for f in std::fs::read_dir(&fixture).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, model.join(f.file_name().unwrap())).unwrap();
    }
    let tok = dir.path().join("tok.json");
    let mut t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("tokenizer.json")).unwrap())
            .unwrap();
    let vocab = t["model"]["vocab"].as_object_mut().unwrap();
    for i in 0..100 {
        let n = vocab.len();
        vocab.insert(format!("extra{i}"), n.into());
    }
    std::fs::write(&tok, t.to_string()).unwrap();
    let text = BASE
        .replace(
            "tokenizer = \"tiny-arith.tokenizer.json\"   # character-level, 17 tokens",
            &format!("path = {:?}\ntokenizer = {:?}", model, tok),
        )
        .split("[model.random]")
        .next()
        .unwrap()
        .to_string()
        + &BASE[BASE.find("[task]").unwrap()..];
    let (ok, err) = run_config(&text);
    assert!(!ok);
    assert!(
        err.contains("vocabulary mismatch") && err.contains("420") && err.contains("320"),
        "{err}"
    );
}

/// Without CUDA (CI), asking for it fails with a message naming the field and
/// what is missing; bench refuses the CPU and bad presets by name. With CUDA
/// the run is exercised by `backend/tests/gpu_parity.rs` instead.
#[test]
fn device_errors_are_clear() {
    if jet_backend::gpu::open_gpu().is_ok() {
        println!("skipping: a CUDA device is present (gpu_parity covers --device cuda)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = jetd()
        .args([
            "run",
            "configs/tiny-arith.toml",
            "--steps",
            "1",
            "--device",
            "cuda",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .current_dir(repo())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("run.device") && err.contains("cuda"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for (args, want) in [
        (vec!["bench", "--device", "cpu"], "--device cpu"),
        (vec!["bench", "--preset", "qwen9"], "--preset qwen9"),
    ] {
        let out = jetd().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
