//! The compute thread: one run at a time, step by step, with commands,
//! checkpoints, health checks and automatic rollback between steps.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use jet_proto::{CheckpointInfo, Push, RunState};

use super::devices::ServedGpu;
use super::lineage;
use super::shared::{Ack, Control, Reply, Shared, Slot};
use crate::checkpoint;
use crate::config::{Remedy, RunConfig};
use crate::health::{preemption_warning, Health};
use crate::store::{now_ms, CheckpointRecord, RestorePlan, RunRecord};
use crate::trainer::Trainer;

/// Parse a run's config from its record, with the submit-time overrides.
pub fn record_config(rec: &RunRecord) -> Result<RunConfig, String> {
    let mut cfg = RunConfig::from_str_at(&rec.config_toml, &rec.config_source, &rec.config_base)
        .map_err(|e| e.to_string())?;
    if let Some(s) = rec.steps {
        cfg.run.steps = s;
    }
    if let Some(s) = rec.seed {
        cfg.run.seed = s;
    }
    if let Some(f) = &rec.flow {
        cfg.run.flow.0 = f
            .parse()
            .map_err(|e: jet_kernels::flow::UnknownFlow| e.to_string())?;
    }
    Ok(cfg)
}

/// The compute loop of one slot (the CPU, or one GPU); returns when the daemon
/// shuts down.
pub fn run_worker(sh: Arc<Shared>, slot: Slot, gpu: Option<ServedGpu>) {
    if let Some(g) = &gpu {
        warm_up(g);
    }
    while !sh.shutdown.load(Ordering::SeqCst) {
        match claim(&sh, slot) {
            Some(id) => {
                let acks = run_one(&sh, &id, gpu.as_ref()).unwrap_or_else(|e| {
                    eprintln!("jetd: run {id}: {e}");
                    vec![]
                });
                // run_one released the run already unless it failed early.
                release(&sh, &id);
                // Answered only now: the run's final state is durable and the
                // run is no longer computing, so a command sent right after
                // the answer (a rollback after a pause) acts on the record.
                for (tx, r) in acks {
                    let _ = tx.send(r);
                }
            }
            None => {
                let g = sh.wake_lock.lock().unwrap();
                let _ = sh.wake.wait_timeout(g, Duration::from_millis(500)).unwrap();
            }
        }
    }
}

/// Compile (or load from the store) every kernel module before the first run,
/// and say which it was.
fn warm_up(g: &ServedGpu) {
    match g.gpu.warm_up() {
        Ok(()) => eprintln!("jetd: {}", kernels_line(g)),
        Err(e) => eprintln!("jetd: GPU {}: preparing the kernels failed: {e}", g.ordinal),
    }
}

/// `GPU 0 (NVIDIA H100 80GB HBM3): kernels: 0 compiled, 9 from the store`; the
/// counts are this process's, for this GPU.
fn kernels_line(g: &ServedGpu) -> String {
    let k = g.gpu.kernel_stats();
    format!(
        "GPU {} ({}): kernels: {} compiled, {} from the store",
        g.ordinal,
        g.gpu.name(),
        k.compiled,
        k.from_store
    )
}

/// The run stops computing. Commands still queued for it are answered with an
/// error rather than left waiting. Call with `records` held.
fn release_locked(sh: &Shared, id: &str) {
    let state = sh
        .store
        .run(id)
        .ok()
        .flatten()
        .map_or("gone", |r| r.state.name());
    for c in sh.take_controls(id) {
        let what = c.name();
        let _ = c.into_ack().send(Err((
            "bad_state".into(),
            format!("run '{id}' stopped computing (it is {state}) before the {what} was applied"),
        )));
    }
    sh.active.lock().unwrap().remove(id);
}

fn release(sh: &Shared, id: &str) {
    let _g = sh.records.lock().unwrap();
    release_locked(sh, id);
}

