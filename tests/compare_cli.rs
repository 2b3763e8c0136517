//! End to end: `jetd compare` on a shortened tiny long-horizon config gives,
//! per flow, the per-length buckets in its JSON summary and in every RL step of
//! the metrics files, and they agree.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// configs/tiny-longhorizon.toml cut to seconds: a short warm-up leaves the
/// model half-trained, so its response lengths spread over several buckets.
fn short_config(dir: &Path) -> std::path::PathBuf {
    let tok = repo().join("configs/tiny-arith.tokenizer.json");
    let mut doc: toml::Table =
        std::fs::read_to_string(repo().join("configs/tiny-longhorizon.toml"))
            .unwrap()
            .parse()
            .unwrap();
    doc["model"]["tokenizer"] = tok.display().to_string().into();
    doc["run"]["eval_size"] = 8.into();
    doc["run"]["eval_every"] = 1.into();
    doc["rollout"]["prompts_per_step"] = 4.into();
    doc["rollout"]["group_size"] = 4.into();
    doc["sft"]["steps"] = 10.into();
    doc["sft"]["batch"] = 8.into();
    let p = dir.join("short.toml");
    std::fs::write(&p, toml::to_string(&doc).unwrap()).unwrap();
    p
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap()
}

#[test]
fn compare_reports_mismatch_and_accuracy_per_length_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = short_config(dir.path());
    let metrics = dir.path().join("m");
    let out = Command::new(env!("CARGO_BIN_EXE_jetd"))
        .arg("compare")
        .arg(&cfg)
        .args(["--steps", "2", "--json", "--metrics-dir"])
        .arg(&metrics)
        .arg("--data-dir")
        .arg(dir.path())
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "jetd compare failed: {err}");
    let summary: Value = serde_json::from_slice(&out.stdout).expect("--json prints one object");
    let flows = summary["flows"].as_array().unwrap();
    assert_eq!(flows.len(), 3);
    let mut spread = 0;
    for f in flows {
        let name = f["flow"].as_str().unwrap();
        let buckets = f["by_length"].as_array().unwrap();
        // Every sample of both steps is in exactly one bucket.
        assert_eq!(
            buckets.iter().map(|b| u(&b["responses"])).sum::<u64>(),
            2 * 16
        );
        for b in buckets {
            let (lo, hi) = (u(&b["lo"]), u(&b["hi"]));
            assert!(lo == 0 && hi == 16 || hi == 2 * lo && lo.is_power_of_two());
            assert!(u(&b["tokens"]) >= lo * u(&b["responses"]));
            assert!(u(&b["tokens"]) < hi * u(&b["responses"]));
            let acc = b["accuracy"].as_f64().unwrap();
            assert_eq!(acc, u(&b["correct"]) as f64 / u(&b["responses"]) as f64);
        }
        let kl: Vec<f64> = buckets
            .iter()
            .map(|b| b["kl_mean"].as_f64().unwrap())
            .collect();
        match name {
            // Rollout and training are the same computation: zero in every bucket.
            "fp8" | "bf16" => assert!(kl.iter().all(|&k| k == 0.0), "{name}: {kl:?}"),
            _ => assert!(kl.iter().all(|&k| k > 0.0), "{name}: {kl:?}"),
        }
        spread += (buckets.len() > 1) as usize;
        assert_eq!(f["heldout"].as_array().unwrap().len(), 2, "eval_every 1");

        // The metrics file carries the same buckets, step by step.
        let text = std::fs::read_to_string(metrics.join(format!("{name}.jsonl"))).unwrap();
        let rl: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|v| v["phase"] == "rl")
            .collect();
        assert_eq!(rl.len(), 2);
        let mut tokens = 0.0;
        for step in &rl {
            let bs = step["mismatch_by_length"]
                .as_array()
                .expect("per-step buckets");
            let t: u64 = bs.iter().map(|b| u(&b["tokens"])).sum();
            // response_len_mean counts the same tokens.
            let mean = step["response_len_mean"].as_f64().unwrap();
            assert!((t as f64 / 16.0 - mean).abs() < 1e-9, "{t} vs {mean}");
            tokens += t as f64;
        }
        let total: u64 = buckets.iter().map(|b| u(&b["tokens"])).sum();
        assert_eq!(total as f64, tokens);
    }
    assert!(spread >= 2, "response lengths should spread over buckets");
}

#[test]
fn compare_names_a_missing_config() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_jetd"))
        .args(["compare", "no-such.toml", "--json"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such.toml"), "{err}");
}
