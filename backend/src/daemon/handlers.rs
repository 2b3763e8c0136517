//! The answer to each request.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use jet_proto::{Op, Push, RunState};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::shared::{Control, Shared};
use super::worker::record_config;
use crate::checkpoint;
use crate::config::RunConfig;
use crate::store::{RestorePlan, RunRecord};

type Res = Result<Value, (String, String)>;

fn err(code: &str, msg: impl Into<String>) -> (String, String) {
    (code.into(), msg.into())
}

fn internal(e: impl std::fmt::Display) -> (String, String) {
    err("internal", e.to_string())
}

fn get_run(sh: &Shared, id: &str) -> Result<RunRecord, (String, String)> {
    sh.store
        .run(id)
        .map_err(internal)?
        .ok_or_else(|| err("unknown_run", format!("no run '{id}'")))
}

fn to_value<T: serde::Serialize>(x: T) -> Value {
    serde_json::to_value(x).expect("serializes")
}

/// Answer one request (blocking work: call from a blocking context).
pub fn handle(sh: &Arc<Shared>, op: Op) -> Res {
    match op {
        Op::Auth { .. } => Ok(json!({"authenticated": true})),
        Op::Submit {
            config,
            config_path,
            steps,
            flow,
            seed,
            name,
        } => submit(sh, config, config_path, steps, flow, seed, name),
        Op::Runs => {
            let runs = sh.store.runs().map_err(internal)?;
            Ok(to_value(runs.iter().map(|r| r.info()).collect::<Vec<_>>()))
        }
        Op::Status { run } => Ok(to_value(get_run(sh, &run)?.info())),
        Op::Pause { run } => set_state(sh, &run, "pause"),
        Op::Resume { run } => set_state(sh, &run, "resume"),
        Op::Stop { run } => set_state(sh, &run, "stop"),
        Op::Checkpoint { run } => {
            get_run(sh, &run)?;
            if !sh.is_active(&run) {
                return Err(err(
                    "bad_state",
                    format!(
                        "run '{run}' is not computing; its checkpoints are listed by 'checkpoints'"
                    ),
                ));
            }
            let (tx, rx) = oneshot::channel();
            sh.control(&run, Control::Checkpoint(tx));
            rx.blocking_recv()
                .unwrap_or_else(|_| Err(err("bad_state", "the run stopped before the checkpoint")))
        }
        Op::Checkpoints { run } => {
            get_run(sh, &run)?;
            let cat = sh.store.checkpoints(&run).map_err(internal)?;
            Ok(to_value(
                cat.into_iter().map(|c| c.info).collect::<Vec<_>>(),
            ))
        }
        Op::Rollback { run, step } => rollback(sh, &run, step),
        Op::Delete { run } => {
            let r = get_run(sh, &run)?;
            if sh.is_active(&run) || r.state == RunState::Running {
                return Err(err(
                    "bad_state",
                    format!("run '{run}' is running: stop it first"),
                ));
            }
            sh.store.delete_run(&run).map_err(internal)?;
            let _ = std::fs::remove_dir_all(sh.run_dir(&run));
            Ok(json!({"deleted": run}))
        }
        Op::Metrics { run, from, to } => {
            get_run(sh, &run)?;
            let all = sh.store.metrics(&run).map_err(internal)?;
            let keep = |m: &Value| {
                let s = m["step"].as_u64().unwrap_or(0);
                if m["phase"] == "sft" {
                    return from.is_none();
                }
                from.is_none_or(|f| s >= f) && to.is_none_or(|t| s <= t)
            };
            Ok(Value::Array(all.into_iter().filter(keep).collect()))
        }
        Op::Events { run, from } => {
            get_run(sh, &run)?;
            Ok(to_value(
                sh.store.events(&run, from.unwrap_or(0)).map_err(internal)?,
            ))
        }
        Op::Subscribe { run } => snapshot(sh, run.as_deref()),
    }
}

