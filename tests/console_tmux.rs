//! End to end: a real `jetd serve`, the tiny config submitted, and `jetctl`'s
//! console driven in tmux (send-keys, capture-pane): the dashboard shows, space
//! pauses the run, b rolls it back after a confirmation, q quits.
//! Skips with a message when tmux or the jetctl binary is missing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BASE: &str = include_str!("../configs/tiny-arith.toml");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// jetctl is built next to jetd by `cargo test --workspace`.
fn jetctl() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_jetd")).with_file_name("jetctl")
}

struct Guard(Child, String);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.1])
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A jetd serving a fresh data dir (`TMP/data`) and the tmux session name the test
/// will use; None (after a message) without tmux or the jetctl binary.
fn start(prefix: &str) -> Option<(tempfile::TempDir, String, Guard)> {
    if Command::new("tmux").arg("-V").output().is_err() || !jetctl().exists() {
        eprintln!("skipping: needs tmux and the jetctl binary (cargo test --workspace builds it)");
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let daemon = Command::new(env!("CARGO_BIN_EXE_jetd"))
        .args(["serve", "--data-dir"])
        .arg(&data)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let session = format!("{prefix}-{}", std::process::id());
    let guard = Guard(daemon, session.clone());
    let t0 = Instant::now();
    while !data.join("jetd.sock").exists() {
        assert!(t0.elapsed() < Duration::from_secs(30), "jetd did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some((tmp, session, guard))
}

/// jetctl's console on `data`'s daemon in a detached 160x48 tmux session.
fn open_console(session: &str, data: &std::path::Path) {
    let cmd = format!(
        "TERM=xterm-256color {} --data-dir {}",
        jetctl().display(),
        data.display()
    );
    tmux(&[
        "new-session",
        "-d",
        "-s",
        session,
        "-x",
        "160",
        "-y",
        "48",
        &cmd,
    ]);
}

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn wait_screen(session: &str, what: &str, f: impl Fn(&str) -> bool) -> String {
    let t0 = Instant::now();
    loop {
        let s = tmux(&["capture-pane", "-p", "-t", session]);
        if f(&s) {
            return s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "timed out waiting for {what}; screen:\n{s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn status(data: &Path) -> serde_json::Value {
    let out = Command::new(jetctl())
        .arg("--data-dir")
        .arg(data)
        .args(["status", "r0001", "--json"])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

#[test]
fn console_pauses_and_rolls_back_a_real_run() {
    let Some((tmp, session, _g)) = start("jet-e2e") else {
        return;
    };
    let data = tmp.path().join("data");
    let cfg = BASE
        .replace("steps = 100 ", "steps = 400 ")
        .replace("steps = 500", "steps = 10")
        .replace("eval_size = 200", "eval_size = 16")
        .replace(
            "\"tiny-arith.tokenizer.json\"",
            &format!("{:?}", repo().join("configs/tiny-arith.tokenizer.json")),
        )
        + "\n[checkpoint]\nevery = 2\n";
    let cfg_path = tmp.path().join("tiny.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let out = Command::new(jetctl())
        .arg("--data-dir")
        .arg(&data)
        .arg("submit")
        .arg(&cfg_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    open_console(&session, &data);
    wait_screen(&session, "the runs view", |s| s.contains("r0001"));
    // Open the run once it has RL steps and a checkpoint beyond step 0.
    let t0 = Instant::now();
    while status(&data)["step"].as_u64().unwrap_or(0) < 5 {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "run made no progress"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    tmux(&["send-keys", "-t", &session, "Enter"]);
    let dash = wait_screen(&session, "the dashboard", |s| {
        s.contains("mismatch") && s.contains("reward")
    });
    std::fs::write(repo().join("target").join("dashboard-capture.txt"), &dash).ok();

    // space: pause at the next step boundary.
    tmux(&["send-keys", "-t", &session, "Space"]);
    let t0 = Instant::now();
    while status(&data)["state"] != "paused" {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "space did not pause: {}",
            status(&data)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // b: to the checkpoints view; b again: the dialog; y: confirm.
    tmux(&["send-keys", "-t", &session, "b"]);
    wait_screen(&session, "the checkpoints view", |s| {
        s.contains("pick a checkpoint") || s.contains("health")
    });
    tmux(&["send-keys", "-t", &session, "b"]);
    std::thread::sleep(Duration::from_millis(500));
    tmux(&["send-keys", "-t", &session, "y"]);
    let t0 = Instant::now();
    loop {
        let ev = Command::new(jetctl())
            .arg("--data-dir")
            .arg(&data)
            .args(["events", "r0001", "--json"])
            .output()
            .unwrap();
        let ev: serde_json::Value = serde_json::from_slice(&ev.stdout).unwrap_or_default();
        if ev
            .as_array()
            .is_some_and(|a| a.iter().any(|e| e["kind"] == "rollback"))
        {
            break;
        }
        let screen = tmux(&["capture-pane", "-p", "-t", &session]);
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "b/y did not roll back; screen:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // q: quit; the session ends.
    tmux(&["send-keys", "-t", &session, "q"]);
    let t0 = Instant::now();
    while Command::new("tmux")
        .args(["has-session", "-t", &session])
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(t0.elapsed() < Duration::from_secs(20), "q did not quit");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `jetctl ARGS --data-dir data`, its stdout; fails with its stderr.
fn jetctl_ok(data: &Path, args: &[&str]) -> String {
    let out = Command::new(jetctl())
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "jetctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two finished runs of one config in two flows; in the console, `M` marks
/// both (same name) and `5` overlays them. The Compare view's titles show the
/// numbers `jetctl compare --json` prints, and `jetctl plot` draws them.
#[test]
fn compare_view_overlays_two_real_runs() {
    let Some((tmp, session, _g)) = start("jet-cmp") else {
        return;
    };
    let data = tmp.path().join("data");
    let cfg = BASE
        .replace("steps = 100 ", "steps = 6 ")
        .replace("steps = 500", "steps = 10")
        .replace("eval_size = 200", "eval_size = 16")
        .replace("eval_every = 5 ", "eval_every = 2 ")
        .replace(
            "\"tiny-arith.tokenizer.json\"",
            &format!("{:?}", repo().join("configs/tiny-arith.tokenizer.json")),
        );
    let cfg_path = tmp.path().join("tiny.toml");
    std::fs::write(&cfg_path, cfg).unwrap();
    let cfg_arg = cfg_path.to_str().unwrap();
    for flow in ["fp8", "bf16-fp8rollout"] {
        jetctl_ok(
            &data,
            &["submit", cfg_arg, "--flow", flow, "--name", "tiny-flows"],
        );
    }
    let t0 = Instant::now();
    while ["r0001", "r0002"].iter().any(|r| {
        let s = jetctl_ok(&data, &["status", r, "--json"]);
        !s.contains("\"finished\"")
    }) {
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "the runs did not finish"
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    let json: serde_json::Value =
        serde_json::from_str(&jetctl_ok(&data, &["compare", "r0001", "r0002", "--json"])).unwrap();
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(
        (runs[0]["flow"].as_str(), runs[1]["flow"].as_str()),
        (Some("fp8"), Some("bf16-fp8rollout"))
    );
    for r in runs {
        assert_eq!(r["rl_steps"], 6, "{r}");
        assert_eq!(r["series"]["reward_mean"].as_array().unwrap().len(), 6);
    }
    // The on-policy flow has exactly zero mismatch, the off-policy one not.
    assert_eq!(runs[0]["summary"]["mismatch_kl"]["max"], 0.0);
    assert!(runs[1]["summary"]["mismatch_kl"]["max"].as_f64().unwrap() > 0.0);
    let table = jetctl_ok(&data, &["compare", "r0001", "r0002"]);
    assert!(table.contains("r0001 tiny-flows (fp8)"), "{table}");

    open_console(&session, &data);
    wait_screen(&session, "the runs view", |s| s.contains("r0002"));
    tmux(&["send-keys", "-t", &session, "M"]);
    wait_screen(&session, "both runs marked", |s| {
        s.contains("marked 2 run(s)")
    });
    tmux(&["send-keys", "-t", &session, "5"]);
    // Each chart's title lists each run's newest value: the `last` numbers.
    let short = |x: f64| {
        // The console's short form (tui/src/fmt.rs `short`) for values under 100.
        if x == 0.0 {
            "0".to_string()
        } else if x.abs() >= 1.0 {
            format!("{x:.2}")
        } else if x.abs() >= 1e-3 {
            format!("{x:.4}").trim_end_matches('0').to_string()
        } else {
            format!("{x:.1e}")
        }
    };
    let want: Vec<String> = ["reward_mean", "entropy"]
        .iter()
        .flat_map(|k| {
            runs.iter()
                .map(move |r| short(r["summary"][*k]["last"].as_f64().unwrap()))
        })
        .collect();
    let screen = wait_screen(&session, "the compare view with both runs' data", |s| {
        s.contains("mismatch_kl (log)")
            && s.contains("held-out accuracy")
            && s.contains("r0002 tiny-flows (bf16-fp8rollout)")
            && !s.contains("no data yet")
            // The legend marks a run whose history is still being fetched.
            && !s.contains("(loading)")
    });
    let titles: Vec<&str> = screen
        .lines()
        .filter(|l| l.contains("reward") || l.contains("entropy"))
        .collect();
    for w in &want {
        assert!(
            titles.iter().any(|l| l.contains(w.as_str())),
            "{w} not in the titles:\n{screen}"
        );
    }
    tmux(&["send-keys", "-t", &session, "q"]);

    // A chart for a report, from the same runs.
    let png = tmp.path().join("kl.png");
    jetctl_ok(
        &data,
        &[
            "plot",
            "r0001",
            "r0002",
            "--metric",
            "mismatch_kl",
            "--out",
            png.to_str().unwrap(),
            "--size",
            "640x400",
        ],
    );
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let dim = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!((dim(16), dim(20)), (640, 400), "IHDR width and height");
}
