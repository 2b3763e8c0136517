//! The console's state: pure data, fed by protocol messages ([`App::apply_snapshot`],
//! [`App::apply_push`], [`App::apply_result`]) and by keys (`keys.rs`); drawn by `ui`.

use jet_proto::{CheckpointInfo, ErrorBody, Event, GpuSample, Op, Push, RunInfo, Snapshot};
use serde_json::Value;

use crate::fmt::{is_abandoned, is_rl, step_of};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Runs,
    Dashboard,
    Events,
    Checkpoints,
    /// The marked runs overlaid (2 to 4).
    Compare,
}

impl View {
    pub const ALL: [View; 5] = [
        View::Runs,
        View::Dashboard,
        View::Events,
        View::Checkpoints,
        View::Compare,
    ];

    pub fn title(self) -> &'static str {
        match self {
            View::Runs => "Runs",
            View::Dashboard => "Dashboard",
            View::Events => "Events",
            View::Checkpoints => "Checkpoints",
            View::Compare => "Compare",
        }
    }

    pub fn index(self) -> usize {
        View::ALL.iter().position(|v| *v == self).unwrap_or(0)
    }
}

/// The link to jetd, as the status line shows it.
#[derive(Clone, Debug, PartialEq)]
pub enum ConnState {
    Connecting,
    Connected { server: String },
    Reconnecting { in_s: u64, reason: String },
}

/// A question the operator must answer before anything is sent.
#[derive(Clone, Debug, PartialEq)]
pub enum Dialog {
    Rollback { run: String, step: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// What the console loop must do after a key.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Quit,
    /// Send this request; the reply goes to [`App::apply_result`] with this label.
    Send(Op, String),
}

#[derive(Clone, Debug)]
pub struct App {
    pub view: View,
    pub readonly: bool,
    pub socket: String,
    pub conn: ConnState,
    pub runs: Vec<RunInfo>,
    /// The opened run: its metrics, events and checkpoints are below.
    pub run: Option<String>,
    pub metrics: Vec<Value>,
    pub events: Vec<Event>,
    pub checkpoints: Vec<CheckpointInfo>,
    pub gpus: Option<Vec<GpuSample>>,
    pub runs_sel: usize,
    pub events_sel: usize,
    pub ckpt_sel: usize,
    pub runs_filter: String,
    pub events_filter: String,
    /// Typing into the filter of the current view.
    pub filter_editing: bool,
    pub smoothing: bool,
    pub help: bool,
    pub dialog: Option<Dialog>,
    pub flash: Option<(String, Level)>,
    /// Runs marked for the Compare view, in marking order (at most 4).
    pub marked: Vec<String>,
    /// Metrics of the marked runs, once fetched (then kept live by pushes).
    pub compared: Vec<(String, Vec<Value>)>,
    /// Marked runs whose metrics were asked for on this connection.
    pub compare_asked: Vec<String>,
}

impl App {
    pub fn new(socket: impl Into<String>, readonly: bool) -> App {
        App {
            view: View::Runs,
            readonly,
            socket: socket.into(),
            conn: ConnState::Connecting,
            runs: vec![],
            run: None,
            metrics: vec![],
            events: vec![],
            checkpoints: vec![],
            gpus: None,
            runs_sel: 0,
            events_sel: 0,
            ckpt_sel: 0,
            runs_filter: String::new(),
            events_filter: String::new(),
            filter_editing: false,
            smoothing: false,
            help: false,
            dialog: None,
            flash: None,
            marked: vec![],
            compared: vec![],
            compare_asked: vec![],
        }
    }

    /// What the connection subscribes to: every run while comparing (the
    /// marked runs' pushes), else the opened run.
    pub fn subscription(&self) -> Option<String> {
        if self.view == View::Compare && !self.marked.is_empty() {
            None
        } else {
            self.run.clone()
        }
    }

    /// Requests for the metrics of marked runs not yet asked for on this
    /// connection (the Compare view's data); pushes keep them live after.
    pub fn compare_fetches(&mut self) -> Vec<(Op, String)> {
        if self.view != View::Compare {
            return vec![];
        }
        let todo: Vec<String> = self
            .marked
            .iter()
            .filter(|r| !self.compare_asked.contains(r))
            .cloned()
            .collect();
        self.compare_asked.extend(todo.iter().cloned());
        todo.into_iter()
            .map(|run| {
                let label = format!("{COMPARE_LABEL}{run}");
                let op = Op::Metrics {
                    run,
                    from: None,
                    to: None,
                };
                (op, label)
            })
            .collect()
    }

