//! CUDA graphs: the work a closure enqueues on a [`Gpu`]'s stream, captured once
//! and replayed with one launch. The decode step is ~1,000 launches of a few
//! microseconds of host work each against ~2 ms of device work at batch 64: as a
//! graph the host stops being the bottleneck.
//!
//! What may run inside a capture: kernel launches, cuBLASLt matmuls (their
//! workspace is allocated once, outside), stream-ordered allocations and frees of
//! buffers made inside it, device-to-device copies and memsets. What may not:
//! host copies (uploads, downloads), synchronisation, and freeing a buffer made
//! outside. Kernel arguments are frozen at capture, so inputs that change between
//! replays live in device buffers the caller rewrites before each launch.

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;

use super::{Ctx, Gpu, Result};

/// A captured, instantiated graph; [`Graph::launch`] replays it on the stream.
pub struct Graph {
    exec: CudaGraph,
    name: &'static str,
    /// Launches (kernels and matmuls) captured, for the profile and the logs.
    pub launches: usize,
}

// SAFETY: the graph's handles belong to the driver, which allows their use
// from any thread; a launch binds the context first (cudarc's `launch`), and
// `Graph` gives no shared mutable access (launch takes `&self` and the driver
// serialises work on the stream). A decoder hands its graphs to the next
// rollout's through `Gpu::park`, which needs `Send`.
unsafe impl Send for Graph {}

impl Gpu {
    /// Capture what `f` enqueues into a graph named `name` (nothing runs until a
    /// launch). On an error inside `f` the capture is ended and discarded, and
    /// the stream is usable again.
    pub fn capture<T>(
        &self,
        name: &'static str,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<(Graph, T)> {
        self.sync()?;
        self.capture_behind(name, f)
    }

    /// [`Gpu::capture`] without waiting for the stream first: work already
    /// queued runs on while the host captures (a capture records what comes
    /// after it, and replays are ordered after that work by the stream), so
    /// the capture's host time hides behind it. Faults of the queued work
    /// surface at the next wait instead of here.
    pub fn capture_behind<T>(
        &self,
        name: &'static str,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<(Graph, T)> {
        self.set_capturing(true);
        let begun = self
            .stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .ctx("beginning a graph capture");
        if let Err(e) = begun {
            self.set_capturing(false);
            return Err(e);
        }
        let out = f();
        let ended = self
            .stream
            .end_capture(CUgraphInstantiate_flags(0))
            .ctx("ending a graph capture");
        let launches = self.set_capturing(false);
        let (out, exec) = (out?, ended?);
        let exec = exec
            .ok_or_else(|| super::CudaError::Invalid("a graph capture recorded nothing".into()))?;
        Ok((
            Graph {
                exec,
                name,
                launches,
            },
            out,
        ))
    }
}

impl Graph {
    /// Replay the graph on `gpu`'s stream (the one it was captured on); in a
    /// profile it is one span of category "graph".
    pub fn launch(&self, gpu: &Gpu) -> Result<()> {
        gpu.span("graph", self.name, || {
            self.exec.launch().ctx("launching a graph")
        })
    }
}