pub fn snapshot(sh: &Shared, run: Option<&str>) -> Res {
    let runs: Vec<_> = sh
        .store
        .runs()
        .map_err(internal)?
        .iter()
        .map(|r| r.info())
        .collect();
    let mut snap = jet_proto::Snapshot {
        runs,
        metrics: vec![],
        events: vec![],
        checkpoints: vec![],
        gpus: sh.gpus.lock().unwrap().clone(),
    };
    if let Some(id) = run {
        get_run(sh, id)?;
        snap.metrics = sh.store.metrics(id).map_err(internal)?;
        snap.events = sh.store.events(id, 0).map_err(internal)?;
        snap.checkpoints = sh
            .store
            .checkpoints(id)
            .map_err(internal)?
            .into_iter()
            .map(|c| c.info)
            .collect();
    }
    Ok(to_value(snap))
}

#[allow(clippy::too_many_arguments)]
fn submit(
    sh: &Arc<Shared>,
    config: Option<String>,
    config_path: Option<String>,
    steps: Option<u64>,
    flow: Option<String>,
    seed: Option<u64>,
    name: Option<String>,
) -> Res {
    let (text, source, base) = match (config, config_path) {
        (Some(t), p) => {
            let src = p.clone().unwrap_or_else(|| "<submitted config>".into());
            let base = p
                .as_deref()
                .and_then(|p| Path::new(p).parent().map(Path::to_path_buf))
                .unwrap_or_else(|| PathBuf::from("."));
            (t, src, base)
        }
        (None, Some(p)) => {
            let t = std::fs::read_to_string(&p)
                .map_err(|e| err("bad_config", format!("cannot read {p}: {e}")))?;
            let base = Path::new(&p)
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default();
            (t, p, base)
        }
        (None, None) => {
            return Err(err(
                "bad_request",
                "submit needs 'config' (TOML text) or 'config_path'",
            ))
        }
    };
    let base = std::fs::canonicalize(&base).unwrap_or(base);
    let cfg = RunConfig::from_str_at(&text, &source, &base)
        .map_err(|e| err("bad_config", e.to_string()))?;
    if let Some(f) = &flow {
        f.parse::<jet_kernels::Flow>()
            .map_err(|e| err("bad_config", e.to_string()))?;
    }
    if cfg.run.device == "cuda" {
        sh.devices
            .check_submit(&source)
            .map_err(|m| err("bad_config", m))?;
    }
    let _g = sh.records.lock().unwrap();
    let id = sh.store.next_run_id().map_err(internal)?;
    let mut rec = RunRecord {
        id: id.clone(),
        name: name.unwrap_or_else(|| {
            Path::new(&source)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "run".into())
        }),
        config_toml: text,
        config_base: base,
        config_source: source,
        flow,
        steps,
        seed,
        state: RunState::Queued,
        created_unix: crate::store::now_ms() / 1000,
        progress: Default::default(),
        branch: 0,
        metric_seq: 0,
        event_seq: 0,
        last_alarm: None,
        auto_rollbacks: 0,
        message: None,
        last_reward: None,
        last_heldout: None,
        rl_total: 0,
        sft_total: cfg.sft.steps,
        flow_name: String::new(),
        mismatch_kl_alarm: cfg.health.mismatch_kl_alarm,
        restore: None,
        device: cfg.run.device.clone(),
        gpu: None,
    };
    let eff = record_config(&rec).map_err(|e| err("bad_config", e))?;
    rec.rl_total = eff.run.steps;
    rec.flow_name = eff.run.flow.0.name().into();
    let ev = sh
        .store
        .append_event(&mut rec, "info", "state", "queued: submitted".into(), None)
        .map_err(internal)?;
    sh.store.put_run(&rec).map_err(internal)?;
    sh.store.flush().map_err(internal)?;
    sh.push(Push::Event {
        run: id.clone(),
        event: ev,
    });
    sh.push(Push::Run { run: rec.info() });
    sh.notify();
    Ok(to_value(rec.info()))
}