    /// The marked runs with their metrics (empty until fetched), in marking order.
    pub fn compare_sources(&self) -> Vec<crate::compare::Source> {
        self.marked
            .iter()
            .map(|id| {
                let metrics = self
                    .compared
                    .iter()
                    .find(|(r, _)| r == id)
                    .map(|(_, m)| m.clone())
                    .unwrap_or_default();
                match self.runs.iter().find(|r| &r.id == id) {
                    Some(info) => crate::compare::Source::run(info, metrics),
                    None => crate::compare::Source {
                        id: id.clone(),
                        label: id.clone(),
                        flow: "?".into(),
                        metrics,
                    },
                }
            })
            .collect()
    }

    pub fn flash(&mut self, msg: impl Into<String>, level: Level) {
        self.flash = Some((msg.into(), level));
    }

    /// Open a run: its data comes with the next snapshot.
    pub fn open_run(&mut self, id: &str) {
        if self.run.as_deref() != Some(id) {
            self.run = Some(id.to_string());
            self.metrics.clear();
            self.events.clear();
            self.checkpoints.clear();
            self.events_sel = 0;
            self.ckpt_sel = 0;
        }
    }

    pub fn current_run(&self) -> Option<&RunInfo> {
        let id = self.run.as_deref()?;
        self.runs.iter().find(|r| r.id == id)
    }

    /// Runs that pass the runs filter, in the server's order.
    pub fn visible_runs(&self) -> Vec<&RunInfo> {
        let f = self.runs_filter.to_lowercase();
        self.runs
            .iter()
            .filter(|r| {
                f.is_empty()
                    || [
                        r.id.as_str(),
                        r.name.as_str(),
                        r.state.name(),
                        r.flow.as_str(),
                    ]
                    .iter()
                    .any(|s| s.to_lowercase().contains(&f))
            })
            .collect()
    }

    pub fn selected_run(&self) -> Option<&RunInfo> {
        self.visible_runs().get(self.runs_sel).copied()
    }

    /// Events that pass the events filter, newest first.
    pub fn visible_events(&self) -> Vec<&Event> {
        let f = self.events_filter.to_lowercase();
        self.events
            .iter()
            .rev()
            .filter(|e| {
                f.is_empty()
                    || e.level.to_lowercase().contains(&f)
                    || e.kind.to_lowercase().contains(&f)
                    || e.message.to_lowercase().contains(&f)
                    || e.step.is_some_and(|s| s.to_string() == f)
            })
            .collect()
    }

    /// Checkpoints, newest first.
    pub fn visible_checkpoints(&self) -> Vec<&CheckpointInfo> {
        let mut v: Vec<&CheckpointInfo> = self.checkpoints.iter().collect();
        v.sort_by_key(|c| std::cmp::Reverse((c.unix_ms, c.phase == "rl", c.step)));
        v
    }

    pub fn selected_checkpoint(&self) -> Option<&CheckpointInfo> {
        self.visible_checkpoints().get(self.ckpt_sel).copied()
    }

    /// The metrics of RL step `step` on the current line of the run (not abandoned).
    pub fn metrics_at(&self, step: u64) -> Option<&Value> {
        self.metrics
            .iter()
            .rev()
            .find(|m| is_rl(m) && !is_abandoned(m) && step_of(m) == Some(step))
    }

    /// Everything the store held when we subscribed.
    pub fn apply_snapshot(&mut self, s: Snapshot) {
        self.runs = s.runs;
        self.metrics = s.metrics;
        self.events = s.events;
        self.checkpoints = s.checkpoints;
        self.gpus = s.gpus;
        self.clamp();
    }

    /// A live delta. Pushes about other runs than the opened one only update the table.
    pub fn apply_push(&mut self, p: Push) {
        let mine = |r: &str, me: &Option<String>| me.as_deref() == Some(r);
        match p {
            Push::Metrics { run, metrics } => {
                if let Some((_, ms)) = self.compared.iter_mut().find(|(r, _)| *r == run) {
                    merge_step(ms, metrics.clone());
                }
                if mine(&run, &self.run) {
                    merge_step(&mut self.metrics, metrics);
                }
            }
            Push::Event { run, event }
                if mine(&run, &self.run) && !self.events.iter().any(|e| e.seq == event.seq) =>
            {
                self.events.push(event);
                if self.events_sel > 0 {
                    self.events_sel += 1; // keep the same event selected (newest first)
                }
            }
            Push::Checkpoint { run, checkpoint } if mine(&run, &self.run) => {
                self.upsert_checkpoint(checkpoint)
            }
            Push::Run { run } => self.upsert_run(run),
            Push::Gpu { gpus } => self.gpus = Some(gpus),
            _ => {}
        }
        self.clamp();
    }

