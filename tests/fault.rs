//! kill -9 at random moments of a run against a real `jetd serve`: during the
//! SFT warm-up, in rollout, in training, while a checkpoint is written, and
//! within 100 ms after an acknowledged command. After each kill, with the
//! daemon down, the store itself is read: every acknowledged command's effect
//! and event are there, and the catalog holds only whole checkpoints whose
//! hashes match. After each restart: the daemon starts, no temporary folder is
//! left, the effects show through the protocol. At the end the finished run's
//! metrics equal an uninterrupted `jetd run`, bit for bit.
//!
//!     cargo test -p jet-backend --test fault -- --nocapture          # 40 kills
//!     JET_FAULT_KILLS=200 cargo test -p jet-backend --test fault -- --nocapture
//!     JET_FAULT_SEED=N ...                                           # replay a schedule

mod reliability;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use jet_backend::checkpoint;
use jet_backend::store::Store;
use jet_proto::RunState;
use reliability::{config, live, reference_metrics, temp_dirs, Client, Daemon, Rng};
use serde_json::{json, Value};

const SFT: u64 = 12;
const RL: u64 = 24;
const EVERY: u64 = 2;

/// Where a kill lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Moment {
    Sft,
    Rollout,
    Train,
    CheckpointWrite,
    AfterSubmit,
    AfterPause,
    AfterResume,
    AfterStop,
    AfterCheckpoint,
    AfterRollbackPaused,
    AfterRollbackRunning,
}

/// What an acknowledged command promised.
#[derive(Debug)]
enum Promise {
    /// The run exists (submit).
    Exists,
    /// Paused or stopped at exactly this position, with its state event.
    Halted {
        state: RunState,
        sft_step: u64,
        step: u64,
    },
    /// Resumed: not paused or stopped any more.
    Resumed,
    /// Rolled back to `step`: a rollback event for it after `after_seq`.
    RolledBack {
        step: u64,
        after_seq: u64,
        paused: bool,
    },
    /// This checkpoint is catalogued.
    Checkpoint { path: String },
}

struct Harness {
    /// Holds the data dir until the end.
    _tmp: tempfile::TempDir,
    data: PathBuf,
    d: Option<Daemon>,
    c: Client,
    run: String,
    rng: Rng,
    pushes: Receiver<Value>,
    kills: Vec<Moment>,
    /// Kills that left a temporary checkpoint folder behind (caught mid-write).
    mid_write: usize,
    acked: usize,
    kept: usize,
}

/// A second connection subscribed to the run; metrics pushes come out of the
/// channel as they arrive (the thread ends when the daemon dies).
fn subscribe(d: &Daemon, run: &str) -> Receiver<Value> {
    let s = UnixStream::connect(d.socket()).unwrap();
    let mut wr = s.try_clone().unwrap();
    let mut rd = BufReader::new(s);
    let mut hello = String::new();
    rd.read_line(&mut hello).unwrap();
    wr.write_all(format!("{}\n", json!({"id": 1, "op": "subscribe", "run": run})).as_bytes())
        .unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut l = String::new();
        while rd.read_line(&mut l).is_ok_and(|n| n > 0) {
            if let Ok(v) = serde_json::from_str::<Value>(&l) {
                if v["push"] == "metrics" && tx.send(v["metrics"].clone()).is_err() {
                    return;
                }
            }
            l.clear();
        }
    });
    rx
}

impl Harness {
    fn d(&self) -> &Daemon {
        self.d.as_ref().unwrap()
    }

    /// The next metrics push (of either phase) satisfying `f`; older ones are skipped.
    fn next_push(&mut self, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        while self.pushes.try_recv().is_ok() {}
        let t0 = Instant::now();
        loop {
            let left = Duration::from_secs(120).saturating_sub(t0.elapsed());
            let m = self.pushes.recv_timeout(left).unwrap_or_else(|e| {
                panic!("no push for {what}: {e}; jetd log:\n{}", self.d().log())
            });
            if f(&m) {
                return m;
            }
        }
    }

    fn sleep_ms(&mut self, ms: f64) {
        std::thread::sleep(Duration::from_secs_f64(ms.max(0.0) / 1e3));
    }

    /// Within 100 ms after the acknowledgement.
    fn soon(&mut self) {
        let ms = self.rng.unit() * 100.0;
        self.sleep_ms(ms);
    }

    fn status(&mut self) -> Value {
        let run = self.run.clone();
        self.c.status(&run)
    }

    fn ack(&mut self, op: &str, extra: Value) -> Value {
        let mut r = json!({"op": op, "run": self.run});
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        self.acked += 1;
        self.c.ok(r)
    }

