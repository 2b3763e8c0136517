//! GPU runs in a real `jetd serve`.
//!
//! `cuda_run_refused_without_a_gpu` runs everywhere: a jetd without a GPU (or
//! started with `--gpus none`) refuses a `device = "cuda"` run at submit, saying
//! what is missing, and writes nothing.
//!
//! `gpu_end_to_end` is the check on a GPU machine (it skips without one): a GPU
//! run submitted to a real daemon, metrics and `gpu` pushes, pause/resume, a
//! checkpoint on demand, `kill -9`, a restart that compiles no kernel and
//! continues bit for bit like an uninterrupted `jetd run`, a rollback, an injected
//! NaN rolled back automatically, two runs at once on two GPUs (when there are
//! two), SIGTERM. It prints a summary table and keeps its logs.
//!
//! Environment (all optional): `JETD_BIN`, `JETCTL_BIN` (binaries carried to the
//! GPU machine; default: cargo's, jetctl next to jetd), `JET_E2E_DIR` (logs,
//! metrics and `summary.txt`; default a temporary folder), `JET_E2E_WORK` (data
//! dirs with the checkpoints; default a temporary folder), `JET_E2E_CONFIG`
//! (default `configs/qwen3-0.6b-arith.toml`), `JET_E2E_LAYERS` (default 4; `full`
//! keeps the config's), `JET_E2E_SFT_STEPS` (default 40), `JET_E2E_RL_STEPS`
//! (default 30), `JET_E2E_DEVICE=cpu` (a dry run of this harness on the CPU, with
//! the GPU-only checks skipped; e.g. with `JET_E2E_CONFIG=configs/tiny-arith.toml
//! JET_E2E_LAYERS=full JET_E2E_SFT_STEPS=12`).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{compare_steps, live_rl, repo, strip, Client, Daemon, Subscriber};

const TINY: &str = include_str!("../configs/tiny-arith.toml");

