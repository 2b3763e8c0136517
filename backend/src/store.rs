//! The run store (sled): run registry, per-step metrics, events, the
//! checkpoint catalog and the compiled-kernel cache, under a schema version.
//!
//! Keys: runs `id`; metrics and events `id \0 seq(u64 BE)`; checkpoints
//! `id \0 branch(u64 BE) phase(u8) step(u64 BE)`; values are JSON. Tensors
//! never go in here.

use std::path::{Path, PathBuf};

use jet_proto::{CheckpointInfo, Event, RunState};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::FileHash;
use crate::trainer::Progress;

pub const SCHEMA_VERSION: u64 = 1;
/// `meta` key of the highest run id ever given.
const LAST_RUN_KEY: &str = "last_run_id";
/// sled's page cache, in bytes.
const CACHE_BYTES: u64 = 64 << 20;
/// How long `open` waits for the store's file lock. sled's background
/// threads hold the lock for a moment after the last handle of a closed
/// store drops (a restart in the same process, or a daemon still exiting);
/// a lock still held after this is another live jetd.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    // `cause`, not `source`: the message already holds it, and an error chain
    // would print it twice.
    #[error("store {}: {cause}", .path.display())]
    Sled { path: PathBuf, cause: sled::Error },
    #[error("store {}: schema version {found} but this jetd reads version {SCHEMA_VERSION}", .path.display())]
    Schema { path: PathBuf, found: String },
    #[error("store: corrupt record {key}: {message}")]
    Corrupt { key: String, message: String },
}

/// A run as persisted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: String,
    pub name: String,
    /// The config's TOML text and the folder its relative paths resolve against.
    pub config_toml: String,
    pub config_base: PathBuf,
    pub config_source: String,
    pub flow: Option<String>,
    pub steps: Option<u64>,
    pub seed: Option<u64>,
    pub state: RunState,
    pub created_unix: u64,
    pub progress: Progress,
    /// Incremented by every rollback; metrics carry the branch they belong to.
    pub branch: u64,
    pub metric_seq: u64,
    pub event_seq: u64,
    pub last_alarm: Option<String>,
    pub auto_rollbacks: u32,
    pub message: Option<String>,
    pub last_reward: Option<f64>,
    pub last_heldout: Option<f64>,
    /// Planned steps, for listings.
    pub rl_total: u64,
    pub sft_total: u64,
    pub flow_name: String,
    pub mismatch_kl_alarm: f64,
    /// A checkpoint to restore before computing again (set by a rollback).
    #[serde(default)]
    pub restore: Option<RestorePlan>,
    /// `cpu` or `cuda`: which compute threads may take the run.
    #[serde(default = "cpu")]
    pub device: String,
    /// The GPU it computes on (or last computed on).
    #[serde(default)]
    pub gpu: Option<u32>,
}

fn cpu() -> String {
    "cpu".into()
}

/// Where a run restarts from, and the remedy to apply after restoring.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RestorePlan {
    /// The checkpoint folder (as in the catalog).
    pub path: String,
    /// Batches to skip (added to the data offset).
    pub skip: u64,
    /// Multiplier of the learning rate.
    pub lr_factor: f64,
}

/// Order of a metrics record or checkpoint: SFT steps before RL steps.
pub fn phase_rank(phase: &str) -> u8 {
    if phase == "sft" {
        0
    } else {
        1
    }
}

impl RunRecord {
    pub fn info(&self) -> jet_proto::RunInfo {
        jet_proto::RunInfo {
            id: self.id.clone(),
            name: self.name.clone(),
            state: self.state,
            flow: self.flow_name.clone(),
            step: self.progress.rl_steps_done,
            steps: self.rl_total,
            sft_step: self.progress.sft_steps_done,
            sft_steps: self.sft_total,
            reward_mean: self.last_reward,
            heldout_accuracy: self.last_heldout,
            last_alarm: self.last_alarm.clone(),
            mismatch_kl_alarm: self.mismatch_kl_alarm,
            created_unix: self.created_unix,
            message: self.message.clone(),
            device: self.device.clone(),
            gpu: self.gpu,
        }
    }
}

/// A catalog entry: the protocol's view plus the files and their hashes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub info: CheckpointInfo,
    pub branch: u64,
    pub files: Vec<FileHash>,
}