    /// Mark `run` for the Compare view, or unmark it; at most [`MAX_MARKED`].
    pub fn toggle_mark(&mut self, run: &str) {
        if let Some(i) = self.marked.iter().position(|r| r == run) {
            self.marked.remove(i);
            self.compared.retain(|(r, _)| r != run);
            self.compare_asked.retain(|r| r != run);
            self.flash(
                format!("{run} unmarked ({} marked)", self.marked.len()),
                Level::Info,
            );
        } else if self.marked.len() >= MAX_MARKED {
            self.flash(
                format!("{MAX_MARKED} runs marked already: unmark one (m) first"),
                Level::Warn,
            );
        } else {
            self.marked.push(run.to_string());
            let n = self.marked.len();
            let hint = if n >= 2 {
                ": 5 compares them"
            } else {
                ": mark another"
            };
            self.flash(format!("{run} marked ({n} marked){hint}"), Level::Info);
        }
    }
}

/// Label of the requests for a compared run's metrics (`compare r0003`).
pub const COMPARE_LABEL: &str = "compare ";
/// Most runs the Compare view overlays.
pub const MAX_MARKED: usize = crate::compare::MAX_SERIES;

/// Add one step to a run's metrics. A step of a newer branch marks the steps it
/// replaces (same or later step, older branch) as abandoned, as the store does
/// after a rollback.
fn merge_step(metrics: &mut Vec<Value>, m: Value) {
    let branch = m.get("branch").and_then(Value::as_u64).unwrap_or(0);
    let step = step_of(&m);
    let rl = is_rl(&m);
    if let (true, Some(step)) = (rl, step) {
        for old in metrics.iter_mut().filter(|o| is_rl(o)) {
            let ob = old.get("branch").and_then(Value::as_u64).unwrap_or(0);
            if ob < branch && step_of(old).is_some_and(|s| s >= step) {
                if let Some(o) = old.as_object_mut() {
                    o.insert("abandoned".into(), Value::Bool(true));
                }
            }
        }
    }
    let same = |o: &Value| {
        is_rl(o) == rl
            && step_of(o) == step
            && o.get("branch").and_then(Value::as_u64).unwrap_or(0) == branch
    };
    match metrics.iter().position(same) {
        Some(i) => metrics[i] = m,
        None => metrics.push(m),
    }
}

impl App {
    pub fn upsert_run(&mut self, run: RunInfo) {
        match self.runs.iter().position(|r| r.id == run.id) {
            Some(i) => self.runs[i] = run,
            None => self.runs.push(run),
        }
    }

    fn upsert_checkpoint(&mut self, c: CheckpointInfo) {
        match self
            .checkpoints
            .iter()
            .position(|o| o.step == c.step && o.phase == c.phase)
        {
            Some(i) => self.checkpoints[i] = c,
            None => self.checkpoints.push(c),
        }
    }

    /// The reply to a request sent for a key (`label` says which).
    pub fn apply_result(&mut self, label: &str, result: Result<Value, ErrorBody>) {
        if let Some(run) = label.strip_prefix(COMPARE_LABEL) {
            return self.apply_compared(run, result);
        }
        match result {
            Err(e) => self.flash(format!("{label}: {}", e.message), Level::Error),
            Ok(v) => {
                if let Ok(list) = serde_json::from_value::<Vec<RunInfo>>(v.clone()) {
                    self.runs = list;
                    self.clamp();
                    return;
                }
                if let Ok(r) = serde_json::from_value::<RunInfo>(v.clone()) {
                    self.flash(
                        format!("{label}: {} is {}", r.id, r.state.name()),
                        Level::Info,
                    );
                    self.upsert_run(r);
                } else if let Ok(c) = serde_json::from_value::<CheckpointInfo>(v) {
                    self.flash(
                        format!("{label}: written at step {} ({})", c.step, c.path),
                        Level::Info,
                    );
                    self.upsert_checkpoint(c);
                } else {
                    self.flash(format!("{label}: done"), Level::Info);
                }
                self.clamp();
            }
        }
    }

    /// The metrics of a compared run (the reply to a compare fetch).
    fn apply_compared(&mut self, run: &str, result: Result<Value, ErrorBody>) {
        if !self.marked.iter().any(|r| r == run) {
            return; // unmarked while the request was out
        }
        let ms = match result.map(serde_json::from_value::<Vec<Value>>) {
            Ok(Ok(ms)) => ms,
            Ok(Err(e)) => {
                return self.flash(
                    format!("compare {run}: bad metrics from jetd: {e}"),
                    Level::Error,
                )
            }
            Err(e) => return self.flash(format!("compare {run}: {}", e.message), Level::Error),
        };
        // Pushes that came while the request was out are in the store's answer too.
        match self.compared.iter_mut().find(|(r, _)| r == run) {
            Some((_, old)) => *old = ms,
            None => self.compared.push((run.to_string(), ms)),
        }
    }

    pub(crate) fn clamp(&mut self) {
        let n = self.visible_runs().len();
        self.runs_sel = self.runs_sel.min(n.saturating_sub(1));
        let n = self.visible_events().len();
        self.events_sel = self.events_sel.min(n.saturating_sub(1));
        let n = self.checkpoints.len();
        self.ckpt_sel = self.ckpt_sel.min(n.saturating_sub(1));
    }
}
