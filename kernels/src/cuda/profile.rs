//! Device time by category, for `jetd bench`'s breakdown of a training step.
//! While a profile is on, every kernel launch and every cuBLASLt matmul of a
//! [`Gpu`] is bracketed by two events on its stream; [`Gpu::profile_stop`] sums
//! the time between each pair per category. A span also holds any idle time
//! between its first event and the kernel's start (a launch that arrives late):
//! host-bound code shows up where it happens. Copies and memsets are not
//! bracketed; what no span covers is the caller's wall time minus the total.

use std::sync::Mutex;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaEvent;

use super::{Ctx, Gpu, Result};

/// Events reused across profiles, and the spans of the running one.
#[derive(Default)]
pub(crate) struct ProfState {
    pool: Vec<CudaEvent>,
    /// (category, index of the start event; the end event follows it).
    spans: Vec<(&'static str, usize)>,
    on: bool,
}

/// Per-category device time of one profile, in milliseconds, largest first.
pub type Profile = Vec<(String, f64)>;

/// The category of a kernel by its source module.
pub(crate) fn category(module: &str) -> &'static str {
    match module {
        "flash" | "attention" => "attention",
        "gemv_fp8" => "gemm",
        "quantize" => "quantize",
        "logsoftmax" => "loss",
        "adamw" => "optimizer",
        "sample" => "sampling",
        _ => "elementwise",
    }
}

impl Gpu {
    fn prof(&self) -> &Mutex<ProfState> {
        &self.prof
    }

    /// Start recording spans (drops those of an unfinished profile).
    pub fn profile_start(&self) {
        let mut p = self.prof().lock().unwrap();
        p.spans.clear();
        p.on = true;
    }

    /// Stop, wait for the stream, and sum the spans per category.
    pub fn profile_stop(&self) -> Result<Profile> {
        let mut p = self.prof().lock().unwrap();
        p.on = false;
        self.stream
            .synchronize()
            .ctx("waiting for the profiled work")?;
        let mut sums: Vec<(String, f64)> = Vec::new();
        for &(cat, i) in &p.spans {
            let ms = p.pool[i]
                .elapsed_ms(&p.pool[i + 1])
                .ctx("reading profile events")? as f64;
            match sums.iter_mut().find(|(c, _)| c == cat) {
                Some(s) => s.1 += ms,
                None => sums.push((cat.to_string(), ms)),
            }
        }
        p.spans.clear();
        sums.sort_by(|a, b| b.1.total_cmp(&a.1));
        Ok(sums)
    }

    /// Run `f` (which queues work on the stream) inside a span of `cat` when a
    /// profile is on.
    pub(crate) fn span<T>(&self, cat: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let start = {
            let mut p = self.prof().lock().unwrap();
            if !p.on {
                drop(p);
                return f();
            }
            let i = p.spans.len() * 2;
            while p.pool.len() < i + 2 {
                let e = self
                    .context()
                    .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .ctx("creating a profile event")?;
                p.pool.push(e);
            }
            p.pool[i]
                .record(&self.stream)
                .ctx("recording a profile event")?;
            p.spans.push((cat, i));
            i
        };
        let out = f();
        let p = self.prof().lock().unwrap();
        p.pool[start + 1]
            .record(&self.stream)
            .ctx("recording a profile event")?;
        out
    }
}
