//! Device time by category, for `jetd bench`'s breakdown of a training step.
//! While a profile is on, every kernel launch and every cuBLASLt matmul of a
//! [`Gpu`] is bracketed by two events on its stream; [`Gpu::profile_stop`] sums
//! the time between each pair per category. A span also holds any idle time
//! between its first event and the kernel's start (a launch that arrives late):
//! host-bound code shows up where it happens. Copies and memsets are not
//! bracketed; what no span covers is the caller's wall time minus the total.
//! That uncovered time is also attributed: the gap between one span's end event
//! and the next one's start is time the stream had nothing queued (the host was
//! late: syncs, host work, launch cost), summed per the kernel that came after it
//! ([`Gpu::profile_idle`]), and the gap between the profile's start and its first
//! span under [`BEFORE_FIRST`].

use std::sync::Mutex;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaEvent;

use super::{Ctx, Gpu, Result};

/// Events reused across profiles, and the spans of the running one.
#[derive(Default)]
pub(crate) struct ProfState {
    pool: Vec<CudaEvent>,
    /// (category, kernel, index of the start event; the end event follows it).
    spans: Vec<(&'static str, &'static str, usize)>,
    /// Recorded when the profile starts: the stream's idle time before the first
    /// span (the host's work before its first launch) is measured from it.
    start: Option<CudaEvent>,
    on: bool,
    /// Per-kernel sums of the last profile.
    kernels: Vec<(String, f64, usize)>,
    /// Per-kernel sums of the idle gaps before its launches in the last profile.
    idle: Vec<(String, f64, usize)>,
    /// A graph capture is on: launches are counted, not bracketed (events
    /// cannot be timed inside a graph).
    capturing: bool,
    captured: usize,
}

/// Gaps between spans shorter than this are the events' own resolution (about half
/// a microsecond) and back-to-back launches, not a stream waiting for the host.
const IDLE_MIN_MS: f64 = 0.002;

/// The name [`Gpu::profile_idle`] gives the stream's idle time between the start
/// of the profile and its first launch.
pub const BEFORE_FIRST: &str = "(before the first launch)";

/// Add `ms` to `name`'s (sum, count) in `v`.
fn add_to(v: &mut Vec<(String, f64, usize)>, name: &str, ms: f64) {
    match v.iter_mut().find(|(k, _, _)| k == name) {
        Some(k) => {
            k.1 += ms;
            k.2 += 1;
        }
        None => v.push((name.to_string(), ms, 1)),
    }
}

/// Per-category device time of one profile, in milliseconds, largest first.
pub type Profile = Vec<(String, f64)>;

