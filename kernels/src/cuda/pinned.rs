//! Page-locked host buffers and a copy stream for the decode loop's small
//! per-step copies.
//!
//! A copy between pageable host memory and the device makes the host wait: for
//! the copy itself (device to host) or, when the driver stages the data, for
//! the stream to drain (host to device). And a copy on the compute stream,
//! however small, sits between two kernels: with the draw's copy back and four
//! input uploads on the compute stream, the GPU still idled 50-57 us before
//! each decode step run ahead of the host (H200, 0.6B batch 64, thirty-first
//! session), against none with them on a lane. The decode loop runs a step ahead of the host
//! (`jet_backend::gpu::ahead`), so its copies go through pinned buffers on a
//! [`CopyLane`], a stream of their own that the compute stream waits for only
//! through events (uploads long done by the time it gets there).
//!
//! Reuse is safe by construction: an event is recorded after each copy from or
//! to a pinned buffer, and the host waits for it before writing the buffer
//! again. (cudarc's [`PinnedHostSlice`] keeps an event for this too, but records
//! it only with cudarc's event tracking on, which [`Gpu`] turns off.)

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, DeviceRepr, PinnedHostSlice, ValidAsZeroBits,
};

use super::{ensure, Ctx, Gpu, Result};

/// An event the host waits on by spinning (cudarc's pinned buffers' own events
/// block the thread, which wakes tens of microseconds late).
fn spin_event(gpu: &Gpu) -> Result<CudaEvent> {
    gpu.context()
        .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .ctx("creating an event")
}

/// Uploads of `len` values through two pinned buffers taken in turn, so the
/// host fills one while a stream may still be reading the other.
pub struct PinnedIn<T> {
    bufs: [PinnedHostSlice<T>; 2],
    /// Recorded after each buffer's copy; the host waits for it before
    /// writing the buffer again (cudarc records the pinned buffers' own
    /// events only with its event tracking on, which `Gpu` turns off).
    copied: [CudaEvent; 2],
    turn: usize,
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy> PinnedIn<T> {
    /// Two buffers of `len` values (write-combined: the host only writes them).
    pub fn new(gpu: &Gpu, len: usize) -> Result<PinnedIn<T>> {
        let one = || {
            // SAFETY: `upload` fills all `len` values before a copy reads them.
            unsafe { gpu.context().alloc_pinned::<T>(len.max(1)) }
                .ctx("allocating page-locked host memory")
        };
        Ok(PinnedIn {
            bufs: [one()?, one()?],
            copied: [spin_event(gpu)?, spin_event(gpu)?],
            turn: 0,
        })
    }

    /// Values a buffer holds.
    pub fn len(&self) -> usize {
        self.bufs[0].len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copy `src` then `pad` up to the buffers' length into `dst` (exactly that
    /// long) on `stream`, without waiting for it.
    pub fn upload(
        &mut self,
        stream: &Arc<CudaStream>,
        src: &[T],
        pad: T,
        dst: &mut CudaSlice<T>,
    ) -> Result<()> {
        let buf = &mut self.bufs[self.turn];
        let len = buf.len();
        ensure(src.len() <= len && dst.len() == len, || {
            format!(
                "pinned upload of {} values through {len} into {}",
                src.len(),
                dst.len()
            )
        })?;
        // Waits (rarely) for this buffer's last copy, two uploads back.
        let copied = &self.copied[self.turn];
        copied.synchronize().ctx("waiting for a pinned buffer")?;
        let host = buf.as_mut_slice().ctx("reading a pinned buffer")?;
        host[..src.len()].copy_from_slice(src);
        host[src.len()..].fill(pad);
        stream
            .memcpy_htod(&*buf, dst)
            .ctx("copying to the device")?;
        copied.record(stream).ctx("recording an event")?;
        self.turn ^= 1;
        Ok(())
    }
}

/// A download the host starts, leaves, and waits for later: one pinned buffer
/// of `len` values.
pub struct PinnedOut<T> {
    buf: PinnedHostSlice<T>,
    done: CudaEvent,
    /// Values of the copy in flight (0: none).
    n: usize,
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy> PinnedOut<T> {
    pub fn new(gpu: &Gpu, len: usize) -> Result<PinnedOut<T>> {
        // SAFETY: only the values a finished copy wrote are read (`wait`).
        let buf = unsafe { gpu.context().alloc_pinned_with_flags::<T>(len.max(1), 0) }
            .ctx("allocating page-locked host memory")?;
        Ok(PinnedOut {
            buf,
            done: spin_event(gpu)?,
            n: 0,
        })
    }

    /// Enqueue the copy of all of `src` (at most the buffer's length) on `stream`.
    fn start(&mut self, gpu: &Gpu, stream: &Arc<CudaStream>, src: &CudaSlice<T>) -> Result<()> {
        let n = src.len();
        ensure(n <= self.buf.len(), || {
            format!("pinned download of {n} values into {}", self.buf.len())
        })?;
        // The last copy into the buffer is over (its values were read).
        self.done.synchronize().ctx("waiting for a download")?;
        let host = self.buf.as_mut_slice().ctx("waiting for a pinned buffer")?;
        // A raw copy of `n` values: cudarc's `memcpy_dtoh` copies the whole
        // destination, past the end of a shorter source.
        gpu.context().bind_to_thread().ctx("binding the device")?;
        // SAFETY: `host[..n]` is page-locked memory nothing else touches until
        // `wait`; the source holds `n` values, ready on `stream` (the caller
        // orders it after their producer).
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                &mut host[..n],
                gpu.ptr(src),
                stream.cu_stream(),
            )
        }
        .ctx("copying to the host")?;
        self.done.record(stream).ctx("recording an event")?;
        self.n = n;
        Ok(())
    }

    /// Wait for the copy started last; its values.
    pub fn wait(&mut self) -> Result<&[T]> {
        self.done.synchronize().ctx("waiting for a download")?;
        let n = std::mem::take(&mut self.n);
        Ok(&self.buf.as_slice().ctx("reading a pinned buffer")?[..n])
    }
}

/// A stream for copies beside a [`Gpu`]'s compute stream, joined to it by
/// events only.
pub struct CopyLane {
    stream: Arc<CudaStream>,
    /// Recorded on the lane after its uploads; the compute stream waits on it.
    uploaded: CudaEvent,
    /// Recorded on the compute stream; the lane waits on it before a download.
    ready: CudaEvent,
}

impl CopyLane {
    pub fn new(gpu: &Gpu) -> Result<CopyLane> {
        Ok(CopyLane {
            stream: gpu.context().new_stream().ctx("creating a stream")?,
            uploaded: spin_event(gpu)?,
            ready: spin_event(gpu)?,
        })
    }

