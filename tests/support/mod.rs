//! Helpers for tests that drive real `jetd` processes over the socket. They also
//! run from binaries carried to another machine (the GPU check), so the binaries
//! and the repository are found through environment variables first.

#![allow(dead_code)]

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The repository root: where this test was built, or else the working folder
/// (a test binary run elsewhere from the repository root).
pub fn repo() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    if built.join("configs").is_dir() {
        built.to_path_buf()
    } else {
        std::env::current_dir().unwrap()
    }
}

/// `$name`, or the binary cargo built next to this test.
pub fn binary(env: &str, built: &str) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(env) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{env}={} is not a file", p.display()))
        };
    }
    let p = PathBuf::from(built);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!("{built} does not exist: set {env}"))
    }
}

pub fn jetd() -> PathBuf {
    binary("JETD_BIN", env!("CARGO_BIN_EXE_jetd")).unwrap_or_else(|e| panic!("{e}"))
}

/// A `jetd serve` child whose stderr goes to a log file.
pub struct Daemon {
    pub child: Option<Child>,
    pub dir: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// Start `jetd serve --data-dir dir ARGS` and wait for its socket.
    pub fn start(dir: &Path, args: &[&str], log: &Path) -> Result<Daemon, String> {
        let err = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(jetd())
            .args(["serve", "--data-dir"])
            .arg(dir)
            .args(args)
            // The daemon keeps its kernels in its store, not in a folder.
            .env_remove("JET_KERNEL_CACHE_DIR")
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting jetd: {e}"))?;
        let mut d = Daemon {
            child: Some(child),
            dir: dir.to_path_buf(),
            log: log.to_path_buf(),
        };
        let t0 = Instant::now();
        while UnixStream::connect(d.socket()).is_err() {
            if let Some(s) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Err(format!(
                    "jetd exited ({s}) before serving: {}",
                    d.log_text()
                ));
            }
            if t0.elapsed() > Duration::from_secs(120) {
                return Err(format!("jetd did not serve within 120 s: {}", d.log_text()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(d)
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("jetd.sock")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait until the log has a line containing `what`; returns that line.
    pub fn wait_log(&self, what: &str, secs: u64) -> Option<String> {
        let t0 = Instant::now();
        loop {
            if let Some(l) = self.log_text().lines().find(|l| l.contains(what)) {
                return Some(l.to_string());
            }
            if t0.elapsed() > Duration::from_secs(secs) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait up to `secs` for the exit.
    pub fn sigterm(&mut self, secs: u64) -> Result<ExitStatus, String> {
        let mut c = self.child.take().ok_or("jetd is not running")?;
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        loop {
            if let Some(s) = c.try_wait().map_err(|e| e.to_string())? {
                return Ok(s);
            }
            if t0.elapsed() > Duration::from_secs(secs) {
                let _ = c.kill();
                let _ = c.wait();
                return Err(format!("jetd did not exit within {secs} s of SIGTERM"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A request/reply connection (pushes are set aside).
pub struct Client {
    rd: BufReader<UnixStream>,
    wr: UnixStream,
    id: u64,
}

impl Client {
    pub fn connect(d: &Daemon) -> Result<Client, String> {
        let s = UnixStream::connect(d.socket()).map_err(|e| format!("connecting: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut c = Client {
            rd: BufReader::new(s.try_clone().unwrap()),
            wr: s,
            id: 0,
        };
        let hello = c.line()?;
        if hello["hello"]["protocol"] != 1 {
            return Err(format!("unexpected hello {hello}"));
        }
        Ok(c)
    }

    fn line(&mut self) -> Result<Value, String> {
        let mut l = String::new();
        self.rd
            .read_line(&mut l)
            .map_err(|e| format!("reading a reply: {e}"))?;
        serde_json::from_str(&l).map_err(|e| format!("bad line {l:?}: {e}"))
    }

    /// The reply to request `r` (an `id` is added).
    pub fn req(&mut self, mut r: Value) -> Result<Value, String> {
        self.id += 1;
        r["id"] = self.id.into();
        writeln!(self.wr, "{r}").map_err(|e| format!("sending: {e}"))?;
        loop {
            let v = self.line()?;
            if v.get("push").is_none() {
                return Ok(v);
            }
        }
    }

    /// The result of request `r`, or its error as text.
    pub fn ok(&mut self, r: Value) -> Result<Value, String> {
        let v = self.req(r.clone())?;
        if v["ok"] == true {
            Ok(v["result"].clone())
        } else {
            Err(format!("{r} -> {v}"))
        }
    }

    pub fn status(&mut self, run: &str) -> Result<Value, String> {
        self.ok(serde_json::json!({"op": "status", "run": run}))
    }

    /// Poll the run's status until `f` holds (at most `secs`).
    pub fn wait_for(
        &mut self,
        run: &str,
        what: &str,
        secs: u64,
        f: impl Fn(&Value) -> bool,
    ) -> Result<Value, String> {
        let t0 = Instant::now();
        loop {
            let s = self.status(run)?;
            if f(&s) {
                return Ok(s);
            }
            if t0.elapsed() > Duration::from_secs(secs) {
                return Err(format!("timed out after {secs} s waiting for {what}: {s}"));
            }
            std::thread::sleep(Duration::from_millis(30));
        }
    }
}

/// Every push of a `subscribe` (all runs), collected by a thread.
pub struct Subscriber {
    pub pushes: Arc<Mutex<Vec<Value>>>,
}

impl Subscriber {
    pub fn start(d: &Daemon) -> Result<Subscriber, String> {
        let mut c = Client::connect(d)?;
        c.ok(serde_json::json!({"op": "subscribe"}))?;
        let pushes = Arc::new(Mutex::new(Vec::new()));
        let sink = pushes.clone();
        let mut rd = c.rd;
        rd.get_ref().set_read_timeout(None).unwrap();
        std::thread::spawn(move || {
            let _keep = c.wr;
            let mut l = String::new();
            while matches!(rd.read_line(&mut l), Ok(n) if n > 0) {
                if let Ok(v) = serde_json::from_str::<Value>(&l) {
                    sink.lock().unwrap().push(v);
                }
                l.clear();
            }
        });
        Ok(Subscriber { pushes })
    }

    pub fn count(&self, f: impl Fn(&Value) -> bool) -> usize {
        self.pushes.lock().unwrap().iter().filter(|p| f(p)).count()
    }
}

/// Drop wall-clock fields and store bookkeeping from a metrics object.
pub fn strip(m: &Value) -> Value {
    let mut m = m.clone();
    for f in [
        "rollout_s",
        "train_s",
        "step_s",
        "rollout_tokens_per_s",
        "train_tokens_per_s",
        "branch",
        "abandoned",
    ] {
        if let Some(o) = m.as_object_mut() {
            o.remove(f);
        }
    }
    m
}

/// The live (not abandoned) RL steps of a `metrics` result, stripped.
pub fn live_rl(metrics: &Value) -> Vec<Value> {
    metrics
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|m| m["phase"] == "rl" && m["abandoned"] == false)
                .map(strip)
                .collect()
        })
        .unwrap_or_default()
}

/// "all N steps equal", or where the first difference is.
pub fn compare_steps(got: &[Value], want: &[Value]) -> Result<String, String> {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g != w {
            let fields: Vec<String> = w
                .as_object()
                .map(|o| {
                    o.iter()
                        .filter(|(k, v)| g.get(k.as_str()) != Some(v))
                        .map(|(k, v)| {
                            format!("{k}: {} vs {v}", g.get(k.as_str()).unwrap_or(&Value::Null))
                        })
                        .collect()
                })
                .unwrap_or_default();
            return Err(format!("step {i} differs ({})", fields.join("; ")));
        }
    }
    if got.len() != want.len() {
        return Err(format!("{} steps, expected {}", got.len(), want.len()));
    }
    Ok(format!("all {} RL steps equal bit for bit", want.len()))
}