/// The category of a kernel by its source module (and, in the log-softmax module, by
/// name: the plain draw's two kernels live there but are sampling).
pub(crate) fn category(module: &str, kernel: &str) -> &'static str {
    match module {
        "flash" | "flash_wg" | "attention" => "attention",
        "gemv_fp8" | "gemm_rows" | "gemm_wg" => "gemm",
        "quantize" => "quantize",
        "logsoftmax" if matches!(kernel, "softmax_chunk_stats_mass" | "draw_pick") => "sampling",
        "logsoftmax" | "policy_loss" => "loss",
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
    pub fn profile_start(&self) -> Result<()> {
        let mut p = self.prof().lock().unwrap();
        p.spans.clear();
        if p.start.is_none() {
            p.start = Some(
                self.context()
                    .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .ctx("creating a profile event")?,
            );
        }
        if let Some(e) = &p.start {
            e.record(&self.stream).ctx("recording a profile event")?;
        }
        p.on = true;
        Ok(())
    }

    /// Stop, wait for the stream, and sum the spans per category.
    pub fn profile_stop(&self) -> Result<Profile> {
        let mut p = self.prof().lock().unwrap();
        p.on = false;
        self.stream
            .synchronize()
            .ctx("waiting for the profiled work")?;
        let mut sums: Vec<(String, f64)> = Vec::new();
        let mut kernels: Vec<(String, f64, usize)> = Vec::new();
        let mut idle: Vec<(String, f64, usize)> = Vec::new();
        // The idle time before the first launch, under the name BEFORE_FIRST.
        if let (Some(s), Some(&(_, _, i))) = (&p.start, p.spans.first()) {
            let gap = s.elapsed_ms(&p.pool[i]).ctx("reading profile events")? as f64;
            if gap > IDLE_MIN_MS {
                add_to(&mut idle, BEFORE_FIRST, gap);
            }
        }
        let mut prev_end: Option<usize> = None;
        for &(cat, name, i) in &p.spans {
            let ms = p.pool[i]
                .elapsed_ms(&p.pool[i + 1])
                .ctx("reading profile events")? as f64;
            match sums.iter_mut().find(|(c, _)| c == cat) {
                Some(s) => s.1 += ms,
                None => sums.push((cat.to_string(), ms)),
            }
            add_to(&mut kernels, name, ms);
            // The stream's idle time before this span: its start event recorded
            // after the previous span's end had already completed.
            if let Some(e) = prev_end {
                let gap = p.pool[e]
                    .elapsed_ms(&p.pool[i])
                    .ctx("reading profile events")? as f64;
                if gap > IDLE_MIN_MS {
                    add_to(&mut idle, name, gap);
                }
            }
            prev_end = Some(i + 1);
        }
        p.spans.clear();
        sums.sort_by(|a, b| b.1.total_cmp(&a.1));
        kernels.sort_by(|a, b| b.1.total_cmp(&a.1));
        idle.sort_by(|a, b| b.1.total_cmp(&a.1));
        p.kernels = kernels;
        p.idle = idle;
        Ok(sums)
    }

    /// The last profile per kernel: (name, milliseconds, calls), largest first.
    pub fn profile_kernels(&self) -> Vec<(String, f64, usize)> {
        self.prof().lock().unwrap().kernels.clone()
    }

    /// The last profile's idle gaps (longer than 2 us) per the kernel launched after
    /// them: (name, milliseconds, gaps), largest first.
    pub fn profile_idle(&self) -> Vec<(String, f64, usize)> {
        self.prof().lock().unwrap().idle.clone()
    }

    /// Whether a graph capture is on.
    pub(crate) fn capturing(&self) -> bool {
        self.prof().lock().unwrap().capturing
    }

    /// Start or end a graph capture; returns the launches counted since the start.
    pub(crate) fn set_capturing(&self, on: bool) -> usize {
        let mut p = self.prof().lock().unwrap();
        p.capturing = on;
        std::mem::replace(&mut p.captured, 0)
    }

    /// Run `f` (which queues work on the stream) inside a span of `cat` when a
    /// profile is on.
    pub(crate) fn span<T>(
        &self,
        cat: &'static str,
        name: &'static str,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let start = {
            let mut p = self.prof().lock().unwrap();
            if p.capturing {
                p.captured += 1;
                drop(p);
                return f();
            }
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
            p.spans.push((cat, name, i));
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

#[cfg(test)]
mod tests {
    use super::category;

    /// The plain draw's kernels count as sampling though the log-softmax module holds
    /// them; that module's other kernels stay the loss's, as the policy loss does.
    #[test]
    fn the_draw_is_sampling() {
        assert_eq!(category("logsoftmax", "draw_pick"), "sampling");
        assert_eq!(
            category("logsoftmax", "softmax_chunk_stats_mass"),
            "sampling"
        );
        assert_eq!(category("logsoftmax", "softmax_chunk_stats"), "loss");
        assert_eq!(category("policy_loss", "policy_loss"), "loss");
        assert_eq!(category("sample", "sample_top"), "sampling");
        assert_eq!(category("ops", "rmsnorm_fwd"), "elementwise");
    }
}