    /// Upload `src` (then `pad`) through `stage` into `dst` on the lane. The
    /// compute stream sees it after [`CopyLane::join`]; nothing queued there
    /// may still read `dst` (the caller orders it: buffers taken in turn, and
    /// [`CopyLane::wait_compute`] where turns alone do not suffice).
    pub fn upload<T: DeviceRepr + ValidAsZeroBits + Copy>(
        &self,
        stage: &mut PinnedIn<T>,
        src: &[T],
        pad: T,
        dst: &mut CudaSlice<T>,
    ) -> Result<()> {
        stage.upload(&self.stream, src, pad, dst)
    }

    /// Make the compute stream's later work wait for the lane's uploads so far.
    pub fn join(&self, gpu: &Gpu) -> Result<()> {
        self.uploaded
            .record(&self.stream)
            .ctx("recording an event")?;
        gpu.stream()
            .wait(&self.uploaded)
            .ctx("waiting for the copy stream")
    }

    /// Make the lane's later copies wait for the compute stream's work so far
    /// (once, after buffers the lane writes were allocated there).
    pub fn wait_compute(&self, gpu: &Gpu) -> Result<()> {
        self.ready.record(gpu.stream()).ctx("recording an event")?;
        self.stream
            .wait(&self.ready)
            .ctx("waiting for the compute stream")
    }

    /// Copy `src` into `out` on the lane once the compute stream's work so far
    /// (its producer) is done; [`PinnedOut::wait`] waits for it. `src` must
    /// outlive the copy (the caller waits before dropping it).
    pub fn download<T: DeviceRepr + ValidAsZeroBits + Copy>(
        &self,
        gpu: &Gpu,
        src: &CudaSlice<T>,
        out: &mut PinnedOut<T>,
    ) -> Result<()> {
        self.wait_compute(gpu)?;
        out.start(gpu, &self.stream, src)
    }
}

impl Gpu {
    /// Keep `v` for the next [`Gpu::take_parked`] of its type (one value a
    /// type; a second replaces the first): page-locked buffers and streams
    /// cost milliseconds to make and to free, and the rollout makes a new
    /// decoder every step.
    pub fn park<T: std::any::Any + Send>(&self, v: T) {
        let mut p = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        p.insert(std::any::TypeId::of::<T>(), Box::new(v));
    }

    /// The value of type `T` parked last, if any.
    pub fn take_parked<T: std::any::Any + Send>(&self) -> Option<T> {
        let mut p = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        let v = p.remove(&std::any::TypeId::of::<T>())?;
        v.downcast::<T>().ok().map(|b| *b)
    }
}
