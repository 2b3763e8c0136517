//! The jetctl binary against a fake jetd: output, exit status, error messages.

mod common;

use std::process::{Command, Output};

fn jetctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_jetctl"))
        .args(args)
        .output()
        .expect("jetctl runs")
}

fn text(o: &Output) -> (String, String, i32) {
    (
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
        o.status.code().unwrap_or(-1),
    )
}

#[test]
fn daemon_not_running() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (out, err, code) = text(&jetctl(&["--data-dir", d, "runs"]));
    assert_eq!(code, 3);
    assert!(out.is_empty());
    assert_eq!(
        err,
        format!("jetctl: jetd is not running (no socket at {d}/jetd.sock)\n")
    );
}

#[test]
fn default_socket_is_runs_jetd_sock() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_jetctl"))
        .arg("runs")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let (_, err, code) = text(&o);
    assert_eq!(
        (err.as_str(), code),
        (
            "jetctl: jetd is not running (no socket at runs/jetd.sock)\n",
            3
        )
    );
}

#[test]
fn runs_status_pause_and_unknown_run() {
    let f = common::daemon();
    let d = f.dir.path().to_str().unwrap();
    let (out, _, code) = text(&jetctl(&["--data-dir", d, "runs"]));
    assert_eq!(code, 0);
    assert!(
        out.starts_with(
            "ID      NAME       STATE    FLOW  DEVICE    STEP  REWARD  HELDOUT  LAST ALARM\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("r-0003  arith-fp8  running  fp8   gpu 1   12/200   0.512        -  -"),
        "{out}"
    );
    let (out, _, code) = text(&jetctl(&["--data-dir", d, "runs", "--json"]));
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["id"], "r-0003");
    let (out, _, code) = text(&jetctl(&[
        "--socket",
        f.socket.to_str().unwrap(),
        "pause",
        "r-0003",
    ]));
    assert_eq!(
        (out.as_str(), code),
        ("r-0003: paused at step 12; state paused\n", 0)
    );
    let (out, err, code) = text(&jetctl(&["--data-dir", d, "status", "r-9"]));
    assert_eq!(
        (out.as_str(), err.as_str(), code),
        ("", "jetctl: no run named 'r-9'\n", 1)
    );
    let (out, _, _) = text(&jetctl(&["--data-dir", d, "status", "r-0003"]));
    assert!(out.contains("state             running\n"), "{out}");
    assert!(out.contains("device            gpu 1\n"), "{out}");
}

#[test]
fn rollback_to_a_missing_step_prints_the_servers_message() {
    let f = common::daemon();
    let d = f.dir.path().to_str().unwrap();
    let (_, err, code) = text(&jetctl(&[
        "--data-dir",
        d,
        "rollback",
        "r-0003",
        "--step",
        "99",
    ]));
    assert_eq!(code, 1);
    assert_eq!(
        err,
        "jetctl: run r-0003 has no checkpoint at step 99 (checkpoints: 0, 10)\n"
    );
    let (out, _, code) = text(&jetctl(&[
        "--data-dir",
        d,
        "rollback",
        "r-0003",
        "--step",
        "10",
    ]));
    assert_eq!(
        (out.as_str(), code),
        ("r-0003: rolled back to step 10; now running\n", 0)
    );
    let (_, err, code) = text(&jetctl(&["--data-dir", d, "rollback", "r-0003"]));
    assert_eq!(code, 2, "clap wants --step: {err}");
}

#[test]
fn metrics_formats() {
    let f = common::daemon();
    let d = f.dir.path().to_str().unwrap();
    let (out, _, code) = text(&jetctl(&[
        "--data-dir",
        d,
        "metrics",
        "r-0003",
        "--format",
        "csv",
    ]));
    assert_eq!(code, 0);
    assert_eq!(out, "phase,step,branch,abandoned,flow,reward_mean,mismatch_kl\nrl,1,0,false,fp8,0.25,0.0\nrl,2,0,false,fp8,0.5,0.0\n");
    let (out, _, _) = text(&jetctl(&[
        "--data-dir",
        d,
        "metrics",
        "r-0003",
        "--format",
        "jsonl",
        "--from",
        "2",
    ]));
    assert_eq!(out.lines().count(), 1);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["step"], 2);
    let (out, _, _) = text(&jetctl(&["--data-dir", d, "metrics", "r-0003"]));
    assert!(out.starts_with("PHASE  STEP  BR  REWARD"), "{out}");
}

#[test]
fn submit_sends_the_config_inline_with_its_absolute_path() {
    let f = common::daemon();
    let cfg = f.dir.path().join("tiny.toml");
    std::fs::write(&cfg, "[model]\narch = \"qwen3\"\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_jetctl"))
        .args([
            "--socket",
            f.socket.to_str().unwrap(),
            "submit",
            "tiny.toml",
            "--steps",
            "5",
        ])
        .current_dir(f.dir.path())
        .output()
        .unwrap();
    let (out, err, code) = text(&o);
    assert_eq!(
        (out.as_str(), code),
        ("submitted r-0004 (arith-fp8): fp8, 5 RL steps\n", 0),
        "{err}"
    );
    let (_, err, code) = text(&jetctl(&[
        "--socket",
        f.socket.to_str().unwrap(),
        "submit",
        "/no/such.toml",
    ]));
    assert_eq!(code, 2);
    assert!(
        err.starts_with("jetctl: cannot read config /no/such.toml: "),
        "{err}"
    );
}

#[test]
fn console_without_a_terminal_says_so() {
    let (_, err, code) = text(&jetctl(&["--socket", "/nonexistent.sock"]));
    assert_eq!(code, 1);
    assert!(err.contains("the console needs a terminal"), "{err}");
}
