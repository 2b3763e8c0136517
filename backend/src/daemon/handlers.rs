//! The answer to each request.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use jet_proto::{Op, Push, RunState};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::lineage;
use super::shared::{Ack, Control, Reply, Shared};
use super::worker::record_config;
use crate::checkpoint;
use crate::config::RunConfig;
use crate::store::{RestorePlan, RunRecord};

type Res = Reply;

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

/// Flush before answering: a mutating request is acknowledged only once its
/// effect and its event are durable (sled otherwise writes back every 500 ms).
fn flushed(sh: &Shared) -> Result<(), (String, String)> {
    sh.store.flush().map_err(internal)
}

/// Queue a command for the computing run (the caller holds `records` and has
/// seen the run active) and wait for the compute thread's answer, which comes
/// once the command's effect is durable.
fn ask_worker(
    sh: &Shared,
    id: &str,
    g: std::sync::MutexGuard<'_, ()>,
    c: impl FnOnce(Ack) -> Control,
) -> Res {
    let (tx, rx) = oneshot::channel();
    sh.control(id, c(tx));
    drop(g);
    rx.blocking_recv().unwrap_or_else(|_| {
        Err(err(
            "bad_state",
            format!("run '{id}' stopped computing before the command was applied"),
        ))
    })
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
            let g = sh.records.lock().unwrap();
            get_run(sh, &run)?;
            if !sh.is_active(&run) {
                return Err(err(
                    "bad_state",
                    format!(
                        "run '{run}' is not computing; its checkpoints are listed by 'checkpoints'"
                    ),
                ));
            }
            ask_worker(sh, &run, g, Control::Checkpoint)
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
            let g = sh.records.lock().unwrap();
            let r = get_run(sh, &run)?;
            if sh.is_active(&run) || r.state == RunState::Running {
                return Err(err(
                    "bad_state",
                    format!("run '{run}' is running: stop it first"),
                ));
            }
            sh.store.delete_run(&run).map_err(internal)?;
            // Its events go with it: the durable removal is the record of it.
            // A crash before the folder is gone leaves an orphan that the
            // next start removes (ids are never reused).
            flushed(sh)?;
            drop(g);
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
    let mut rec = RunRecord {
        // Given by the store when the run is entered.
        id: String::new(),
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
        .create_run(&mut rec, "queued: submitted".into())
        .map_err(internal)?;
    flushed(sh)?;
    sh.push(Push::Event {
        run: rec.id.clone(),
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
    let g = sh.records.lock().unwrap();
    let mut r = get_run(sh, id)?;
    if sh.is_active(id) {
        // Claimed by the compute thread (even if its record still says
        // queued): it pauses or stops at the next step boundary and answers
        // once the new state is durable.
        match what {
            "pause" => return ask_worker(sh, id, g, Control::Pause),
            "stop" => return ask_worker(sh, id, g, Control::Stop),
            _ => {}
        }
    }
    let new = match (what, r.state) {
        // Running but not claimed: left running by a crash, not resumed yet.
        ("pause", RunState::Queued | RunState::Running) => RunState::Paused,
        ("resume", RunState::Paused | RunState::Stopped) => {
            requeue_ok(sh, &r)?;
            RunState::Queued
        }
        ("stop", RunState::Queued | RunState::Running | RunState::Paused) => RunState::Stopped,
        (_, s) => {
            return Err(err(
                "bad_state",
                format!("cannot {what} run '{id}': it is {}", s.name()),
            ))
        }
    };
    r.state = new;
    let at = r.progress.rl_steps_done;
    let ev = sh
        .store
        .append_event(
            &mut r,
            "info",
            "state",
            format!("{}: by request", new.name()),
            Some(at),
        )
        .map_err(internal)?;
    sh.store.put_run(&r).map_err(internal)?;
    flushed(sh)?;
    drop(g);
    sh.push(Push::Event {
        run: id.into(),
        event: ev,
    });
    sh.push(Push::Run { run: r.info() });
    sh.notify();
    Ok(to_value(r.info()))
}

/// Roll back to the checkpoint of RL step `step` on the run's live line.
///
/// A computing run restores it at the next step boundary and goes on. A run
/// that is not computing gets the restore recorded now: its step, branch and
/// abandoned metrics change at once (so `status` shows the restored step as
/// soon as this is answered) and the weights are loaded when it next
/// computes. A paused run stays paused at the restored step (the operator
/// paused to inspect; `resume` goes on from there); a queued run stays
/// queued; a stopped, finished or failed run is queued again.
fn rollback(sh: &Arc<Shared>, id: &str, step: u64) -> Res {
    let r = get_run(sh, id)?;
    let cat = sh.store.checkpoints(id).map_err(internal)?;
    let line = lineage::live(cat, lineage::of_run(&r));
    let Some(c) = line
        .iter()
        .rev()
        .find(|c| c.info.phase == "rl" && c.info.step == step)
    else {
        let have: Vec<String> = line
            .iter()
            .filter(|c| c.info.phase == "rl")
            .map(|c| c.info.step.to_string())
            .collect();
        return Err(err(
            "no_checkpoint",
            format!(
                "run '{id}' has no checkpoint at RL step {step} at or before its step {} (have: {})",
                r.progress.rl_steps_done,
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
    // Hashes first, outside the lock: reading a large checkpoint takes a while.
    let state = checkpoint::verify(Path::new(&c.info.path), &c.files)
        .and_then(|()| checkpoint::read_state(Path::new(&c.info.path)));
    let state = match state {
        Ok(s) => s,
        Err(e) => {
            let mut bad = c.clone();
            bad.info.health = "bad".into();
            sh.store.put_checkpoint(id, &bad).map_err(internal)?;
            flushed(sh)?;
            return Err(err("bad_checkpoint", e.to_string()));
        }
    };
    let g = sh.records.lock().unwrap();
    if sh.is_active(id) {
        return ask_worker(sh, id, g, |tx| Control::Rollback(step, tx));
    }
    let mut r = get_run(sh, id)?;
    // A paused run stays paused; any other is queued again and needs a place to compute.
    if r.state != RunState::Paused {
        requeue_ok(sh, &r)?;
    }
    if sh
        .store
        .abandon_after(id, &c.info.phase, c.info.step)
        .map_err(internal)?
        > 0
    {
        r.branch += 1;
    }
    r.progress = state.progress;
    r.last_reward = c.info.reward_mean;
    r.last_heldout = c.info.heldout_accuracy;
    r.restore = Some(RestorePlan {
        path: c.info.path.clone(),
        skip: 0,
        lr_factor: 1.0,
    });
    if r.state != RunState::Paused {
        r.state = RunState::Queued;
    }
    let then = if r.state == RunState::Paused {
        "stays paused: resume to go on"
    } else {
        "queued to go on"
    };
    let msg = format!(
        "rolled back to RL step {step} (branch {}); {then}",
        r.branch
    );
    let ev = sh
        .store
        .append_event(&mut r, "warn", "rollback", msg, Some(step))
        .map_err(internal)?;
    sh.store.put_run(&r).map_err(internal)?;
    flushed(sh)?;
    drop(g);
    sh.push(Push::Event {
        run: id.into(),
        event: ev,
    });
    sh.push(Push::Run { run: r.info() });
    sh.notify();
    Ok(to_value(r.info()))
}