    fn last_event_seq(&mut self) -> u64 {
        let ev = self.c.ok(json!({"op": "events", "run": self.run}));
        ev.as_array()
            .unwrap()
            .last()
            .map_or(0, |e| e["seq"].as_u64().unwrap())
    }

    /// A random RL checkpoint at or before `at` (steps the daemon will accept).
    fn rollback_step(&mut self, at: u64) -> u64 {
        let cks = self.c.ok(json!({"op": "checkpoints", "run": self.run}));
        let steps: Vec<u64> = cks
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["phase"] == "rl" && c["health"] == "ok")
            .map(|c| c["step"].as_u64().unwrap())
            .filter(|&s| s <= at)
            .collect();
        assert!(
            !steps.is_empty(),
            "no RL checkpoint at or before {at}: {cks}"
        );
        self.rng.pick(&steps)
    }

    /// kill -9; with the daemon down, read the store; restart; check again.
    fn kill(&mut self, m: Moment, promise: Option<Promise>) {
        self.d.take().unwrap().kill9();
        self.kills.push(m);
        if !temp_dirs(&self.data).is_empty() {
            self.mid_write += 1;
        }
        self.check_store(&promise);
        let d = Daemon::start(&self.data);
        let left = temp_dirs(&self.data);
        assert!(
            left.is_empty(),
            "temporary folders survived a restart: {left:?}"
        );
        self.c = Client::connect(&d);
        self.pushes = subscribe(&d, &self.run);
        self.d = Some(d);
        if let Some(p) = promise {
            self.check_live(&p);
            self.kept += 1;
        }
    }

    /// The store as the killed daemon left it.
    fn check_store(&mut self, promise: &Option<Promise>) {
        let store = Store::open(&self.data).expect("the store opens after kill -9");
        for r in store.runs().unwrap() {
            for c in store.checkpoints(&r.id).unwrap() {
                assert!(
                    !c.info.path.contains("/.tmp-"),
                    "a temporary folder is catalogued: {}",
                    c.info.path
                );
                assert_eq!(c.info.health, "ok", "{}", c.info.path);
                checkpoint::verify(Path::new(&c.info.path), &c.files)
                    .unwrap_or_else(|e| panic!("catalogued checkpoint is not whole: {e}"));
            }
        }
        let Some(p) = promise else { return };
        let rec = store.run(&self.run).unwrap();
        let Some(rec) = rec else {
            panic!("acknowledged run {} is not in the store", self.run)
        };
        let events = store.events(&self.run, 0).unwrap();
        let ctx = || {
            format!(
                "after kill -9: promise {p:?}; the store has state {:?}, progress {:?}, \
                 branch {}, restore {:?}",
                rec.state, rec.progress, rec.branch, rec.restore
            )
        };
        match p {
            Promise::Exists => assert!(!events.is_empty(), "{}", ctx()),
            Promise::Halted {
                state,
                sft_step,
                step,
            } => {
                assert_eq!(rec.state, *state, "{}", ctx());
                assert_eq!(
                    (rec.progress.sft_steps_done, rec.progress.rl_steps_done),
                    (*sft_step, *step),
                    "{}",
                    ctx()
                );
                let last_state = events.iter().rev().find(|e| e.kind == "state").unwrap();
                assert!(
                    last_state.message.starts_with(state.name()),
                    "{last_state:?}: {}",
                    ctx()
                );
            }
            Promise::Resumed => assert!(
                !matches!(rec.state, RunState::Paused | RunState::Stopped),
                "{}",
                ctx()
            ),
            Promise::RolledBack {
                step,
                after_seq,
                paused,
            } => {
                assert!(
                    events.iter().any(|e| e.kind == "rollback"
                        && e.step == Some(*step)
                        && e.seq > *after_seq),
                    "the rollback's event: {}",
                    ctx()
                );
                if *paused {
                    assert_eq!(rec.state, RunState::Paused, "{}", ctx());
                    assert_eq!(rec.progress.rl_steps_done, *step, "{}", ctx());
                }
            }
            Promise::Checkpoint { path } => {
                let cat = store.checkpoints(&self.run).unwrap();
                assert!(cat.iter().any(|c| &c.info.path == path), "{}", ctx());
                assert!(events.iter().any(|e| e.kind == "checkpoint"), "{}", ctx());
            }
        }
    }

    /// The same promise, through the restarted daemon.
    fn check_live(&mut self, p: &Promise) {
        let s = self.status();
        match p {
            Promise::Exists
            | Promise::Checkpoint { .. }
            | Promise::RolledBack { paused: false, .. } => {}
            Promise::Halted {
                state,
                sft_step,
                step,
            } => {
                assert_eq!(s["state"], state.name(), "{s}");
                assert_eq!(
                    (s["sft_step"].as_u64(), s["step"].as_u64()),
                    (Some(*sft_step), Some(*step)),
                    "{s}"
                );
            }
            Promise::Resumed => assert!(s["state"] != "paused" && s["state"] != "stopped", "{s}"),
            Promise::RolledBack {
                step, paused: true, ..
            } => {
                assert_eq!(
                    (s["state"].as_str(), s["step"].as_u64()),
                    (Some("paused"), Some(*step)),
                    "{s}"
                );
            }
        }
    }

    fn ensure_running(&mut self) {
        let s = self.status();
        if s["state"] == "paused" || s["state"] == "stopped" {
            self.ack("resume", json!({}));
        }
        // Keep clear of the end: roll back to an early checkpoint (acknowledged,
        // not killed) so the run never finishes before the kills are done.
        let s = self.status();
        if s["step"].as_u64().unwrap() + 4 >= RL || s["state"] == "finished" {
            let at = s["step"].as_u64().unwrap();
            let to = self.rollback_step(at.min(RL / 2));
            let r = self.ack("rollback", json!({"step": to}));
            assert_eq!(r["step"], to, "{r}");
        }
    }

    /// An RL step begins: wait for the previous one's metrics (which also
    /// carry how long its rollout and training took).
    fn rl_boundary(&mut self) -> Value {
        self.ensure_running();
        self.next_push("an RL step", |m| m["phase"] == "rl")
    }

    fn act(&mut self, m: Moment) {
        match m {
            Moment::Sft => {
                let at = 1 + self.rng.below(SFT - 3);
                let p = self.next_push("an SFT step", |p| {
                    p["phase"] == "sft" && p["step"].as_u64() >= Some(at)
                });
                let ms = self.rng.unit() * p["step_s"].as_f64().unwrap() * 1e3;
                self.sleep_ms(ms);
                self.kill(m, None);
            }
            Moment::Rollout | Moment::Train => {
                let p = self.rl_boundary();
                let (ro, tr) = (
                    p["rollout_s"].as_f64().unwrap(),
                    p["train_s"].as_f64().unwrap(),
                );
                let u = 0.1 + 0.8 * self.rng.unit();
                let s = if m == Moment::Rollout {
                    u * ro
                } else {
                    ro + u * tr
                };
                self.sleep_ms(s * 1e3);
                self.kill(m, None);
            }
            Moment::CheckpointWrite => {
                self.ensure_running();
                // The push of the step after which a checkpoint is written.
                self.next_push("a checkpoint step", |p| {
                    p["phase"] == "rl" && (p["step"].as_u64().unwrap() + 1) % EVERY == 0
                });
                let ms = self.rng.unit() * 12.0;
                self.sleep_ms(ms);
                self.kill(m, None);
            }
            Moment::AfterSubmit => unreachable!("submitted by main"),
            Moment::AfterPause => {
                let s = self.status();
                let sft = s["sft_step"].as_u64().unwrap();
                if sft < SFT {
                    // In the warm-up: a few SFT steps in.
                    let at = (sft + 1 + self.rng.below(3)).min(SFT - 2);
                    self.next_push("an SFT step", |p| {
                        p["phase"] == "sft" && p["step"].as_u64() >= Some(at)
                    });
                }
                let r = self.ack("pause", json!({}));
                assert_eq!(r["state"], "paused", "{r}");
                let p = Promise::Halted {
                    state: RunState::Paused,
                    sft_step: r["sft_step"].as_u64().unwrap(),
                    step: r["step"].as_u64().unwrap(),
                };
                self.soon();
                self.kill(m, Some(p));
            }
            Moment::AfterStop => {
                self.ensure_running();
                let r = self.ack("stop", json!({}));
                assert_eq!(r["state"], "stopped", "{r}");
                let p = Promise::Halted {
                    state: RunState::Stopped,
                    sft_step: r["sft_step"].as_u64().unwrap(),
                    step: r["step"].as_u64().unwrap(),
                };
                self.soon();
                self.kill(m, Some(p));
            }
            Moment::AfterResume => {
                let r = self.ack("resume", json!({}));
                assert_eq!(r["state"], "queued", "{r}");
                self.soon();
                self.kill(m, Some(Promise::Resumed));
            }
            Moment::AfterCheckpoint => {
                self.rl_boundary();
                let r = self.c.req(json!({"op": "checkpoint", "run": self.run}));
                if r["ok"] != true {
                    // Raced with the end of the run's turn: not acknowledged, nothing promised.
                    assert_eq!(r["error"]["code"], "bad_state", "{r}");
                    return self.act(Moment::Rollout);
                }
                self.acked += 1;
                let path = r["result"]["path"].as_str().unwrap().to_string();
                self.soon();
                self.kill(m, Some(Promise::Checkpoint { path }));
            }
            Moment::AfterRollbackPaused | Moment::AfterRollbackRunning => {
                let paused = m == Moment::AfterRollbackPaused;
                if paused {
                    let s = self.status();
                    assert_eq!(s["state"], "paused", "{s}");
                } else {
                    self.rl_boundary();
                }
                let at = self.status()["step"].as_u64().unwrap();
                let step = self.rollback_step(at);
                let after_seq = self.last_event_seq();
                let r = self.ack("rollback", json!({"step": step}));
                assert_eq!(
                    r["step"], step,
                    "status shows the restored step at once: {r}"
                );
                assert_eq!(r["state"] == "paused", paused, "{r}");
                self.soon();
                self.kill(
                    m,
                    Some(Promise::RolledBack {
                        step,
                        after_seq,
                        paused,
                    }),
                );
            }
        }
    }
}

