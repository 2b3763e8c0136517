//! A fake jetd: a Unix socket in a temp dir that speaks the protocol with canned answers.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::thread;

use jet_proto::{Op, Request};
use serde_json::{json, Value};

pub const HELLO: &str = r#"{"hello":{"protocol":1,"server":"jetd 0.1.0","auth_required":false}}"#;

/// What the fake server does with one request.
pub enum Answer {
    /// Send these lines (replies, pushes) in order.
    Lines(Vec<String>),
    /// Say nothing.
    Silence,
    /// Close the connection.
    Hangup,
}

pub fn ok(id: u64, result: Value) -> String {
    json!({"id": id, "ok": true, "result": result}).to_string()
}

pub fn err(id: u64, code: &str, message: &str) -> String {
    json!({"id": id, "ok": false, "error": {"code": code, "message": message}}).to_string()
}

pub fn run_info(id: &str, state: &str) -> Value {
    json!({"id": id, "name": "arith-fp8", "state": state, "flow": "fp8", "step": 12, "steps": 200,
           "sft_step": 20, "sft_steps": 20, "reward_mean": 0.5125, "heldout_accuracy": null,
           "last_alarm": null, "mismatch_kl_alarm": 0.01, "created_unix": 1767225600, "message": null,
           "device": "cuda", "gpu": 1})
}

pub struct Fake {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
}

/// Start a fake server that sends `hello` on each connection and answers each
/// request with `handler`. It serves connections until the test ends.
pub fn serve(hello: &str, handler: impl Fn(&Request) -> Answer + Send + Sync + 'static) -> Fake {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("jetd.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let hello = hello.to_string();
    let handler = std::sync::Arc::new(handler);
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let hello = hello.clone();
            let handler = handler.clone();
            thread::spawn(move || {
                if writeln!(stream, "{hello}").is_err() {
                    return;
                }
                let reader = BufReader::new(stream.try_clone().unwrap());
                for line in reader.lines() {
                    let Ok(line) = line else { return };
                    let req = match jet_proto::parse_request(&line) {
                        Ok(r) => r,
                        Err((id, code, msg)) => {
                            let _ = writeln!(stream, "{}", err(id.unwrap_or(0), code, &msg));
                            continue;
                        }
                    };
                    match handler(&req) {
                        Answer::Lines(ls) => {
                            for l in ls {
                                if writeln!(stream, "{l}").is_err() {
                                    return;
                                }
                            }
                        }
                        Answer::Silence => {}
                        Answer::Hangup => return,
                    }
                }
            });
        }
    });
    Fake { dir, socket }
}

/// A daemon with one run r-0003 and realistic answers.
pub fn daemon() -> Fake {
    serve(HELLO, |req| {
        let id = req.id;
        let unknown = |run: &str| {
            Answer::Lines(vec![err(
                id,
                "unknown_run",
                &format!("no run named '{run}'"),
            )])
        };
        match &req.op {
            Op::Runs => Answer::Lines(vec![ok(id, json!([run_info("r-0003", "running")]))]),
            Op::Status { run } | Op::Pause { run } | Op::Resume { run } | Op::Stop { run }
                if run != "r-0003" =>
            {
                unknown(run)
            }
            Op::Status { .. } => Answer::Lines(vec![ok(id, run_info("r-0003", "running"))]),
            Op::Pause { .. } => Answer::Lines(vec![ok(id, run_info("r-0003", "paused"))]),
            Op::Rollback { step, .. } if *step != 10 => Answer::Lines(vec![err(
                id,
                "no_checkpoint",
                &format!("run r-0003 has no checkpoint at step {step} (checkpoints: 0, 10)"),
            )]),
            Op::Rollback { .. } => Answer::Lines(vec![ok(id, run_info("r-0003", "running"))]),
            Op::Metrics { from, .. } => {
                let all = [
                    json!({"phase":"rl","step":1,"flow":"fp8","reward_mean":0.25,"mismatch_kl":0.0,"branch":0,"abandoned":false}),
                    json!({"phase":"rl","step":2,"flow":"fp8","reward_mean":0.5,"mismatch_kl":0.0,"branch":0,"abandoned":false}),
                ];
                let ms: Vec<Value> = all
                    .into_iter()
                    .filter(|m| m["step"].as_u64() >= *from)
                    .collect();
                Answer::Lines(vec![ok(id, json!(ms))])
            }
            Op::Submit {
                config,
                config_path,
                steps,
                ..
            } => {
                let good = config.as_deref().is_some_and(|c| c.contains("[model]"))
                    && config_path
                        .as_deref()
                        .is_some_and(|p| p.starts_with('/') && p.ends_with("tiny.toml"));
                if good {
                    let mut r = run_info("r-0004", "queued");
                    r["steps"] = json!(steps.unwrap_or(200));
                    Answer::Lines(vec![ok(id, r)])
                } else {
                    Answer::Lines(vec![err(
                        id,
                        "bad_config",
                        "config missing or not absolute",
                    )])
                }
            }
            _ => Answer::Lines(vec![err(id, "bad_request", "not in this fake")]),
        }
    })
}
