//! Device memory at an address that outlives it: a virtual address range
//! reserved once, backed by physical memory only while it is in use.
//!
//! A captured CUDA graph keeps the addresses its kernels were given. The
//! rollout's KV cache is gigabytes that the training phase between two
//! rollouts wants back, and a buffer freed and allocated again lands wherever
//! the allocator puts it, so every rollout used to capture its decode graphs
//! anew (about 9 ms of host work a batch-size bucket at 0.6B, with the GPU
//! idle). Here the cache's range stays reserved: [`FixedRange::map`] backs it
//! (zeroed) for a rollout and [`FixedRange::unmap`] gives the memory back,
//! so the next rollout's graphs read the same addresses
//! (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`).

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUdeviceptr, CUmemAccessDesc, CUmemAllocationProp, CUmemGenericAllocationHandle,
};
use cudarc::driver::{CudaContext, CudaSlice, DeviceRepr};

use super::{Ctx, CudaError, Gpu, Result};

/// A reserved range of device addresses, mapped to memory or not.
pub struct FixedRange {
    ctx: Arc<CudaContext>,
    base: CUdeviceptr,
    /// Reserved bytes (a multiple of the allocation granularity); when mapped,
    /// all of them are backed.
    bytes: usize,
    handle: Option<CUmemGenericAllocationHandle>,
}

// SAFETY: the range is plain device addresses and a driver handle; the driver
// API may be called from any thread with the context bound, as every method does.
unsafe impl Send for FixedRange {}

/// Device memory on this context's device, as `cuMemCreate` takes it.
fn device_prop(ctx: &CudaContext) -> CUmemAllocationProp {
    // SAFETY: a plain C struct for which all zeros is valid (no handle types,
    // no flags); the fields that matter are set below.
    let mut p: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = ctx.cu_device();
    p
}

impl Gpu {
    /// Reserve a range of at least `bytes` device addresses, not yet backed.
    pub fn reserve_range(&self, bytes: usize) -> Result<FixedRange> {
        let ctx = self.context().clone();
        ctx.bind_to_thread().ctx("binding the device")?;
        let prop = device_prop(&ctx);
        let mut gran = 0usize;
        // SAFETY: out-pointer and a valid property struct, as documented.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut gran,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        }
        .result()
        .ctx("reading the device's allocation granularity")?;
        let gran = gran.max(1);
        let bytes = bytes.max(1).div_ceil(gran) * gran;
        let mut base: CUdeviceptr = 0;
        // SAFETY: out-pointer; no fixed address asked (0), default flags.
        unsafe { sys::cuMemAddressReserve(&mut base, bytes, gran, 0, 0) }
            .result()
            .ctx("reserving device addresses")?;
        Ok(FixedRange {
            ctx,
            base,
            bytes,
            handle: None,
        })
    }
}