/// Take the next run this slot computes, marking it active: runs that were
/// running when the daemon stopped go first, then the queue in submission order.
/// Under `records`: a handler sees a run either as computing (and queues its
/// command for the worker) or not (and changes the record itself), never in
/// between.
fn claim(sh: &Shared, slot: Slot) -> Option<String> {
    let _g = sh.records.lock().unwrap();
    let mut active = sh.active.lock().unwrap();
    let runs = sh.store.runs().ok()?;
    let mine = |r: &&RunRecord| slot.takes(&r.device) && !active.contains_key(&r.id);
    let id = runs
        .iter()
        .filter(mine)
        .find(|r| r.state == RunState::Running)
        .or_else(|| {
            runs.iter()
                .filter(mine)
                .find(|r| r.state == RunState::Queued)
        })?
        .id
        .clone();
    active.insert(id.clone(), slot);
    Some(id)
}

struct Active<'a> {
    sh: &'a Shared,
    rec: RunRecord,
    t: Trainer,
    health: Health,
    /// Whether this turn has warned of KV-cache preemptions (once a turn: a
    /// bound too small for the rollout preempts at most steps).
    warned_preempt: bool,
    /// Pause and stop requests, answered once the run has ended its turn.
    pending: Vec<Ack>,
}

impl Active<'_> {
    fn save(&mut self) {
        let _g = self.sh.records.lock().unwrap();
        // Keep fields that handlers may have changed meanwhile (none today but
        // the state of a non-active run), then write ours.
        self.rec.progress = self.t.progress;
        if let Err(e) = self.sh.store.put_run(&self.rec) {
            eprintln!("jetd: store: {e}");
        }
        self.sh.push(Push::Run {
            run: self.rec.info(),
        });
    }

    fn event(&mut self, level: &str, kind: &str, message: String, step: Option<u64>) {
        match self
            .sh
            .store
            .append_event(&mut self.rec, level, kind, message, step)
        {
            Ok(e) => self.sh.push(Push::Event {
                run: self.rec.id.clone(),
                event: e,
            }),
            Err(e) => eprintln!("jetd: store: {e}"),
        }
    }

    fn set_state(&mut self, s: RunState, why: &str) {
        self.rec.state = s;
        self.event(
            "info",
            "state",
            format!("{}: {why}", s.name()),
            Some(self.t.progress.rl_steps_done),
        );
        self.save();
    }

    /// End this run's turn: its final state and event durable and the run
    /// released, together under `records`; then the answers to the pause or
    /// stop requests that ended it (sent by the caller).
    fn finish(mut self, end: RunState, why: &str) -> Vec<(Ack, Reply)> {
        let sh = self.sh;
        let g = sh.records.lock().unwrap();
        self.rec.progress = self.t.progress;
        let step = Some(self.t.progress.rl_steps_done);
        if end == RunState::Running {
            // Shutdown: stays "running" so the next jetd resumes it.
            self.event("info", "state", why.into(), step);
        } else {
            self.rec.state = end;
            self.event("info", "state", format!("{}: {why}", end.name()), step);
        }
        let saved = sh
            .store
            .put_run(&self.rec)
            .and_then(|()| sh.store.flush())
            .map_err(|e| ("internal".to_string(), e.to_string()));
        sh.push(Push::Run {
            run: self.rec.info(),
        });
        release_locked(sh, &self.rec.id);
        drop(g);
        let reply: Reply = saved.map(|()| serde_json::to_value(self.rec.info()).unwrap());
        self.pending
            .drain(..)
            .map(|tx| (tx, reply.clone()))
            .collect()
    }

    fn position(&self) -> (&'static str, u64) {
        if self.t.progress.sft_steps_done < self.t.sft_total() {
            ("sft", self.t.progress.sft_steps_done)
        } else {
            ("rl", self.t.progress.rl_steps_done)
        }
    }

    /// Take a checkpoint now (or return the one already taken at this point).
    fn checkpoint(&mut self) -> Result<CheckpointRecord, String> {
        let (phase, step) = self.position();
        let id = self.rec.id.clone();
        let dir = self
            .sh
            .run_dir(&id)
            .join("checkpoints")
            .join(format!("b{}-{phase}-{step:06}", self.rec.branch));
        let path = dir.display().to_string();
        let catalog = self.sh.store.checkpoints(&id).map_err(|e| e.to_string())?;
        if let Some(c) = catalog.iter().find(|c| c.info.path == path) {
            return Ok(c.clone());
        }
        if dir.exists() {
            // Left by a crash before the catalog entry: not trusted, replaced.
            std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let files = checkpoint::save(&dir, &mut self.t).map_err(|e| e.to_string())?;
        let bytes = files.iter().map(|f| f.bytes).sum();
        let rec = CheckpointRecord {
            info: CheckpointInfo {
                step,
                phase: phase.into(),
                path,
                health: "ok".into(),
                heldout_accuracy: self.t.last_heldout,
                reward_mean: self.rec.last_reward,
                unix_ms: now_ms(),
                bytes,
            },
            branch: self.rec.branch,
            files,
        };
        self.sh
            .store
            .put_checkpoint(&id, &rec)
            .map_err(|e| e.to_string())?;
        self.sh.store.flush().map_err(|e| e.to_string())?;
        self.sh.push(Push::Checkpoint {
            run: id,
            checkpoint: rec.info.clone(),
        });
        self.event(
            "info",
            "checkpoint",
            format!("checkpoint at {phase} step {step}"),
            Some(step),
        );
        self.retain(lineage::of_checkpoint(&rec));
        Ok(rec)
    }

    /// keep-last-K of the live line at `at` plus keep-best by held-out accuracy;
    /// the rest are deleted (catalog entry first, then the folder).
    fn retain(&mut self, at: lineage::Position) {
        let cfg = self.t.cfg.checkpoint.clone();
        let Ok(cat) = self.sh.store.checkpoints(&self.rec.id) else {
            return;
        };
        let best = cat
            .iter()
            .filter(|c| c.info.health == "ok")
            .filter_map(|c| c.info.heldout_accuracy.map(|h| (h, c.info.path.clone())))
            .fold(None, |b: Option<(f64, String)>, x| {
                if b.as_ref().is_none_or(|b| x.0 > b.0) {
                    Some(x)
                } else {
                    b
                }
            });
        let pinned = self.rec.restore.as_ref().map(|r| r.path.clone());
        let mut doomed = Vec::new();
        for c in lineage::prunable(&cat, at, cfg.keep_last) {
            let is_best = cfg.keep_best && best.as_ref().is_some_and(|b| b.1 == c.info.path);
            if is_best || pinned.as_deref() == Some(c.info.path.as_str()) {
                continue;
            }
            if self.sh.store.remove_checkpoint(&self.rec.id, &c).is_ok() {
                doomed.push(c.info.path);
            }
        }
        // The removals must be durable before any file goes: a kill -9 between
        // an unflushed removal and the folder's deletion would otherwise leave
        // a catalogued checkpoint with files missing.
        if doomed.is_empty() || self.sh.store.flush().is_err() {
            return;
        }
        for path in doomed {
            let _ = std::fs::remove_dir_all(&path);
        }
    }

    /// Restore the catalogued checkpoint at `path`; a hash mismatch marks it bad.
    fn restore(&mut self, path: &str) -> Result<CheckpointRecord, String> {
        let cat = self
            .sh
            .store
            .checkpoints(&self.rec.id)
            .map_err(|e| e.to_string())?;
        let mut c = cat
            .into_iter()
            .find(|c| c.info.path == path)
            .ok_or(format!("no checkpoint {path} in the catalog"))?;
        if let Err(e) = checkpoint::restore(Path::new(path), &c.files, &mut self.t) {
            // A device error (out of memory, say) says nothing about the files.
            if !matches!(e, checkpoint::CheckpointError::Device { .. }) {
                c.info.health = "bad".into();
                let _ = self.sh.store.put_checkpoint(&self.rec.id, &c);
            }
            self.event(
                "alarm",
                "alarm.checkpoint",
                e.to_string(),
                Some(c.info.step),
            );
            return Err(e.to_string());
        }
        let n = self
            .sh
            .store
            .abandon_after(&self.rec.id, &c.info.phase, c.info.step)
            .map_err(|e| e.to_string())?;
        if n > 0 {
            self.rec.branch += 1;
        }
        self.health = Health::default();
        Ok(c)
    }

    /// Restore per the record's plan and apply its remedy.
    fn apply_plan(&mut self, plan: RestorePlan) -> Result<(), String> {
        let c = self.restore(&plan.path)?;
        self.t.progress.data_offset += plan.skip;
        self.t.progress.lr_scale *= plan.lr_factor;
        self.rec.restore = None;
        self.event(
            "warn",
            "rollback",
            format!(
                "restored {} step {} (branch {}); data offset {}, lr scale {}",
                c.info.phase,
                c.info.step,
                self.rec.branch,
                self.t.progress.data_offset,
                self.t.progress.lr_scale
            ),
            Some(c.info.step),
        );
        self.save();
        Ok(())
    }

    /// After a crash or restart: the latest good checkpoint, or from scratch.
    fn resume(&mut self) -> Result<(), String> {
        if self.rec.progress.sft_steps_done == 0 && self.rec.progress.rl_steps_done == 0 {
            return Ok(());
        }
        let cat = self
            .sh
            .store
            .checkpoints(&self.rec.id)
            .map_err(|e| e.to_string())?;
        // The persisted progress is at or after the last durable checkpoint of
        // the live line (each checkpoint flushes the record written before it).
        let line = lineage::live(cat, lineage::of_run(&self.rec));
        for c in line.iter().rev().filter(|c| c.info.health == "ok") {
            if self.restore(&c.info.path).is_ok() {
                self.event(
                    "info",
                    "resume",
                    format!("resumed from {} step {}", c.info.phase, c.info.step),
                    Some(c.info.step),
                );
                return Ok(());
            }
        }
        let n = self
            .sh
            .store
            .abandon_after(&self.rec.id, "sft", 0)
            .map_err(|e| e.to_string())?;
        if n > 0 {
            self.rec.branch += 1;
        }
        self.event(
            "warn",
            "resume",
            "no usable checkpoint: starting over".into(),
            None,
        );
        Ok(())
    }

    /// Roll back to the newest healthy RL checkpoint at or before `step`.
    fn rollback_target(&mut self, exact: Option<u64>, at_most: u64) -> Option<CheckpointRecord> {
        let cat = self.sh.store.checkpoints(&self.rec.id).ok()?;
        self.rec.progress = self.t.progress;
        lineage::live(cat, lineage::of_run(&self.rec))
            .into_iter()
            .rev()
            .filter(|c| c.info.health == "ok" && c.info.phase == "rl")
            .find(|c| exact.map_or(c.info.step <= at_most, |s| c.info.step == s))
    }

    /// Make what was written durable before answering; a failed flush turns
    /// the answer into an error (nothing is promised that may be lost).
    fn durable(&self, r: Reply) -> Reply {
        match self.sh.store.flush() {
            Ok(()) => r,
            Err(e) => Err(("internal".into(), e.to_string())),
        }
    }

    fn handle(&mut self, c: Control) -> Option<RunState> {
        match c {
            Control::Pause(tx) => {
                self.pending.push(tx);
                return Some(RunState::Paused);
            }
            Control::Stop(tx) => {
                self.pending.push(tx);
                return Some(RunState::Stopped);
            }
            Control::Checkpoint(tx) => {
                let r: Reply = self
                    .checkpoint()
                    .map(|c| serde_json::to_value(c.info).unwrap())
                    .map_err(|e| ("internal".into(), e));
                let _ = tx.send(self.durable(r));
            }
            Control::Rollback(step, tx) => {
                let r: Reply = match self.rollback_target(Some(step), step) {
                    None => Err((
                        "no_checkpoint".into(),
                        format!(
                            "run {} has no healthy checkpoint at RL step {step}",
                            self.rec.id
                        ),
                    )),
                    Some(c) => self
                        .apply_plan(RestorePlan {
                            path: c.info.path,
                            skip: 0,
                            lr_factor: 1.0,
                        })
                        .map(|_| serde_json::to_value(self.rec.info()).unwrap())
                        .map_err(|e| ("bad_checkpoint".into(), e)),
                };
                let _ = tx.send(self.durable(r));
            }
        }
        None
    }

    /// Act on a collapse alarm at RL step `step` (its update made things bad).
    fn auto_rollback(&mut self, step: u64, first_bad: u64) -> Option<RunState> {
        let h = self.t.cfg.health.clone();
        if !h.auto_rollback {
            return None;
        }
        if self.rec.auto_rollbacks >= h.max_rollbacks {
            self.event(
                "alarm",
                "alarm.rollback_limit",
                format!(
                    "{} automatic rollbacks used: pausing the run",
                    h.max_rollbacks
                ),
                Some(step),
            );
            return Some(RunState::Paused);
        }
        let Some(c) = self.rollback_target(None, first_bad) else {
            self.event(
                "alarm",
                "alarm.rollback",
                "no healthy checkpoint to roll back to: pausing".into(),
                Some(step),
            );
            return Some(RunState::Paused);
        };
        self.rec.auto_rollbacks += 1;
        let (skip, lr_factor) = match h.remedy {
            Remedy::SkipBatch => (step + 1 - c.info.step, 1.0),
            Remedy::LowerLr => (0, h.lr_factor),
        };
        match self.apply_plan(RestorePlan {
            path: c.info.path,
            skip,
            lr_factor,
        }) {
            Ok(()) => None,
            Err(_) => Some(RunState::Paused),
        }
    }

    /// One step and everything around it; Some(state) ends the run's turn.
    fn step(&mut self) -> Option<RunState> {
        let mut end = None;
        for c in self.sh.take_controls(&self.rec.id) {
            match end {
                None => end = self.handle(c),
                // A pause or stop came first: what follows it is not applied.
                Some(e) => {
                    let what = c.name();
                    let _ = c.into_ack().send(Err((
                        "bad_state".into(),
                        format!(
                            "run '{}' is {} at this step boundary: the {what} was not applied",
                            self.rec.id,
                            RunState::name(e)
                        ),
                    )));
                }
            }
        }
        if end.is_some() {
            return end;
        }
        if self.sh.shutdown.load(Ordering::SeqCst) {
            return Some(RunState::Running);
        }
        let Some(res) = self.t.next_step() else {
            return Some(RunState::Finished);
        };
        let m = match res {
            Ok(m) => m,
            Err(e) => {
                self.rec.message = Some(e.to_string());
                self.event("alarm", "error", e.to_string(), None);
                return Some(RunState::Failed);
            }
        };
        let v = serde_json::to_value(&m).expect("metrics serialize");
        match self.sh.store.append_metrics(&mut self.rec, v) {
            Ok(v) => self.sh.push(Push::Metrics {
                run: self.rec.id.clone(),
                metrics: v,
            }),
            Err(e) => eprintln!("jetd: store: {e}"),
        }
        if m.phase == "rl" {
            self.rec.last_reward = m.reward_mean;
            if m.heldout_accuracy.is_some() {
                self.rec.last_heldout = m.heldout_accuracy;
            }
            if let Some(msg) = preemption_warning(&m).filter(|_| !self.warned_preempt) {
                self.warned_preempt = true;
                self.event("warn", "rollout.preempted", msg, Some(m.step));
            }
            let alarms = self.health.check(&self.t.cfg.health, &m);
            let mut collapse = false;
            for a in &alarms {
                self.event(
                    if a.collapse { "alarm" } else { "warn" },
                    a.kind,
                    a.message.clone(),
                    Some(m.step),
                );
                collapse |= a.collapse;
            }
            if collapse {
                let k = if alarms.iter().any(|a| a.kind == "alarm.reward_collapse") {
                    self.t.cfg.health.reward_drop_steps
                } else {
                    1
                };
                let first_bad = (m.step + 1).saturating_sub(k);
                if let Some(s) = self.auto_rollback(m.step, first_bad) {
                    return Some(s);
                }
                self.save();
                return None;
            }
        }
        self.save();
        let p = self.t.progress;
        let every = self.t.cfg.checkpoint.every;
        let sft_done =
            p.sft_steps_done == self.t.sft_total() && p.rl_steps_done == 0 && m.phase == "sft";
        if sft_done || (m.phase == "rl" && every > 0 && p.rl_steps_done.is_multiple_of(every)) {
            if let Err(e) = self.checkpoint() {
                self.event(
                    "alarm",
                    "alarm.checkpoint",
                    format!("checkpoint failed: {e}"),
                    Some(p.rl_steps_done),
                );
            }
        }
        None
    }
}

