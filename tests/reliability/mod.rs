//! Shared by the reliability tests (durability, fault, protocol fuzz): start
//! and kill real `jetd serve` processes, talk to them, read their store while
//! they are down, and the reference metrics of an uninterrupted `jetd run`.
//! Unlike `tests/support` (Result-based, for the GPU check that also runs from
//! binaries carried to another machine), these helpers panic with context:
//! they serve CI tests only, where a failure should stop the test at once.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const BASE: &str = include_str!("../../configs/tiny-arith.toml");

// The repository root and the metrics stripper are tests/support's.
#[path = "../support/mod.rs"]
mod support;
pub use support::{repo, strip};

/// The tiny config, shortened for tests: `sft` warm-up steps, `rl` RL steps,
/// a checkpoint every `every` RL steps.
pub fn config(sft: u64, rl: u64, every: u64) -> String {
    let c = BASE
        .replace("steps = 100 ", &format!("steps = {rl} "))
        .replace("eval_size = 200", "eval_size = 16")
        .replace("prompts_per_step = 16", "prompts_per_step = 6")
        .replace("group_size = 8", "group_size = 4")
        .replace("steps = 500", &format!("steps = {sft}"))
        .replace(
            "tokenizer = \"tiny-arith.tokenizer.json\"",
            &format!(
                "tokenizer = {:?}",
                repo().join("configs/tiny-arith.tokenizer.json")
            ),
        );
    format!("{c}\n[checkpoint]\nevery = {every}\nkeep_last = 1000\n")
}

/// SplitMix64: schedules and frames reproducible from a seed.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
}

pub struct Daemon {
    pub child: Child,
    pub dir: PathBuf,
}

impl Daemon {
    /// Start `jetd serve` on `dir` and wait until its socket answers; its
    /// stderr goes to `dir/../jetd.log` (appended, kept for failures).
    pub fn start(dir: &Path) -> Daemon {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.with_extension("log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_jetd"))
            .args(["serve", "--data-dir"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut d = Daemon {
            child,
            dir: dir.to_path_buf(),
        };
        let t0 = Instant::now();
        while UnixStream::connect(d.socket()).is_err() {
            if let Some(st) = d.child.try_wait().unwrap() {
                panic!("jetd exited at start: {st}; log:\n{}", d.log());
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "jetd did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        d
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.join("jetd.sock")
    }
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default()
    }
    /// SIGKILL, and reap it.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
    /// Still running (not crashed)?
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
    /// Resident memory of the daemon, in KiB (VmRSS of /proc/PID/status).
    pub fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Client {
    rd: BufReader<UnixStream>,
    wr: UnixStream,
    pub id: u64,
}

impl Client {
    pub fn connect(d: &Daemon) -> Client {
        let s = UnixStream::connect(d.socket()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut c = Client {
            rd: BufReader::new(s.try_clone().unwrap()),
            wr: s,
            id: 0,
        };
        let hello = c.line().expect("hello");
        assert_eq!(hello["hello"]["protocol"], 1, "{hello}");
        c
    }
    /// The next line; None when the connection closed (the daemon died).
    pub fn line(&mut self) -> Option<Value> {
        let mut l = String::new();
        match self.rd.read_line(&mut l) {
            Ok(0) | Err(_) => None,
            Ok(_) => {
                Some(serde_json::from_str(&l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
            }
        }
    }
    /// Send one request; its reply (pushes skipped), or None when the daemon
    /// went away before answering (the request was not acknowledged).
    pub fn try_req(&mut self, mut r: Value) -> Option<Value> {
        self.id += 1;
        r["id"] = self.id.into();
        self.wr.write_all(format!("{r}\n").as_bytes()).ok()?;
        loop {
            let v = self.line()?;
            if v.get("push").is_some() {
                continue;
            }
            assert_eq!(v["id"], self.id, "reply echoes the id: {v}");
            return Some(v);
        }
    }
    /// Send one raw line; its answer.
    pub fn raw(&mut self, line: &str) -> Value {
        self.wr.write_all(line.as_bytes()).unwrap();
        self.wr.write_all(b"\n").unwrap();
        loop {
            let v = self.line().expect("an answer");
            if v.get("push").is_none() {
                return v;
            }
        }
    }
    pub fn req(&mut self, r: Value) -> Value {
        self.try_req(r.clone())
            .unwrap_or_else(|| panic!("no reply to {r}: the daemon went away"))
    }
    pub fn ok(&mut self, r: Value) -> Value {
        let v = self.req(r.clone());
        assert_eq!(v["ok"], true, "{r} -> {v}");
        v["result"].clone()
    }
    pub fn status(&mut self, run: &str) -> Value {
        self.ok(json!({"op": "status", "run": run}))
    }
    pub fn wait_for(&mut self, run: &str, what: &str, f: impl Fn(&Value) -> bool) -> Value {
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
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    pub fn submit(&mut self, cfg: &str) -> String {
        self.ok(json!({"op": "submit", "config": cfg}))["id"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

/// The live (not abandoned) records of both phases, stripped.
pub fn live(metrics: &Value) -> Vec<Value> {
    metrics
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["abandoned"] == false)
        .map(strip)
        .collect()
}

/// The same config run by `jetd run` in the foreground, both phases.
pub fn reference_metrics(cfg: &str, dir: &Path) -> Vec<Value> {
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
        .map(|l| strip(&serde_json::from_str::<Value>(l).unwrap()))
        .collect()
}

/// Temporary checkpoint folders (`.tmp-*`) under the data dir.
pub fn temp_dirs(data: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let Ok(runs) = std::fs::read_dir(data.join("runs")) else {
        return out;
    };
    for r in runs.flatten() {
        let Ok(cks) = std::fs::read_dir(r.path().join("checkpoints")) else {
            continue;
        };
        for c in cks.flatten() {
            if c.file_name().to_string_lossy().starts_with(".tmp-") {
                out.push(c.path());
            }
        }
    }
    out
}