/// A GPU run queued again must have a GPU to go to, or it would wait forever.
fn requeue_ok(sh: &Shared, r: &RunRecord) -> Result<(), (String, String)> {
    if r.device != "cuda" {
        return Ok(());
    }
    sh.devices
        .check_submit(&format!("run '{}'", r.id))
        .map_err(|m| err("bad_state", m))
}

fn set_state(sh: &Arc<Shared>, id: &str, what: &str) -> Res {
    let _g = sh.records.lock().unwrap();
    let mut r = get_run(sh, id)?;
    let active = sh.is_active(id);
    let new = match (what, r.state) {
        ("pause", RunState::Running) if active => {
            drop(_g);
            sh.control(id, Control::Pause);
            return Ok(to_value(r.info()));
        }
        ("pause", RunState::Queued) => RunState::Paused,
        ("resume", RunState::Paused | RunState::Stopped) => {
            requeue_ok(sh, &r)?;
            RunState::Queued
        }
        ("stop", RunState::Running) if active => {
            drop(_g);
            sh.control(id, Control::Stop);
            return Ok(to_value(r.info()));
        }
        ("stop", RunState::Queued | RunState::Paused) => RunState::Stopped,
        (_, s) => {
            return Err(err(
                "bad_state",
                format!("cannot {what} run '{id}': it is {}", s.name()),
            ))
        }
    };
    r.state = new;
    let ev = sh
        .store
        .append_event(
            &mut r,
            "info",
            "state",
            format!("{}: by request", new.name()),
            None,
        )
        .map_err(internal)?;
    sh.store.put_run(&r).map_err(internal)?;
    sh.push(Push::Event {
        run: id.into(),
        event: ev,
    });
    sh.push(Push::Run { run: r.info() });
    sh.notify();
    Ok(to_value(r.info()))
}

fn rollback(sh: &Arc<Shared>, id: &str, step: u64) -> Res {
    let r = get_run(sh, id)?;
    let cat = sh.store.checkpoints(id).map_err(internal)?;
    let Some(c) = cat
        .iter()
        .rev()
        .find(|c| c.info.phase == "rl" && c.info.step == step)
    else {
        let have: Vec<String> = cat
            .iter()
            .filter(|c| c.info.phase == "rl")
            .map(|c| c.info.step.to_string())
            .collect();
        return Err(err(
            "no_checkpoint",
            format!(
                "run '{id}' has no checkpoint at RL step {step} (have: {})",
                have.join(", ")
            ),
        ));
    };
    if c.info.health != "ok" {
        return Err(err(
            "bad_checkpoint",
            format!("checkpoint at step {step} is marked {}", c.info.health),
        ));
    }
    if let Err(e) = checkpoint::verify(Path::new(&c.info.path), &c.files) {
        let mut bad = c.clone();
        bad.info.health = "bad".into();
        sh.store.put_checkpoint(id, &bad).map_err(internal)?;
        return Err(err("bad_checkpoint", e.to_string()));
    }
    if sh.is_active(id) {
        let (tx, rx) = oneshot::channel();
        sh.control(id, Control::Rollback(step, tx));
        return rx
            .blocking_recv()
            .unwrap_or_else(|_| Err(err("bad_state", "the run stopped before the rollback")));
    }
    requeue_ok(sh, &r)?;
    // Not computing: record the plan; the run goes on from there when it computes.
    let _g = sh.records.lock().unwrap();
    let mut r = sh.store.run(id).map_err(internal)?.unwrap_or(r);
    r.restore = Some(RestorePlan {
        path: c.info.path.clone(),
        skip: 0,
        lr_factor: 1.0,
    });
    r.state = RunState::Queued;
    let ev = sh
        .store
        .append_event(
            &mut r,
            "warn",
            "rollback",
            format!("rollback to RL step {step} requested"),
            Some(step),
        )
        .map_err(internal)?;
    sh.store.put_run(&r).map_err(internal)?;
    sh.push(Push::Event {
        run: id.into(),
        event: ev,
    });
    sh.push(Push::Run { run: r.info() });
    sh.notify();
    Ok(to_value(r.info()))
}