impl FixedRange {
    /// Reserved bytes (what a mapping backs).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn is_mapped(&self) -> bool {
        self.handle.is_some()
    }

    /// Back the whole range with device memory and zero it (stream-ordered on
    /// `g`'s stream). Out of memory, the stream-ordered pool's cached memory
    /// (which the training phase leaves there) is handed back and it tries once
    /// more. Mapping a mapped range does nothing.
    pub fn map(&mut self, g: &Gpu) -> Result<()> {
        if self.handle.is_some() {
            return Ok(());
        }
        self.ctx.bind_to_thread().ctx("binding the device")?;
        let prop = device_prop(&self.ctx);
        let create = || {
            let mut h: CUmemGenericAllocationHandle = 0;
            // SAFETY: out-pointer, a size that is a multiple of the granularity.
            unsafe { sys::cuMemCreate(&mut h, self.bytes, &prop, 0) }
                .result()
                .map(|()| h)
        };
        let h = match create() {
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                g.sync()?;
                g.trim_memory_pool()?;
                create().ctx("allocating the KV cache's memory (after trimming the pool)")?
            }
            r => r.ctx("allocating the KV cache's memory")?,
        };
        // SAFETY: the handle's whole size at the reserved base; on failure the
        // handle is released and the range left unmapped.
        let mapped = unsafe { sys::cuMemMap(self.base, self.bytes, 0, h, 0) }
            .result()
            .ctx("mapping the KV cache's memory")
            .and_then(|()| {
                let desc = CUmemAccessDesc {
                    location: prop.location,
                    flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                };
                // SAFETY: one access descriptor for the mapped range.
                let set = unsafe { sys::cuMemSetAccess(self.base, self.bytes, &desc, 1) };
                if set.result().is_err() {
                    // SAFETY: the range was mapped just above.
                    let _ = unsafe { sys::cuMemUnmap(self.base, self.bytes) };
                }
                set.result()
                    .ctx("opening the KV cache's memory to the device")
            });
        if let Err(e) = mapped {
            // SAFETY: the handle made above, no longer mapped.
            let _ = unsafe { sys::cuMemRelease(h) };
            return Err(e);
        }
        self.handle = Some(h);
        // SAFETY: the range is mapped read-write; any byte is valid.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.base,
                0,
                self.bytes,
                g.stream().cu_stream(),
            )
        }
        .ctx("zeroing the KV cache")
    }

    /// Wait for `g`'s stream (its queued work may still read the range), then
    /// give the memory back; the addresses stay reserved.
    pub fn unmap(&mut self, g: &Gpu) -> Result<()> {
        let Some(h) = self.handle else {
            return Ok(());
        };
        g.sync()?;
        self.release(h)
    }

    fn release(&mut self, h: CUmemGenericAllocationHandle) -> Result<()> {
        self.ctx.bind_to_thread().ctx("binding the device")?;
        self.handle = None;
        // SAFETY: the range is mapped to `h`, and nothing queued reads it.
        unsafe { sys::cuMemUnmap(self.base, self.bytes) }
            .result()
            .ctx("unmapping the KV cache's memory")?;
        // SAFETY: the handle is no longer mapped anywhere.
        unsafe { sys::cuMemRelease(h) }
            .result()
            .ctx("releasing the KV cache's memory")
    }

    /// `n` values of `T` at byte `offset` of the range, as a device buffer
    /// that never frees (the range owns the memory). The view must not be
    /// used while the range is unmapped.
    pub fn view<T: DeviceRepr>(&self, g: &Gpu, offset: usize, n: usize) -> Result<RangeView<T>> {
        let end = offset + n * std::mem::size_of::<T>();
        if end > self.bytes || !offset.is_multiple_of(std::mem::align_of::<T>().max(256)) {
            return Err(CudaError::Invalid(format!(
                "a view of bytes {offset}..{end} of a reserved range of {} bytes (256-aligned)",
                self.bytes
            )));
        }
        // SAFETY: the bytes lie inside the reserved range; the caller maps it
        // before any use, and `RangeView` never frees them.
        let s = unsafe { g.stream().upgrade_device_ptr(self.base + offset as u64, n) };
        Ok(RangeView(std::mem::ManuallyDrop::new(s)))
    }
}

impl Drop for FixedRange {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        if let Some(h) = self.handle {
            // The owner unmaps after waiting for its stream; a range dropped
            // mapped (an error path) waits for the whole context.
            let _ = self.ctx.synchronize();
            let _ = self.release(h);
        }
        // SAFETY: the range reserved in `reserve_range`, now unmapped.
        let _ = unsafe { sys::cuMemAddressFree(self.base, self.bytes) };
    }
}

/// A device buffer inside a [`FixedRange`]: a `CudaSlice` that is never freed.
pub struct RangeView<T>(std::mem::ManuallyDrop<CudaSlice<T>>);

impl<T> Deref for RangeView<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.0
    }
}

impl<T> DerefMut for RangeView<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.0
    }
}

impl<T> Drop for RangeView<T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; `leak` hands the pointer back without
        // freeing it (the range owns the memory).
        let s = unsafe { std::mem::ManuallyDrop::take(&mut self.0) };
        s.leak();
    }
}