#[test]
fn kill9_at_random_moments_loses_no_acknowledged_command() {
    let kills: usize = std::env::var("JET_FAULT_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let seed: u64 = std::env::var("JET_FAULT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(jet_backend::store::now_ms);
    eprintln!("fault: seed {seed} (JET_FAULT_SEED={seed} replays the schedule), {kills} kills");
    let t0 = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // Short SFT steps: a kill during the warm-up redoes it from the start.
    let cfg = config(SFT, RL, EVERY).replace("batch = 64", "batch = 16");
    let reference = reference_metrics(&cfg, tmp.path());

    let d = Daemon::start(&data);
    let mut c = Client::connect(&d);
    let run = c.submit(&cfg);
    let pushes = subscribe(&d, &run);
    let mut h = Harness {
        data,
        d: Some(d),
        c,
        run,
        rng: Rng(seed),
        pushes,
        kills: vec![],
        mid_write: 0,
        acked: 1,
        kept: 0,
        _tmp: tmp,
    };
    h.soon();
    h.kill(Moment::AfterSubmit, Some(Promise::Exists));
    // The warm-up: kills mid-SFT, a pause in it, a resume.
    for _ in 0..(kills / 20).max(3) {
        h.act(Moment::Sft);
    }
    h.act(Moment::AfterPause);
    h.act(Moment::AfterResume);
    // The RL loop, over and over until enough kills.
    let cycle = [
        Moment::Rollout,
        Moment::Train,
        Moment::CheckpointWrite,
        Moment::AfterPause,
        Moment::AfterRollbackPaused,
        Moment::AfterResume,
        Moment::AfterCheckpoint,
        Moment::AfterStop,
        Moment::AfterResume,
        Moment::AfterRollbackRunning,
    ];
    let mut i = 0;
    while h.kills.len() < kills {
        if cycle[i % cycle.len()] == Moment::AfterPause {
            h.ensure_running();
        }
        h.act(cycle[i % cycle.len()]);
        i += 1;
    }

    // Let it finish: its live metrics are those of an uninterrupted run.
    let run = h.run.clone();
    let s = h.status();
    if s["state"] == "paused" || s["state"] == "stopped" {
        h.ack("resume", json!({}));
    }
    h.c.wait_for(&run, "finished", |s| s["state"] == "finished");
    let m = h.c.ok(json!({"op": "metrics", "run": run}));
    let got = live(&m);
    assert_eq!(
        got.len(),
        reference.len(),
        "live records: {} vs {}",
        got.len(),
        reference.len()
    );
    for (i, (a, b)) in got.iter().zip(&reference).enumerate() {
        assert_eq!(a, b, "record {i} differs from the uninterrupted run");
    }
    h.d.take().unwrap().kill9();
    h.check_store(&None);

    let mut by: std::collections::BTreeMap<String, usize> = Default::default();
    for k in &h.kills {
        *by.entry(format!("{k:?}")).or_default() += 1;
    }
    eprintln!(
        "fault: {} kills survived ({by:?}; {} caught a checkpoint mid-write), \
         {} commands acknowledged, {} of them checked right after a kill, 0 lost; \
         {} metrics records equal the uninterrupted run; {:.1} s; seed {seed}",
        h.kills.len(),
        h.mid_write,
        h.acked,
        h.kept,
        reference.len(),
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(
        h.kept,
        h.kills
            .iter()
            .filter(|k| **k >= Moment::AfterSubmit)
            .count()
    );
}
