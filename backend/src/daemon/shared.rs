//! State shared by the I/O side (tokio) and the compute thread.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Condvar, Mutex};

use jet_proto::{GpuSample, Push};
use tokio::sync::{broadcast, oneshot};

use super::devices::Devices;
use crate::store::Store;

/// Capacity of the push channel: a subscriber further behind than this gets
/// a resync instead of blocking anyone.
pub const PUSH_CAPACITY: usize = 1024;

/// The answer to a request: a result, or an error code and message.
pub type Reply = Result<serde_json::Value, (String, String)>;
/// Where the compute thread sends a command's answer, once its effect and
/// event are durable in the store.
pub type Ack = oneshot::Sender<Reply>;

/// A command for the run that is computing, applied at the next step boundary.
pub enum Control {
    Pause(Ack),
    Stop(Ack),
    Checkpoint(Ack),
    Rollback(u64, Ack),
}

impl Control {
    pub fn name(&self) -> &'static str {
        match self {
            Control::Pause(_) => "pause",
            Control::Stop(_) => "stop",
            Control::Checkpoint(_) => "checkpoint",
            Control::Rollback(..) => "rollback",
        }
    }

    pub fn into_ack(self) -> Ack {
        match self {
            Control::Pause(a)
            | Control::Stop(a)
            | Control::Checkpoint(a)
            | Control::Rollback(_, a) => a,
        }
    }
}

/// A compute thread: the CPU one, or the one of a GPU (CUDA device number).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    Cpu,
    Gpu(u32),
}

impl Slot {
    /// Whether this thread computes runs of `device` (the record's `run.device`).
    pub fn takes(self, device: &str) -> bool {
        match self {
            Slot::Cpu => device != "cuda",
            Slot::Gpu(_) => device == "cuda",
        }
    }
}

pub struct Shared {
    pub data_dir: PathBuf,
    pub store: Store,
    /// The GPUs served.
    pub devices: Devices,
    /// Pending commands per run id.
    pub controls: Mutex<HashMap<String, VecDeque<Control>>>,
    /// The runs computing now and where (at most one per slot).
    pub active: Mutex<HashMap<String, Slot>>,
    /// Wakes the compute thread (new run, resume, shutdown).
    pub wake: Condvar,
    pub wake_lock: Mutex<()>,
    pub shutdown: AtomicBool,
    pub pushes: broadcast::Sender<Push>,
    /// Latest GPU sample; None when the machine has no NVIDIA GPU.
    pub gpus: Mutex<Option<Vec<GpuSample>>>,
    /// Serialises run-record read-modify-write between handlers and the
    /// worker, and makes "is it computing? then queue a command" atomic with
    /// the worker claiming and releasing a run (see `worker::release`).
    pub records: Mutex<()>,
}

impl Shared {
    pub fn new(data_dir: PathBuf, store: Store, devices: Devices) -> Shared {
        let (pushes, _) = broadcast::channel(PUSH_CAPACITY);
        Shared {
            data_dir,
            store,
            devices,
            controls: Mutex::new(HashMap::new()),
            active: Mutex::new(HashMap::new()),
            wake: Condvar::new(),
            wake_lock: Mutex::new(()),
            shutdown: AtomicBool::new(false),
            pushes,
            gpus: Mutex::new(None),
            records: Mutex::new(()),
        }
    }

    pub fn notify(&self) {
        let _g = self.wake_lock.lock().unwrap();
        self.wake.notify_all();
    }

    /// Send a push to every subscriber; never blocks (no subscriber is fine).
    pub fn push(&self, p: Push) {
        let _ = self.pushes.send(p);
    }

    pub fn control(&self, run: &str, c: Control) {
        self.controls
            .lock()
            .unwrap()
            .entry(run.to_string())
            .or_default()
            .push_back(c);
        self.notify();
    }

    pub fn take_controls(&self, run: &str) -> Vec<Control> {
        self.controls
            .lock()
            .unwrap()
            .get_mut(run)
            .map(|q| q.drain(..).collect())
            .unwrap_or_default()
    }

    pub fn is_active(&self, run: &str) -> bool {
        self.active.lock().unwrap().contains_key(run)
    }

    /// The run computing on `slot`, if any.
    pub fn run_on(&self, slot: Slot) -> Option<String> {
        self.active
            .lock()
            .unwrap()
            .iter()
            .find(|(_, s)| **s == slot)
            .map(|(r, _)| r.clone())
    }

    pub fn run_dir(&self, run: &str) -> PathBuf {
        self.data_dir.join("runs").join(run)
    }
}