#[test]
fn cuda_run_refused_without_a_gpu() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // On a GPU machine the same refusal comes from serving no GPU.
    let (args, why): (&[&str], String) = match jet_kernels::cuda::cuda_device_count() {
        Ok(_) => (&["--gpus", "none"], "--gpus none".into()),
        Err(e) => (&[], e.to_string()),
    };
    let tok = repo().join("configs/tiny-arith.tokenizer.json");
    let cfg = TINY
        .replace("device = \"cpu\"", "device = \"cuda\"")
        .replace("\"tiny-arith.tokenizer.json\"", &format!("{tok:?}"));
    assert_ne!(cfg, TINY);
    // GPU runs left in the store by a jetd that had a GPU: one queued, one paused.
    std::fs::create_dir_all(&data).unwrap();
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    {
        let store = jet_backend::store::Store::open(&data).unwrap();
        for (id, state) in [("g0001", "queued"), ("g0002", "paused")] {
            let rec: jet_backend::store::RunRecord = serde_json::from_value(json!({
                "id": id, "name": "old", "config_toml": cfg, "config_base": "/",
                "config_source": "old.toml", "flow": null, "steps": null, "seed": null,
                "state": state, "created_unix": 0, "progress": {"sft_steps_done": 0,
                "rl_steps_done": 0, "data_offset": 0, "lr_scale": 1.0}, "branch": 0,
                "metric_seq": 0, "event_seq": 0, "last_alarm": null, "auto_rollbacks": 0,
                "message": null, "last_reward": null, "last_heldout": null, "rl_total": 1,
                "sft_total": 1, "flow_name": "fp8", "mismatch_kl_alarm": 0.01, "device": "cuda"
            }))
            .unwrap();
            store.put_run(&rec).unwrap();
        }
        store.flush().unwrap();
    }
    let d = Daemon::start(&data, args, &tmp.path().join("jetd.log")).unwrap();
    assert!(
        d.wait_log("run g0001 needs a GPU", 10).is_some(),
        "{}",
        d.log_text()
    );
    let mut c = Client::connect(&d).unwrap();
    let r = c.req(json!({"op": "resume", "run": "g0002"})).unwrap();
    assert_eq!(r["error"]["code"], "bad_state", "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains(&why),
        "{r}"
    );
    assert_eq!(c.status("g0002").unwrap()["state"], "paused");
    for id in ["g0001", "g0002"] {
        c.ok(json!({"op": "delete", "run": id})).unwrap();
    }
    let r = c
        .req(json!({"op": "submit", "config": cfg, "config_path": "/somewhere/gpu.toml"}))
        .unwrap();
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["error"]["code"], "bad_config", "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("/somewhere/gpu.toml") && msg.contains("run.device") && msg.contains(&why),
        "the refusal names the file, the field and what is missing ({why}): {msg}"
    );
    // Nothing was written: no run, no run folder; a CPU run still goes in.
    assert_eq!(c.ok(json!({"op": "runs"})).unwrap(), json!([]));
    assert!(!data.join("runs").exists());
    let cpu = TINY.replace("\"tiny-arith.tokenizer.json\"", &format!("{tok:?}"));
    let ok = c.ok(json!({"op": "submit", "config": cpu})).unwrap();
    assert_eq!(ok["device"], "cpu", "{ok}");
    c.ok(json!({"op": "stop", "run": ok["id"]})).unwrap();
    drop(d);

    // Asking for a GPU that is not there stops jetd at start, naming the option.
    if jet_kernels::cuda::cuda_device_count().is_err() {
        let out = Command::new(support::jetd())
            .args(["serve", "--gpus", "0", "--data-dir"])
            .arg(tmp.path().join("data2"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("--gpus 0") && err.contains(&why), "{err}");
    }
    let out = Command::new(support::jetd())
        .args(["serve", "--gpus", "0,x", "--data-dir"])
        .arg(tmp.path().join("data3"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--gpus") && err.contains("'x'"), "{err}");
}

/// One line of the summary.
struct Row {
    check: String,
    status: &'static str,
    detail: String,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
}

impl Report {
    /// Record a check; returns whether it passed.
    fn check(&mut self, check: &str, r: Result<String, String>) -> bool {
        let (status, detail, ok) = match r {
            Ok(d) => ("PASS", d, true),
            Err(d) => ("FAIL", d, false),
        };
        println!("[{status}] {check}: {detail}");
        self.rows.push(Row {
            check: check.into(),
            status,
            detail,
        });
        ok
    }

    fn skip(&mut self, check: &str, why: String) {
        println!("[SKIP] {check}: {why}");
        self.rows.push(Row {
            check: check.into(),
            status: "SKIP",
            detail: why,
        });
    }

    fn table(&self) -> String {
        let w = self.rows.iter().map(|r| r.check.len()).max().unwrap_or(5);
        let mut s = format!("{:<w$}  RESULT  DETAIL\n", "CHECK");
        for r in &self.rows {
            s.push_str(&format!("{:<w$}  {:<6}  {}\n", r.check, r.status, r.detail));
        }
        s
    }

    fn failed(&self) -> usize {
        self.rows.iter().filter(|r| r.status == "FAIL").count()
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

/// A folder from `$name`, or a temporary one kept alive by the returned guard.
fn folder(name: &str) -> (PathBuf, Option<tempfile::TempDir>) {
    match std::env::var_os(name) {
        Some(p) => {
            let p = PathBuf::from(p);
            std::fs::create_dir_all(&p).unwrap();
            (p, None)
        }
        None => {
            let t = tempfile::tempdir().unwrap();
            (t.path().to_path_buf(), Some(t))
        }
    }
}

/// The GPU config: `JET_E2E_CONFIG` with fewer layers and steps, paths made
/// absolute, a checkpoint every 2 RL steps, and `extra` (TOML) on top.
fn gpu_config(rl_steps: u64, extra: &str) -> Result<String, String> {
    let device = env_or("JET_E2E_DEVICE", "cuda");
    let path = repo().join(env_or("JET_E2E_CONFIG", "configs/qwen3-0.6b-arith.toml"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut t: toml::Table = text
        .parse()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let base = path.parent().unwrap();
    let table = |t: &mut toml::Table, k: &str| -> toml::Table {
        t.get(k)
            .and_then(|v| v.as_table())
            .cloned()
            .unwrap_or_default()
    };
    let int = |name: &str, d: &str| -> Result<i64, String> {
        env_or(name, d).parse().map_err(|e| format!("{name}: {e}"))
    };
    let mut run = table(&mut t, "run");
    run.insert("device".into(), device.into());
    run.insert("steps".into(), (rl_steps as i64).into());
    run.insert("eval_every".into(), 4.into());
    run.insert("eval_size".into(), 64.into());
    t.insert("run".into(), run.into());
    let mut model = table(&mut t, "model");
    for k in ["tokenizer", "path"] {
        if let Some(p) = model.get(k).and_then(|v| v.as_str()) {
            let abs = base.join(p).display().to_string();
            model.insert(k.into(), abs.into());
        }
    }
    let layers = env_or("JET_E2E_LAYERS", "4");
    if layers != "full" {
        if let Some(r) = model.get_mut("random").and_then(|v| v.as_table_mut()) {
            let n: i64 = layers.parse().map_err(|e| format!("JET_E2E_LAYERS: {e}"))?;
            r.insert("num_hidden_layers".into(), n.into());
        }
    }
    t.insert("model".into(), model.into());
    let mut sft = table(&mut t, "sft");
    sft.insert("steps".into(), int("JET_E2E_SFT_STEPS", "40")?.into());
    t.insert("sft".into(), sft.into());
    // keep_last 3: a checkpoint of the default model is ~750 MB.
    let extra: toml::Table = format!("[checkpoint]\nevery = 2\nkeep_last = 3\n{extra}")
        .parse()
        .map_err(|e| format!("{e}"))?;
    for (k, v) in extra {
        let mut sec = table(&mut t, &k);
        for (kk, vv) in v.as_table().cloned().unwrap_or_default() {
            sec.insert(kk, vv);
        }
        t.insert(k, sec.into());
    }
    toml::to_string(&t).map_err(|e| e.to_string())
}

/// `jetd run` of `cfg` in the foreground (its own file kernel cache): the
/// uninterrupted reference. Returns its RL metrics and the seconds it took.
fn reference(cfg: &str, work: &Path, logs: &Path) -> Result<(Vec<Value>, f64), String> {
    let p = work.join("ref.toml");
    std::fs::write(&p, cfg).map_err(|e| e.to_string())?;
    let m = logs.join("reference.jsonl");
    let log = std::fs::File::create(logs.join("reference.log")).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let st = Command::new(support::jetd())
        .arg("run")
        .arg(&p)
        .arg("--metrics-out")
        .arg(&m)
        .arg("--data-dir")
        .arg(work.join("refdata"))
        .env("JET_KERNEL_CACHE_DIR", work.join("filecache"))
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .status()
        .map_err(|e| e.to_string())?;
    if !st.success() {
        return Err(format!("jetd run failed ({st}): see reference.log"));
    }
    let ms: Vec<Value> = std::fs::read_to_string(&m)
        .map_err(|e| e.to_string())?
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|m: &Value| m["phase"] == "rl")
        .map(|m| strip(&m))
        .collect();
    Ok((ms, t0.elapsed().as_secs_f64()))
}

/// (compiled, from the store) of a daemon's `kernels:` line.
fn kernel_counts(line: &str) -> Option<(u64, u64)> {
    let rest = &line[line.find("kernels: ")? + 9..];
    let mut it = rest
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

fn run_id(v: &Value) -> Result<String, String> {
    v["id"]
        .as_str()
        .map(str::to_string)
        .ok_or(format!("no run id in {v}"))
}

#[test]
fn gpu_end_to_end() {
    let dry = env_or("JET_E2E_DEVICE", "cuda") == "cpu";
    let gpus = match jet_kernels::cuda::cuda_device_count() {
        _ if dry => 0,
        Ok(n) => n,
        Err(e) => {
            println!("skipping the GPU end-to-end check: no GPU ({e})");
            return;
        }
    };
    let (logs, _logs_guard) = folder("JET_E2E_DIR");
    let (work, _work_guard) = folder("JET_E2E_WORK");
    println!(
        "GPU end-to-end check: {gpus} GPU(s); logs in {}",
        logs.display()
    );
    let mut rep = Report::default();
    let outcome = check_all(&mut rep, &logs, &work, gpus, dry);
    if let Err(e) = outcome {
        rep.check("(stopped early)", Err(e));
    }
    let table = rep.table();
    println!("\n{table}");
    let _ = std::fs::write(logs.join("summary.txt"), &table);
    assert_eq!(rep.failed(), 0, "failed checks:\n{table}");
}

/// Every check in order; Err stops the sequence (the later checks need it).
fn check_all(
    rep: &mut Report,
    logs: &Path,
    work: &Path,
    gpus: usize,
    dry: bool,
) -> Result<(), String> {
    // A fresh start even in a reused JET_E2E_WORK: the first daemon must compile.
    for d in ["data", "refdata", "filecache"] {
        let p = work.join(d);
        if p.exists() {
            std::fs::remove_dir_all(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    let rl_steps: u64 = env_or("JET_E2E_RL_STEPS", "30")
        .parse()
        .map_err(|e| format!("JET_E2E_RL_STEPS: {e}"))?;
    // No automatic rollback in the run compared with `jetd run`, which has none.
    let cfg = gpu_config(rl_steps, "[health]\nauto_rollback = false\n")?;
    std::fs::write(logs.join("run.toml"), &cfg).map_err(|e| e.to_string())?;

    // 1. The uninterrupted reference, in the foreground.
    let r = reference(&cfg, work, logs);
    let (want, ref_s) = r.clone().unwrap_or_default();
    if !rep.check(
        "reference `jetd run` (uninterrupted)",
        r.map(|(m, s)| format!("{} RL steps in {s:.1} s", m.len())),
    ) {
        return Err("no reference".into());
    }

    // 2. A fresh daemon compiles its kernels into its store.
    let data = work.join("data");
    let mut d = Daemon::start(&data, &[], &logs.join("jetd-1.log"))?;
    if dry {
        rep.skip("daemon 1 prepares its kernels", "CPU dry run".into());
    } else {
        let line = d.wait_log("kernels: ", 120).unwrap_or_default();
        rep.check(
            "daemon 1 prepares its kernels",
            match kernel_counts(&line) {
                Some((c, s)) if c > 0 => {
                    Ok(format!("{c} compiled, {s} from the store (fresh data dir)"))
                }
                _ => Err(format!("no kernels line with compiles: {line:?}")),
            },
        );
    }
    let sub = Subscriber::start(&d)?;
    let mut c = Client::connect(&d)?;

    // 3. Submit; pause at RL step 2 (the run holds still while it is looked at):
    // the record says where it ran, metrics were pushed, jetctl shows it.
    let t_run = Instant::now();
    let info = c.ok(json!({"op": "submit", "config": cfg, "name": "gpu-e2e"}))?;
    let run = run_id(&info)?;
    c.wait_for(&run, "RL step 2", 600, |s| s["step"].as_u64() >= Some(2))?;
    c.ok(json!({"op": "pause", "run": run}))?;
    let s = c.wait_for(&run, "paused", 300, |s| s["state"] == "paused")?;
    let (want_device, want_gpu, where_) = match dry {
        true => ("cpu", Value::Null, "cpu"),
        false => ("cuda", json!(0), "gpu 0"),
    };
    rep.check(
        "run record shows its GPU",
        if s["device"] == want_device && s["gpu"] == want_gpu {
            Ok(format!("{run}: device {}, gpu {}", want_device, s["gpu"]))
        } else {
            Err(format!("{s}"))
        },
    );
    let metrics_pushed = sub.count(|p| p["push"] == "metrics" && p["run"] == run.as_str());
    rep.check(
        "metrics pushed to a subscriber",
        if metrics_pushed > 0 {
            Ok(format!(
                "{metrics_pushed} metrics pushes by RL step {}",
                s["step"]
            ))
        } else {
            Err("none".into())
        },
    );
    match support::binary("JETCTL_BIN", "").or_else(|_| {
        let p = support::jetd().with_file_name("jetctl");
        p.is_file()
            .then_some(p)
            .ok_or("no jetctl next to jetd".to_string())
    }) {
        Ok(jetctl) => {
            let out = Command::new(&jetctl)
                .arg("--data-dir")
                .arg(&data)
                .args(["status", &run])
                .output()
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            std::fs::write(logs.join("jetctl-status.txt"), &text).ok();
            rep.check(
                "`jetctl status` shows the GPU",
                match text.lines().find(|l| l.starts_with("device")) {
                    Some(l) if l.contains(where_) => {
                        Ok(l.split_whitespace().collect::<Vec<_>>().join(" "))
                    }
                    _ => Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr))),
                },
            );
        }
        Err(e) => rep.skip("`jetctl status` shows the GPU", e),
    }

    // 4. Resume; a checkpoint on demand (answered at the next step boundary).
    c.ok(json!({"op": "resume", "run": run}))?;
    c.wait_for(&run, "running", 300, |s| s["state"] == "running")?;
    rep.check(
        "pause and resume",
        Ok(format!("paused at RL step {}, resumed", s["step"])),
    );
    let ck = c.req(json!({"op": "checkpoint", "run": run}))?;
    rep.check(
        "checkpoint on demand",
        if ck["ok"] == true {
            Ok(format!(
                "RL step {}, {} bytes",
                ck["result"]["step"], ck["result"]["bytes"]
            ))
        } else {
            Err(format!("{ck}"))
        },
    );

    // 5. GPU samples (NVML, once a second) name the run computing on the GPU.
    let check = "gpu pushes: utilisation, memory, power, temperature, run";
    let with_run = |sub: &Subscriber| {
        sub.count(|p| {
            p["push"] == "gpu"
                && p["gpus"]
                    .as_array()
                    .is_some_and(|g| g.iter().any(|g| g["run"] == run.as_str()))
        })
    };
    let t0 = Instant::now();
    while !dry && with_run(&sub) == 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let sample = sub
        .pushes
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|p| {
            p["push"] == "gpu"
                && p["gpus"]
                    .as_array()
                    .is_some_and(|g| g.iter().any(|g| g["run"] == run.as_str()))
        })
        .cloned();
    match (sample, d.wait_log("GPU panel disabled", 0)) {
        _ if dry => rep.skip(check, "CPU dry run".into()),
        (Some(p), _) => {
            let g = p["gpus"]
                .as_array()
                .and_then(|g| g.iter().find(|g| g["run"] == run.as_str()).cloned())
                .unwrap_or_default();
            rep.check(
                check,
                Ok(format!(
                    "{} pushes name the run; GPU {}: {}% util, {}/{} MiB, {} W, {} C, run {}",
                    with_run(&sub),
                    g["index"],
                    g["util_pct"],
                    g["mem_used_mib"],
                    g["mem_total_mib"],
                    g["power_w"],
                    g["temp_c"],
                    g["run"]
                )),
            );
        }
        (None, Some(l)) => rep.skip(check, l),
        (None, None) => {
            let last = sub
                .pushes
                .lock()
                .unwrap()
                .iter()
                .rev()
                .find(|p| p["push"] == "gpu")
                .cloned();
            rep.check(
                check,
                Err(format!("no gpu push names {run}; last: {last:?}")),
            );
        }
    }

    // 6. kill -9 mid-run, a few steps past the last checkpoint (they are computed
    // again); a restart resumes from that checkpoint and compiles nothing.
    let past = ck["result"]["step"].as_u64().unwrap_or(0) + 3;
    let s = c.wait_for(&run, "3 steps past the checkpoint", 600, |s| {
        s["step"].as_u64() >= Some(past) || s["state"] != "running"
    })?;
    d.kill9();
    rep.check(
        "kill -9 mid-run",
        if s["state"] == "running" {
            Ok(format!("killed at RL step {} of {rl_steps}", s["step"]))
        } else {
            Err(format!(
                "the run was {} before the kill: raise JET_E2E_RL_STEPS (now {rl_steps})",
                s["state"]
            ))
        },
    );
    drop(c);
    let mut d = Daemon::start(&data, &[], &logs.join("jetd-2.log"))?;
    if dry {
        rep.skip("restarted daemon compiles no kernel", "CPU dry run".into());
    } else {
        let line = d.wait_log("kernels: ", 120).unwrap_or_default();
        rep.check(
            "restarted daemon compiles no kernel",
            match kernel_counts(&line) {
                Some((0, s)) if s > 0 => Ok(format!("0 compiled, {s} from the sled store")),
                _ => Err(format!("kernels line: {line:?}")),
            },
        );
    }
    let mut c = Client::connect(&d)?;
    let done = c.wait_for(&run, "finished", 900, |s| {
        s["state"] == "finished" || s["state"] == "failed" || s["state"] == "paused"
    })?;
    let run_s = t_run.elapsed().as_secs_f64();
    let evs = c.ok(json!({"op": "events", "run": run}))?;
    let resumed = evs
        .as_array()
        .and_then(|a| a.iter().rev().find(|e| e["kind"] == "resume"))
        .and_then(|e| e["message"].as_str())
        .unwrap_or("")
        .to_string();
    let all = c.ok(json!({"op": "metrics", "run": run}))?;
    std::fs::write(logs.join("daemon-metrics.json"), all.to_string()).ok();
    rep.check(
        "resumed run == uninterrupted run",
        if done["state"] != "finished" {
            Err(format!("run ended {}: {}", done["state"], done["message"]))
        } else {
            compare_steps(&live_rl(&all), &want).map(|m| format!("{m} ({resumed})"))
        },
    );

    // 7. Roll back to the oldest RL checkpoint kept: the branch after it stays
    // as abandoned steps, and the replay equals the reference again.
    let r = (|| {
        let cks = c.ok(json!({"op": "checkpoints", "run": run}))?;
        let step = cks
            .as_array()
            .into_iter()
            .flatten()
            .filter(|k| k["phase"] == "rl" && k["health"] == "ok")
            .filter_map(|k| k["step"].as_u64())
            .filter(|&k| k > 0 && k < rl_steps)
            .min()
            .ok_or(format!("no RL checkpoint to roll back to: {cks}"))?;
        c.ok(json!({"op": "rollback", "run": run, "step": step}))?;
        let s = c.wait_for(&run, "finished again", 900, |s| {
            s["state"] == "finished" || s["state"] == "failed" || s["state"] == "paused"
        })?;
        let all = c.ok(json!({"op": "metrics", "run": run}))?;
        let abandoned = all
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["abandoned"] == true && m["phase"] == "rl")
            .count();
        if s["state"] != "finished" || abandoned == 0 {
            return Err(format!("state {}, {abandoned} abandoned steps", s["state"]));
        }
        compare_steps(&live_rl(&all), &want)
            .map(|m| format!("to RL step {step}: {m}; {abandoned} steps abandoned"))
    })();
    rep.check("rollback replays bit for bit", r);

    // 8. An injected NaN rolls back automatically and the run finishes healthy.
    let nan_steps = 8;
    let r = (|| {
        let cfg = gpu_config(nan_steps, "[debug]\ninject_nan_at_step = 5\n")?;
        let id = run_id(&c.ok(json!({"op": "submit", "config": cfg, "name": "gpu-nan"}))?)?;
        let s = c.wait_for(&id, "finished", 900, |s| {
            s["state"] == "finished" || s["state"] == "failed" || s["state"] == "paused"
        })?;
        let kinds: Vec<String> = c
            .ok(json!({"op": "events", "run": id}))?
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| e["kind"].as_str().unwrap_or("").to_string())
            .collect();
        let live = live_rl(&c.ok(json!({"op": "metrics", "run": id}))?);
        let finite = live
            .iter()
            .all(|m| m["loss"].as_f64().is_some_and(f64::is_finite));
        let has = |k: &str| kinds.iter().any(|x| x == k);
        if s["state"] == "finished"
            && has("alarm.nan")
            && has("rollback")
            && live.len() as u64 == nan_steps
            && finite
        {
            Ok(format!(
                "alarm.nan, rollback, {} healthy RL steps",
                live.len()
            ))
        } else {
            Err(format!(
                "state {}, events {kinds:?}, {} live steps, finite {finite}",
                s["state"],
                live.len()
            ))
        }
    })();
    rep.check("injected NaN: automatic rollback", r);

    // 9. Two GPUs: two runs at once, one on each.
    if gpus >= 2 {
        let r = (|| {
            let a = run_id(&c.ok(json!({"op": "submit", "config": cfg, "name": "two-a"}))?)?;
            let b = run_id(&c.ok(json!({"op": "submit", "config": cfg, "name": "two-b"}))?)?;
            let t0 = Instant::now();
            let seen = loop {
                let (sa, sb) = (c.status(&a)?, c.status(&b)?);
                if sa["state"] == "running" && sb["state"] == "running" {
                    break Some((sa["gpu"].clone(), sb["gpu"].clone()));
                }
                if t0.elapsed() > Duration::from_secs(300) || sa["state"] == "finished" {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(30));
            };
            for id in [&a, &b] {
                let _ = c.ok(json!({"op": "stop", "run": id}));
            }
            match seen {
                Some((ga, gb)) if ga != gb => Ok(format!("{a} on gpu {ga}, {b} on gpu {gb}")),
                other => Err(format!("not both running on different GPUs: {other:?}")),
            }
        })();
        rep.check("two runs at once on two GPUs", r);
    } else {
        rep.skip("two runs at once on two GPUs", format!("{gpus} GPU here"));
    }

    // 10. SIGTERM: the daemon finishes the step, checkpoints and exits 0.
    drop(c);
    rep.check(
        "SIGTERM exits 0",
        match d.sigterm(300) {
            Ok(s) if s.success() => Ok("exit 0".into()),
            Ok(s) => Err(format!("{s}")),
            Err(e) => Err(e),
        },
    );
    rep.check(
        "timings (information)",
        Ok(format!(
            "reference jetd run {ref_s:.1} s; daemon run with the kill, restart and pause {run_s:.1} s"
        )),
    );
    Ok(())
}
