//! End to end against real `jetd serve` processes: submit, subscribe, pause,
//! checkpoint, kill -9 at several points, restart, rollback, automatic
//! rollback after an injected NaN, bad input; with assertions on the store.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod support;
use support::strip;

const BASE: &str = include_str!("../configs/tiny-arith.toml");

/// The tiny config, shortened for tests.
fn config(rl_steps: u64, extra: &str) -> String {
    let c = BASE
        .replace("steps = 100 ", &format!("steps = {rl_steps} "))
        .replace("eval_size = 200", "eval_size = 16")
        .replace("prompts_per_step = 16", "prompts_per_step = 6")
        .replace("group_size = 8", "group_size = 4")
        .replace("steps = 500", "steps = 12")
        .replace(
            "tokenizer = \"tiny-arith.tokenizer.json\"",
            &format!(
                "tokenizer = {:?}",
                repo().join("configs/tiny-arith.tokenizer.json")
            ),
        );
    format!("{c}\n[checkpoint]\nevery = 2\nkeep_last = 50\n{extra}")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Daemon {
    fn start(dir: &Path) -> Daemon {
        Self::start_with(dir, &[])
    }
    fn start_with(dir: &Path, extra: &[&str]) -> Daemon {
        let child = Command::new(env!("CARGO_BIN_EXE_jetd"))
            .args(["serve", "--data-dir"])
            .arg(dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let d = Daemon {
            child,
            dir: dir.to_path_buf(),
        };
        let t0 = Instant::now();
        while UnixStream::connect(d.socket()).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(30), "jetd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }
    fn socket(&self) -> PathBuf {
        self.dir.join("jetd.sock")
    }
    fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
    fn sigterm(mut self) -> std::process::ExitStatus {
        // SAFETY: sending a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Client {
    rd: BufReader<UnixStream>,
    wr: UnixStream,
    id: u64,
    pushes: Vec<Value>,
}

impl Client {
    fn connect(d: &Daemon) -> Client {
        let s = UnixStream::connect(d.socket()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut c = Client {
            rd: BufReader::new(s.try_clone().unwrap()),
            wr: s,
            id: 0,
            pushes: vec![],
        };
        let hello = c.line();
        assert_eq!(hello["hello"]["protocol"], 1, "{hello}");
        c
    }
    fn line(&mut self) -> Value {
        let mut l = String::new();
        self.rd.read_line(&mut l).unwrap();
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}"))
    }
    fn raw(&mut self, text: &str) -> Value {
        self.wr.write_all(text.as_bytes()).unwrap();
        self.wr.write_all(b"\n").unwrap();
        loop {
            let v = self.line();
            if v.get("push").is_some() {
                self.pushes.push(v);
                continue;
            }
            return v;
        }
    }
    fn req(&mut self, mut r: Value) -> Value {
        self.id += 1;
        r["id"] = self.id.into();
        let v = self.raw(&r.to_string());
        assert_eq!(v["id"], self.id, "reply echoes the id");
        v
    }
    fn ok(&mut self, r: Value) -> Value {
        let v = self.req(r.clone());
        assert_eq!(v["ok"], true, "{r} -> {v}");
        v["result"].clone()
    }
    fn status(&mut self, run: &str) -> Value {
        self.ok(json!({"op": "status", "run": run}))
    }
    fn wait_for(&mut self, run: &str, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        let t0 = Instant::now();
        loop {
            let s = self.status(run);
            if f(&s) {
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(300),
                "timed out waiting for {what}: {s}"
            );
            std::thread::sleep(Duration::from_millis(30));
        }
    }
}

fn live_rl(metrics: &Value) -> Vec<Value> {
    metrics
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["phase"] == "rl" && m["abandoned"] == false)
        .map(strip)
        .collect()
}

/// The same config run by `jetd run` in the foreground: the reference metrics.
fn reference_metrics(cfg: &str, dir: &Path) -> Vec<Value> {
    let p = dir.join("ref.toml");
    std::fs::write(&p, cfg).unwrap();
    let m = dir.join("ref.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_jetd"))
        .arg("run")
        .arg(&p)
        .arg("--metrics-out")
        .arg(&m)
        .arg("--data-dir")
        .arg(dir.join("refdata"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(&m)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|m| m["phase"] == "rl")
        .map(|m| strip(&m))
        .collect()
}

fn assert_catalog_whole(c: &mut Client, run: &str) {
    let cks = c.ok(json!({"op": "checkpoints", "run": run}));
    for ck in cks.as_array().unwrap() {
        let dir = Path::new(ck["path"].as_str().unwrap());
        for f in [
            "config.json",
            "model.safetensors",
            "optimizer.safetensors",
            "state.json",
        ] {
            assert!(
                dir.join(f).is_file(),
                "catalogued checkpoint {} lacks {f}",
                dir.display()
            );
        }
        assert_eq!(ck["health"], "ok");
    }
}

#[test]
fn crash_restart_rollback_and_bad_input() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let cfg = config(10, "");
    let reference = reference_metrics(&cfg, tmp.path());
    assert_eq!(reference.len(), 10);

    // Submit, subscribe, pause, resume, checkpoint on demand.
    let d = Daemon::start(&data);
    let mut c = Client::connect(&d);
    let run = c.ok(json!({"op": "submit", "config": cfg, "name": "e2e"}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let snap = c.ok(json!({"op": "subscribe", "run": run}));
    assert!(snap["runs"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["id"] == run.as_str()));
    assert!(snap["gpus"].is_null() || snap["gpus"].is_array());
    c.wait_for(&run, "RL step 2", |s| s["step"].as_u64().unwrap() >= 2);
    c.ok(json!({"op": "pause", "run": run}));
    c.wait_for(&run, "paused", |s| s["state"] == "paused");
    let paused_at = c.status(&run)["step"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        c.status(&run)["step"].as_u64().unwrap(),
        paused_at,
        "a paused run does not compute"
    );
    assert!(
        c.pushes.iter().any(|p| p["push"] == "metrics"),
        "live metrics were pushed"
    );
    c.ok(json!({"op": "resume", "run": run}));
    c.wait_for(&run, "running", |s| s["state"] == "running");
    let ck = c.req(json!({"op": "checkpoint", "run": run}));
    assert!(
        ck["ok"] == true || ck["error"]["code"] == "bad_state",
        "{ck}"
    );
    assert_catalog_whole(&mut c, &run);

    // kill -9 at several points, restart each time.
    let mut d = d;
    for k in 0..3 {
        c.wait_for(&run, "progress", |s| {
            s["step"].as_u64().unwrap() >= 3 + 2 * k || s["state"] == "finished"
        });
        d.kill9();
        d = Daemon::start(&data);
        c = Client::connect(&d);
        assert_catalog_whole(&mut c, &run);
        // Metrics up to the last checkpoint are intact.
        let cks = c.ok(json!({"op": "checkpoints", "run": run}));
        let last = cks
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["phase"] == "rl")
            .map(|x| x["step"].as_u64().unwrap())
            .max()
            .unwrap_or(0);
        let m = live_rl(&c.ok(json!({"op": "metrics", "run": run})));
        assert!(
            m.len() as u64 >= last.min(10),
            "metrics up to step {last} survive: {}",
            m.len()
        );
        assert_eq!(
            &m[..last.min(10) as usize],
            &reference[..last.min(10) as usize]
        );
    }
    let s = c.wait_for(&run, "finished", |s| s["state"] == "finished");
    assert_eq!(s["step"], 10);
    // After the crashes, the run's steps equal those of an uninterrupted run, bit for bit.
    let live = live_rl(&c.ok(json!({"op": "metrics", "run": run})));
    assert_eq!(
        live, reference,
        "resumed run differs from the uninterrupted one"
    );

    // Rollback to step 4: metrics after it stay as an abandoned branch; the run goes on.
    let rb = c.req(json!({"op": "rollback", "run": run, "step": 4}));
    assert_eq!(rb["ok"], true, "{rb}");
    c.wait_for(&run, "finished again", |s| {
        s["state"] == "finished" && s["step"] == 10
    });
    let all = c.ok(json!({"op": "metrics", "run": run}));
    let abandoned = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["abandoned"] == true && m["phase"] == "rl")
        .count();
    assert!(
        abandoned >= 6,
        "steps 4..9 of the first branch are kept, marked: {abandoned}"
    );
    assert_eq!(
        live_rl(&all),
        reference,
        "steps from a rollback replay bit for bit"
    );
    let evs = c.ok(json!({"op": "events", "run": run}));
    assert!(evs
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kind"] == "rollback"));

    // Bad input: each gets an error reply and the daemon stays up.
    let bad = [
        ("{not json", "bad_frame"),
        (r#"{"id": 5, "op": "explode"}"#, "unknown_op"),
        (r#"{"op": "runs"}"#, "bad_request"),
        (r#"{"id": 6, "op": "rollback", "run": "x"}"#, "bad_request"),
        (r#"{"id": 7, "op": "status", "run": "nope"}"#, "unknown_run"),
        (
            r#"{"id": 8, "op": "submit", "config": "[run]\nsteps = \"many\""}"#,
            "bad_config",
        ),
    ];
    for (frame, code) in bad {
        let r = c.raw(frame);
        assert_eq!(r["ok"], false, "{frame}");
        assert_eq!(r["error"]["code"], code, "{frame} -> {r}");
    }
    let r = c.req(json!({"op": "rollback", "run": run, "step": 999}));
    assert_eq!(r["error"]["code"], "no_checkpoint", "{r}");
    let r = c.raw(&format!(
        r#"{{"id": 9, "op": "runs", "pad": "{}"}}"#,
        "x".repeat(jet_proto::MAX_FRAME + 10)
    ));
    assert_eq!(r["error"]["code"], "too_large");
    // Random frames.
    let mut s = 12345u64;
    for _ in 0..300 {
        let len = (s % 80) as usize;
        let frame: String = (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                b"{}[]\":,0123456789abcdefopidrunsteptruefalsenull \\"[(s >> 33) as usize % 44]
                    as char
            })
            .collect();
        let frame = frame.replace('\n', " ");
        if frame.trim().is_empty() {
            continue;
        }
        let r = c.raw(&frame);
        assert!(r.get("ok").is_some(), "{frame:?} -> {r}");
    }
    assert!(
        c.ok(json!({"op": "runs"})).as_array().unwrap().len() == 1,
        "daemon still up after garbage"
    );

    // A corrupt checkpoint is refused and marked bad.
    let cks = c.ok(json!({"op": "checkpoints", "run": run}));
    let ck6 = cks
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|x| x["step"] == 6 && x["phase"] == "rl")
        .unwrap()
        .clone();
    let f = Path::new(ck6["path"].as_str().unwrap()).join("model.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0xff;
    std::fs::write(&f, bytes).unwrap();
    let r = c.req(json!({"op": "rollback", "run": run, "step": 6}));
    assert_eq!(r["error"]["code"], "bad_checkpoint", "{r}");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("model.safetensors"));
    let cks = c.ok(json!({"op": "checkpoints", "run": run}));
    assert!(cks.as_array().unwrap().iter().any(|x| x["health"] == "bad"));

    // SIGTERM: finish the step, checkpoint, exit 0.
    let run2 = c.ok(json!({"op": "submit", "config": config(40, ""), "name": "term"}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    c.wait_for(&run2, "RL step 1", |s| s["step"].as_u64().unwrap() >= 1);
    drop(c);
    let status = d.sigterm();
    assert!(status.success(), "jetd exits 0 on SIGTERM: {status:?}");
    let d = Daemon::start(&data);
    let mut c = Client::connect(&d);
    let s = c.status(&run2);
    let cks = c.ok(json!({"op": "checkpoints", "run": run2}));
    let last = cks.as_array().unwrap().last().unwrap().clone();
    assert!(last["step"].as_u64().unwrap() >= 1);
    assert!(s["state"] == "running" || s["state"] == "queued", "{s}");
    c.ok(json!({"op": "stop", "run": run2}));
    c.wait_for(&run2, "stopped", |s| s["state"] == "stopped");
}

/// One HTTP/1.1 request to jetd's metrics address: (status line, head, body).
fn http_get(addr: &str, path: &str) -> (String, String, String) {
    use std::io::Read;
    let t0 = Instant::now();
    let mut s = loop {
        match std::net::TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(e) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "no metrics listener at {addr}: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP head");
    let status = head.lines().next().unwrap_or("").to_string();
    (status, head.to_string(), body.to_string())
}

/// The value of the sample `series` (name and labels exactly as written).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn injected_nan_rolls_back_automatically_and_prometheus_sees_it() {
    let tmp = tempfile::tempdir().unwrap();
    // A port of its own (the TCP test below takes pid-derived ports too).
    let addr = format!("127.0.0.1:{}", 20000 + (std::process::id() % 20000) as u16);
    let d = Daemon::start_with(&tmp.path().join("data"), &["--metrics-addr", &addr]);
    let mut c = Client::connect(&d);
    let cfg = config(8, "[debug]\ninject_nan_at_step = 5\n");
    let run = c.ok(json!({"op": "submit", "config": cfg}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let s = c.wait_for(&run, "finished", |s| {
        s["state"] == "finished" || s["state"] == "paused" || s["state"] == "failed"
    });
    assert_eq!(s["state"], "finished", "{s}");
    let evs = c.ok(json!({"op": "events", "run": run}));
    let kinds: Vec<&str> = evs
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"alarm.nan"), "{kinds:?}");
    assert!(kinds.contains(&"rollback"), "{kinds:?}");
    let live = live_rl(&c.ok(json!({"op": "metrics", "run": run})));
    assert_eq!(live.len(), 8);
    assert!(
        live.iter()
            .all(|m| m["loss"].as_f64().is_some_and(f64::is_finite)),
        "the live branch is healthy"
    );
    let all = c.ok(json!({"op": "metrics", "run": run}));
    assert!(
        all.as_array()
            .unwrap()
            .iter()
            .any(|m| m["abandoned"] == true),
        "the NaN step is kept, abandoned"
    );

    // A Prometheus scrape: the run's newest live step, its phase times, its
    // newest evaluation, the alarm counted; every sample line parses.
    let (status, head, body) = http_get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK", "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').expect(line);
        assert!(value.parse::<f64>().is_ok(), "value of {line:?}");
        let name = series.split('{').next().unwrap();
        assert!(
            name.starts_with("jet_") && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line:?}"
        );
    }
    let l = format!("{{run=\"{run}\",flow=\"fp8\"}}");
    let last = live.last().unwrap();
    assert_eq!(
        sample(&body, &format!("jet_rl_step{l}")),
        last["step"].as_f64(),
        "{body}"
    );
    assert_eq!(
        sample(&body, &format!("jet_rl_reward_mean{l}")),
        last["reward_mean"].as_f64()
    );
    assert_eq!(sample(&body, &format!("jet_run_rl_step{l}")), Some(8.0));
    assert_eq!(sample(&body, &format!("jet_run_running{l}")), Some(0.0));
    assert!(
        sample(&body, &format!("jet_eval_heldout_accuracy{l}")).is_some(),
        "{body}"
    );
    assert!(
        sample(
            &body,
            &format!("jet_phase_seconds{{run=\"{run}\",flow=\"fp8\",phase=\"rollout\"}}")
        )
        .is_some_and(|s| s > 0.0),
        "{body}"
    );
    assert_eq!(
        sample(
            &body,
            &format!("jet_alarms_total{{run=\"{run}\",flow=\"fp8\",kind=\"nan\"}}")
        ),
        Some(1.0),
        "{body}"
    );
    assert!(body.contains("# TYPE jet_alarms_total counter"));
    assert!(sample(&body, "jet_gpus").is_some());
    let (status, _, _) = http_get(&addr, "/nope");
    assert!(status.starts_with("HTTP/1.1 404"), "{status}");
}

#[test]
fn refuses_a_world_writable_data_dir() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_jetd"))
        .args(["serve", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("world-writable"));
}

#[test]
fn tcp_needs_the_token_and_several_subscribers_all_get_pushes() {
    use std::net::TcpStream;
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, "s3cret-token-0123456789\n").unwrap();
    let port = 40000 + (std::process::id() % 20000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let d = Daemon::start_with(
        &tmp.path().join("data"),
        &["--tcp", &addr, "--token-file", token_file.to_str().unwrap()],
    );

    // TCP: hello says auth is required; nothing works before the right token.
    let t0 = Instant::now();
    let tcp = loop {
        match TcpStream::connect(&addr) {
            Ok(s) => break s,
            Err(e) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "no TCP listener: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut rd = BufReader::new(tcp.try_clone().unwrap());
    let mut wr = tcp;
    let mut first = String::new();
    rd.read_line(&mut first).unwrap();
    let hello: Value = serde_json::from_str(&first).unwrap();
    let mut ask = |line: &str| -> Value {
        wr.write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut l = String::new();
        rd.read_line(&mut l).unwrap();
        serde_json::from_str(&l).unwrap()
    };
    assert_eq!(hello["hello"]["auth_required"], true, "{hello}");
    assert_eq!(
        ask(r#"{"id":1,"op":"runs"}"#)["error"]["code"],
        "unauthorized"
    );
    assert_eq!(
        ask(r#"{"id":2,"op":"auth","token":"wrong"}"#)["error"]["code"],
        "unauthorized"
    );
    assert_eq!(
        ask(r#"{"id":3,"op":"auth","token":"s3cret-token-0123456789"}"#)["ok"],
        true
    );
    assert_eq!(ask(r#"{"id":4,"op":"runs"}"#)["ok"], true);

    // Three Unix clients subscribe at once; all of them see the run's metrics.
    let mut subs: Vec<Client> = (0..3).map(|_| Client::connect(&d)).collect();
    let mut c = Client::connect(&d);
    let run = c.ok(json!({"op": "submit", "config": config(4, "")}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    for s in &mut subs {
        s.ok(json!({"op": "subscribe", "run": run}));
    }
    c.wait_for(&run, "finished", |s| s["state"] == "finished");
    for (i, s) in subs.iter_mut().enumerate() {
        let mut rl = 0;
        while rl < 4 {
            let v = s.line();
            if v["push"] == "metrics" && v["metrics"]["phase"] == "rl" {
                rl += 1;
            }
        }
        assert_eq!(rl, 4, "subscriber {i}");
    }
}