pub struct Store {
    path: PathBuf,
    db: sled::Db,
    runs: sled::Tree,
    metrics: sled::Tree,
    events: sled::Tree,
    ckpts: sled::Tree,
    meta: sled::Tree,
    kernels: sled::Tree,
}

fn key(id: &str, seq: u64) -> Vec<u8> {
    let mut k = id.as_bytes().to_vec();
    k.push(0);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// sled's open, retried while its file lock is still held (see `LOCK_WAIT`).
fn open_waiting(path: &Path) -> sled::Result<sled::Db> {
    let start = std::time::Instant::now();
    loop {
        let r = sled::Config::new()
            .path(path)
            .cache_capacity(CACHE_BYTES)
            .open();
        match r {
            Err(sled::Error::Io(io)) if io.to_string().contains("could not acquire lock") => {
                if start.elapsed() >= LOCK_WAIT {
                    return Err(sled::Error::Io(std::io::Error::other(format!(
                        "locked by another process for {} s: is another jetd using this data dir?",
                        LOCK_WAIT.as_secs()
                    ))));
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

fn prefix(id: &str) -> Vec<u8> {
    let mut k = id.as_bytes().to_vec();
    k.push(0);
    k
}

impl Store {
    /// Open (or create) the store in `dir`, checking the schema version.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let path = dir.join("store");
        let e = |cause| StoreError::Sled {
            path: path.clone(),
            cause,
        };
        let db = open_waiting(&path).map_err(e)?;
        let tree = |n: &str| {
            db.open_tree(n).map_err(|cause| StoreError::Sled {
                path: path.clone(),
                cause,
            })
        };
        let s = Store {
            runs: tree("runs")?,
            metrics: tree("metrics")?,
            events: tree("events")?,
            ckpts: tree("checkpoints")?,
            meta: tree("meta")?,
            kernels: tree("kernels")?,
            db,
            path: path.clone(),
        };
        match s.meta.get("schema_version").map_err(e)? {
            None => {
                s.meta
                    .insert("schema_version", SCHEMA_VERSION.to_string().as_bytes())
                    .map_err(e)?;
            }
            Some(v) if v.as_ref() == SCHEMA_VERSION.to_string().as_bytes() => {}
            Some(v) => {
                return Err(StoreError::Schema {
                    path,
                    found: String::from_utf8_lossy(&v).into_owned(),
                })
            }
        }
        Ok(s)
    }

    fn err(&self) -> impl Fn(sled::Error) -> StoreError + '_ {
        |cause| StoreError::Sled {
            path: self.path.clone(),
            cause,
        }
    }

    fn decode<T: for<'de> Deserialize<'de>>(k: &[u8], v: &[u8]) -> Result<T, StoreError> {
        serde_json::from_slice(v).map_err(|e| StoreError::Corrupt {
            key: String::from_utf8_lossy(k).into_owned(),
            message: e.to_string(),
        })
    }

    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map_err(self.err())?;
        Ok(())
    }

    /// Enter a new run with its first event, atomically, under the next run
    /// id: one past the highest ever given (r0001, r0002, ...). The high-water
    /// mark lives in `meta` and is written in the same transaction as the run,
    /// so ids stay short and sequential across crashes (sled's own id
    /// generator jumps ahead by a batch after each crash) and a deleted run's
    /// id is never handed out again. Callers serialise submits.
    pub fn create_run(&self, rec: &mut RunRecord, message: String) -> Result<Event, StoreError> {
        use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};
        let mut highest = match self.meta.get(LAST_RUN_KEY).map_err(self.err())? {
            Some(v) => run_number(&String::from_utf8_lossy(&v)).unwrap_or(0),
            None => 0,
        };
        // Stores written before the high-water mark existed: their registry.
        for k in self.runs.iter().keys() {
            let k = k.map_err(self.err())?;
            highest = highest.max(run_number(&String::from_utf8_lossy(&k)).unwrap_or(0));
        }
        rec.id = format!("r{:04}", highest + 1);
        let e = Event {
            seq: rec.event_seq,
            unix_ms: now_ms(),
            level: "info".into(),
            kind: "state".into(),
            message,
            step: None,
        };
        rec.event_seq += 1;
        let run = serde_json::to_vec(&*rec).expect("run serializes");
        let ev = serde_json::to_vec(&e).expect("json");
        (&self.runs, &self.events, &self.meta)
            .transaction(|(runs, events, meta)| {
                runs.insert(rec.id.as_bytes(), run.as_slice())?;
                events.insert(key(&rec.id, e.seq), ev.as_slice())?;
                meta.insert(LAST_RUN_KEY, rec.id.as_bytes())?;
                Ok::<_, ConflictableTransactionError<std::convert::Infallible>>(())
            })
            .map_err(|e| match e {
                TransactionError::Storage(e) => self.err()(e),
                TransactionError::Abort(never) => match never {},
            })?;
        Ok(e)
    }

    pub fn put_run(&self, r: &RunRecord) -> Result<(), StoreError> {
        self.runs
            .insert(
                r.id.as_bytes(),
                serde_json::to_vec(r).expect("run serializes"),
            )
            .map_err(self.err())?;
        Ok(())
    }

    pub fn run(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        match self.runs.get(id).map_err(self.err())? {
            Some(v) => Ok(Some(Self::decode(id.as_bytes(), &v)?)),
            None => Ok(None),
        }
    }

    pub fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.runs
            .iter()
            .map(|kv| {
                kv.map_err(self.err())
                    .and_then(|(k, v)| Self::decode(&k, &v))
            })
            .collect()
    }

    /// Append one step's metrics (the record's `metric_seq` advances).
    pub fn append_metrics(&self, r: &mut RunRecord, mut m: Value) -> Result<Value, StoreError> {
        if let Some(o) = m.as_object_mut() {
            o.insert("branch".into(), r.branch.into());
            o.insert("abandoned".into(), false.into());
        }
        self.metrics
            .insert(
                key(&r.id, r.metric_seq),
                serde_json::to_vec(&m).expect("json"),
            )
            .map_err(self.err())?;
        r.metric_seq += 1;
        Ok(m)
    }

    /// Every metrics record of a run in order (abandoned branches included, marked).
    pub fn metrics(&self, id: &str) -> Result<Vec<Value>, StoreError> {
        self.metrics
            .scan_prefix(prefix(id))
            .map(|kv| {
                kv.map_err(self.err())
                    .and_then(|(k, v)| Self::decode(&k, &v))
            })
            .collect()
    }

    /// The newest live (not abandoned) metrics records, newest first, at most
    /// `limit`: a reverse scan, so a scrape of a long run does not read its
    /// whole history.
    pub fn newest_live(&self, id: &str, limit: usize) -> Result<Vec<Value>, StoreError> {
        let mut out = Vec::new();
        for kv in self.metrics.scan_prefix(prefix(id)).rev() {
            if out.len() >= limit {
                break;
            }
            let (k, v) = kv.map_err(self.err())?;
            let m: Value = Self::decode(&k, &v)?;
            if m["abandoned"] != true {
                out.push(m);
            }
        }
        Ok(out)
    }

    /// Mark the live records at or after (`phase`, `step`) as abandoned: what a
    /// run restored from the checkpoint taken there will compute again.
    pub fn abandon_after(&self, id: &str, phase: &str, step: u64) -> Result<usize, StoreError> {
        let cut = (phase_rank(phase), step);
        let mut n = 0;
        for kv in self.metrics.scan_prefix(prefix(id)) {
            let (k, v) = kv.map_err(self.err())?;
            let mut m: Value = Self::decode(&k, &v)?;
            if m["abandoned"] == true {
                continue;
            }
            let at = (
                phase_rank(m["phase"].as_str().unwrap_or("rl")),
                m["step"].as_u64().unwrap_or(0),
            );
            if at >= cut {
                m["abandoned"] = true.into();
                self.metrics
                    .insert(k, serde_json::to_vec(&m).expect("json"))
                    .map_err(self.err())?;
                n += 1;
            }
        }
        Ok(n)
    }

    pub fn append_event(
        &self,
        r: &mut RunRecord,
        level: &str,
        kind: &str,
        message: String,
        step: Option<u64>,
    ) -> Result<Event, StoreError> {
        let e = Event {
            seq: r.event_seq,
            unix_ms: now_ms(),
            level: level.into(),
            kind: kind.into(),
            message,
            step,
        };
        self.events
            .insert(
                key(&r.id, r.event_seq),
                serde_json::to_vec(&e).expect("json"),
            )
            .map_err(self.err())?;
        r.event_seq += 1;
        if level == "alarm" {
            r.last_alarm = Some(e.message.clone());
        }
        Ok(e)
    }

    pub fn events(&self, id: &str, from: u64) -> Result<Vec<Event>, StoreError> {
        self.events
            .range(key(id, from)..key(id, u64::MAX))
            .map(|kv| {
                kv.map_err(self.err())
                    .and_then(|(k, v)| Self::decode(&k, &v))
            })
            .collect()
    }

    fn ckpt_key(id: &str, c: &CheckpointRecord) -> Vec<u8> {
        let mut k = prefix(id);
        k.extend_from_slice(&c.branch.to_be_bytes());
        k.push(if c.info.phase == "sft" { 0 } else { 1 });
        k.extend_from_slice(&c.info.step.to_be_bytes());
        k
    }

    pub fn put_checkpoint(&self, id: &str, c: &CheckpointRecord) -> Result<(), StoreError> {
        self.ckpts
            .insert(Self::ckpt_key(id, c), serde_json::to_vec(c).expect("json"))
            .map_err(self.err())?;
        Ok(())
    }

    pub fn remove_checkpoint(&self, id: &str, c: &CheckpointRecord) -> Result<(), StoreError> {
        self.ckpts
            .remove(Self::ckpt_key(id, c))
            .map_err(self.err())?;
        Ok(())
    }

    /// The catalog of a run, oldest first.
    pub fn checkpoints(&self, id: &str) -> Result<Vec<CheckpointRecord>, StoreError> {
        self.ckpts
            .scan_prefix(prefix(id))
            .map(|kv| {
                kv.map_err(self.err())
                    .and_then(|(k, v)| Self::decode(&k, &v))
            })
            .collect()
    }

    /// Remove a run and everything stored about it.
    pub fn delete_run(&self, id: &str) -> Result<(), StoreError> {
        for tree in [&self.metrics, &self.events, &self.ckpts] {
            for k in tree.scan_prefix(prefix(id)).keys() {
                tree.remove(k.map_err(self.err())?).map_err(self.err())?;
            }
        }
        self.runs.remove(id).map_err(self.err())?;
        Ok(())
    }

    /// The compiled-kernel cache (NVRTC output by key), as a handle the GPU keeps.
    pub fn kernel_store(&self) -> SledKernelStore {
        SledKernelStore(self.kernels.clone())
    }
}

/// The compiled-kernel cache in sled: a restarted daemon loads what it compiled
/// before. Keys come from `jet_kernels::cuda` (sha256 of source, architecture,
/// NVRTC version and options); values are CUBIN images.
#[derive(Clone)]
pub struct SledKernelStore(sled::Tree);

impl jet_kernels::cuda::KernelStore for SledKernelStore {
    fn load(&self, key: &str) -> Option<Vec<u8>> {
        self.0.get(key).ok().flatten().map(|v| v.to_vec())
    }
    fn save(&self, key: &str, image: &[u8]) {
        // Flushed at once (a handful of modules, once per GPU architecture), so a
        // crash soon after cannot lose them. A failed write only costs a compile.
        if self.0.insert(key, image).is_ok() {
            let _ = self.0.flush();
        }
    }
}

/// The number of a run id `rNNNN` (None for other keys).
fn run_number(id: &str) -> Option<u64> {
    id.strip_prefix('r')?.parse().ok()
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str) -> RunRecord {
        RunRecord {
            id: id.into(),
            name: "t".into(),
            config_toml: String::new(),
            config_base: PathBuf::new(),
            config_source: "x".into(),
            flow: None,
            steps: None,
            seed: None,
            state: RunState::Queued,
            created_unix: 0,
            progress: Progress::default(),
            branch: 0,
            metric_seq: 0,
            event_seq: 0,
            last_alarm: None,
            auto_rollbacks: 0,
            message: None,
            last_reward: None,
            last_heldout: None,
            rl_total: 10,
            sft_total: 0,
            flow_name: "fp8".into(),
            mismatch_kl_alarm: 0.01,
            restore: None,
            device: "cpu".into(),
            gpu: None,
        }
    }

    #[test]
    fn runs_metrics_events_and_abandoned_branches() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let mut r = rec("r0001");
        for step in 0..5u64 {
            s.append_metrics(&mut r, serde_json::json!({"phase": "rl", "step": step}))
                .unwrap();
        }
        s.append_event(&mut r, "alarm", "alarm.nan", "boom".into(), Some(3))
            .unwrap();
        s.put_run(&r).unwrap();
        assert_eq!(s.abandon_after("r0001", "rl", 3).unwrap(), 2);
        r.branch += 1;
        s.append_metrics(&mut r, serde_json::json!({"phase": "rl", "step": 3}))
            .unwrap();
        let m = s.metrics("r0001").unwrap();
        assert_eq!(m.len(), 6);
        assert_eq!(m.iter().filter(|x| x["abandoned"] == true).count(), 2);
        assert_eq!(m[5]["branch"], 1);
        // Newest live first: the new branch's step 3, then 2, 1; abandoned ones skipped.
        let newest = s.newest_live("r0001", 3).unwrap();
        let steps: Vec<(u64, u64)> = newest
            .iter()
            .map(|x| (x["step"].as_u64().unwrap(), x["branch"].as_u64().unwrap()))
            .collect();
        assert_eq!(steps, [(3, 1), (2, 0), (1, 0)]);
        assert_eq!(s.events("r0001", 0).unwrap()[0].kind, "alarm.nan");
        drop(s);
        // Reopen: everything is still there; a wrong schema version is refused.
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(
            s.run("r0001").unwrap().unwrap().last_alarm.as_deref(),
            Some("boom")
        );
        s.meta.insert("schema_version", b"99".as_slice()).unwrap();
        s.flush().unwrap();
        drop(s);
        let e = Store::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains("schema version 99"), "{e}");
    }

    #[test]
    fn open_waits_for_a_lock_being_released() {
        // A store closing in another thread while this one opens it: the
        // open waits for the lock instead of failing (CI saw the race).
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let closer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(s);
        });
        let s = Store::open(dir.path()).unwrap();
        closer.join().unwrap();
        assert_eq!(
            s.meta.get("schema_version").unwrap().as_deref(),
            Some(b"1".as_slice())
        );
    }

    #[test]
    fn a_store_held_open_is_refused_with_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let _held = Store::open(dir.path()).unwrap();
        let e = Store::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains("store ") && e.contains("another jetd"), "{e}");
    }

    #[test]
    fn kernel_images_survive_a_reopen() {
        use jet_kernels::cuda::KernelStore;
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let k = s.kernel_store();
        assert_eq!(k.load("abc"), None);
        k.save("abc", b"\x7fELF image");
        drop((k, s));
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(
            s.kernel_store().load("abc").as_deref(),
            Some(&b"\x7fELF image"[..])
        );
    }

    #[test]
    fn delete_removes_everything_of_one_run_only() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let (mut a, mut b) = (rec("r0001"), rec("r0002"));
        // "r0001" must not match "r00010" by prefix: keys end the id with \0.
        let mut c = rec("r00010");
        for r in [&mut a, &mut b, &mut c] {
            s.append_metrics(r, serde_json::json!({"phase": "rl", "step": 0}))
                .unwrap();
            s.put_run(r).unwrap();
        }
        s.delete_run("r0001").unwrap();
        assert!(s.run("r0001").unwrap().is_none());
        assert!(s.metrics("r0001").unwrap().is_empty());
        assert_eq!(s.metrics("r0002").unwrap().len(), 1);
        assert_eq!(s.metrics("r00010").unwrap().len(), 1);
    }

    #[test]
    fn run_ids_are_sequential_and_never_reused() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let mut ids = vec![];
        for _ in 0..3 {
            let mut r = rec("");
            let e = s.create_run(&mut r, "queued".into()).unwrap();
            assert_eq!((e.seq, r.event_seq), (0, 1));
            assert_eq!(s.events(&r.id, 0).unwrap(), [e]);
            ids.push(r.id);
        }
        assert_eq!(ids, ["r0001", "r0002", "r0003"]);
        s.delete_run("r0003").unwrap();
        s.flush().unwrap();
        drop(s);
        let s = Store::open(dir.path()).unwrap();
        let mut r = rec("");
        s.create_run(&mut r, "queued".into()).unwrap();
        assert_eq!(r.id, "r0004", "a deleted run's id is not handed out again");
        // A store from before the high-water mark: the registry's highest id.
        s.meta.remove(LAST_RUN_KEY).unwrap();
        s.put_run(&rec("r2000001")).unwrap();
        let mut r = rec("");
        s.create_run(&mut r, "queued".into()).unwrap();
        assert_eq!(r.id, "r2000002");
    }
}