/// Compute one run until its turn ends; the answers to the pause or stop that
/// ended it, to send once the run is released.
fn run_one(sh: &Shared, id: &str, gpu: Option<&ServedGpu>) -> Result<Vec<(Ack, Reply)>, String> {
    let mut rec = sh
        .store
        .run(id)
        .map_err(|e| e.to_string())?
        .ok_or("run vanished")?;
    let started = rec.state;
    if let Some(g) = gpu {
        rec.gpu = Some(g.ordinal);
    }
    let trainer = record_config(&rec).and_then(|cfg| {
        Trainer::with_gpu(cfg, None, gpu.map(|g| g.gpu.clone())).map_err(|e| e.to_string())
    });
    let t = match trainer {
        Ok(t) => t,
        Err(e) => {
            rec.state = RunState::Failed;
            rec.message = Some(e.clone());
            let ev = sh
                .store
                .append_event(&mut rec, "alarm", "error", e, None)
                .map_err(|e| e.to_string())?;
            sh.store.put_run(&rec).map_err(|e| e.to_string())?;
            sh.push(Push::Event {
                run: id.into(),
                event: ev,
            });
            sh.push(Push::Run { run: rec.info() });
            sh.store.flush().map_err(|e| e.to_string())?;
            return Ok(vec![]);
        }
    };
    let mut a = Active {
        sh,
        rec,
        t,
        health: Health::default(),
        warned_preempt: false,
        pending: vec![],
    };
    if let Some(g) = gpu {
        a.event("info", "device", kernels_line(g), None);
    }
    let restored = match a.rec.restore.clone() {
        Some(plan) => a.apply_plan(plan),
        None => a.resume(),
    };
    if let Err(e) = restored {
        a.rec.message = Some(e.clone());
        return Ok(a.finish(RunState::Failed, &e));
    }
    a.set_state(
        RunState::Running,
        if started == RunState::Running {
            "resumed after restart"
        } else {
            "started"
        },
    );
    let end = loop {
        if let Some(s) = a.step() {
            break s;
        }
    };
    // Leave a checkpoint for whatever comes next (resume, restart, rollback).
    if end != RunState::Failed {
        if let Err(e) = a.checkpoint() {
            a.event(
                "alarm",
                "alarm.checkpoint",
                format!("checkpoint failed: {e}"),
                None,
            );
        }
    }
    let why = match end {
        RunState::Running => "daemon shutting down: checkpointed",
        RunState::Paused => "paused at a step boundary",
        RunState::Stopped => "stopped by request",
        RunState::Finished => "all steps done",
        _ => "ended",
    };
    Ok(a.finish(end, why))
}
