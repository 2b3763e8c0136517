//! Device memory at an address that outlives it: a virtual address range
//! reserved once, backed by physical memory only while it is in use.
//!
//! A captured CUDA graph keeps the addresses its kernels were given. The
//! rollout's KV cache is gigabytes that the training phase between two
//! rollouts wants back, and a buffer freed and allocated again lands wherever
//! the allocator puts it, so every rollout used to capture its decode graphs
//! anew (about 9 ms of host work a batch-size bucket at 0.6B, with the GPU
//! idle). Here the cache's range stays reserved: [`FixedRange::map`] backs the
//! parts a rollout needs (zeroed) and [`FixedRange::unmap`] gives the memory
//! back, so the next rollout's graphs read the same addresses
//! (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`). A range
//! laid out for a larger cache backs only a smaller one's parts.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUdeviceptr, CUmemAccessDesc, CUmemAllocationProp, CUmemGenericAllocationHandle,
};
use cudarc::driver::{CudaContext, CudaSlice, DeviceRepr};

use super::{Ctx, CudaError, Gpu, Result};

/// A reserved range of device addresses, parts of it mapped to memory or none.
pub struct FixedRange {
    ctx: Arc<CudaContext>,
    base: CUdeviceptr,
    /// Reserved bytes, and the granularity every mapped part's offset and
    /// length are multiples of.
    bytes: usize,
    gran: usize,
    /// The mapped parts `(offset, bytes, memory)`: a handle each, since
    /// `cuMemMap` maps a handle from its start only.
    mapped: Option<Vec<(usize, usize, CUmemGenericAllocationHandle)>>,
}

// SAFETY: the range is plain device addresses and a driver handle; the driver
// API may be called from any thread with the context bound, as every method does.
unsafe impl Send for FixedRange {}

fn driver_err(what: &str, e: cudarc::driver::DriverError) -> CudaError {
    CudaError::Driver {
        what: what.to_string(),
        err: e.to_string(),
    }
}

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
    /// The granularity of device memory mapped into a reserved range (2 MiB on
    /// Hopper): what [`FixedRange`] parts are multiples of.
    pub fn range_granularity(&self) -> Result<usize> {
        let ctx = self.context();
        ctx.bind_to_thread().ctx("binding the device")?;
        let prop = device_prop(ctx);
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
        .ctx("reading the device's allocation granularity (CUDA virtual memory management, which the KV cache needs)")?;
        Ok(gran.max(1))
    }

    /// Reserve a range of at least `bytes` device addresses, not yet backed.
    pub fn reserve_range(&self, bytes: usize) -> Result<FixedRange> {
        let gran = self.range_granularity()?;
        let ctx = self.context().clone();
        let bytes = bytes.max(1).div_ceil(gran) * gran;
        let mut base: CUdeviceptr = 0;
        // SAFETY: out-pointer; no fixed address asked (0), default flags.
        unsafe { sys::cuMemAddressReserve(&mut base, bytes, gran, 0, 0) }
            .result()
            .ctx("reserving device addresses for the KV cache (CUDA virtual memory management)")?;
        Ok(FixedRange {
            ctx,
            base,
            bytes,
            gran,
            mapped: None,
        })
    }
}

impl FixedRange {
    /// Back `parts` (byte offset, length; offsets multiples of the granularity,
    /// lengths rounded up to it, inside the range, not overlapping; adjacent
    /// ones mapped as one) with device memory and zero them (stream-ordered on `g`'s stream). Out of memory, the
    /// stream-ordered pool's cached memory (which the training phase leaves
    /// there) is handed back and it tries once more.
    pub fn map(&mut self, g: &Gpu, parts: &[(usize, usize)]) -> Result<()> {
        if self.mapped.is_some() {
            return Err(CudaError::Invalid("mapping a reserved range twice".into()));
        }
        let gran = self.gran;
        let parts: Vec<(usize, usize)> = parts
            .iter()
            .map(|&(o, n)| (o, n.max(1).div_ceil(gran) * gran))
            .collect();
        let mut sorted = parts.clone();
        sorted.sort_unstable();
        let bad = sorted
            .iter()
            .any(|&(o, n)| !o.is_multiple_of(gran) || o + n > self.bytes)
            || sorted.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0);
        // Adjacent parts in one mapping (a cache that fills its layout is one):
        // each mapping is a handle, a map, an access grant and a memset.
        let mut parts: Vec<(usize, usize)> = Vec::with_capacity(sorted.len());
        for (o, n) in sorted {
            match parts.last_mut() {
                Some(last) if last.0 + last.1 == o => last.1 += n,
                _ => parts.push((o, n)),
            }
        }
        if bad || parts.is_empty() {
            return Err(CudaError::Invalid(format!(
                "mapping parts {parts:?} of a reserved range of {} bytes (granularity {gran})",
                self.bytes
            )));
        }
        self.ctx.bind_to_thread().ctx("binding the device")?;
        let prop = device_prop(&self.ctx);
        let desc = CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let mut done: Vec<(usize, usize, CUmemGenericAllocationHandle)> =
            Vec::with_capacity(parts.len());
        let mut trimmed = false;
        let mut failed = None;
        for &(o, n) in &parts {
            let create = || {
                let mut h: CUmemGenericAllocationHandle = 0;
                // SAFETY: out-pointer, a size that is a multiple of the granularity.
                unsafe { sys::cuMemCreate(&mut h, n, &prop, 0) }
                    .result()
                    .map(|()| h)
            };
            let h = match create() {
                Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY && !trimmed => {
                    trimmed = true;
                    g.sync().and_then(|()| g.trim_memory_pool()).and_then(|()| {
                        create().ctx("allocating the KV cache's memory (after trimming the pool)")
                    })
                }
                r => r.ctx("allocating the KV cache's memory"),
            };
            let h = match h {
                Ok(h) => h,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            let ptr = self.base + o as u64;
            // SAFETY: the whole handle at a reserved, aligned, unmapped address.
            if let Err(e) = unsafe { sys::cuMemMap(ptr, n, 0, h, 0) }.result() {
                // SAFETY: the handle made above, not mapped.
                let _ = unsafe { sys::cuMemRelease(h) };
                failed = Some(driver_err("mapping the KV cache's memory", e));
                break;
            }
            done.push((o, n, h));
            // SAFETY: one access descriptor for the part just mapped.
            if let Err(e) = unsafe { sys::cuMemSetAccess(ptr, n, &desc, 1) }.result() {
                failed = Some(driver_err("opening the KV cache's memory to the device", e));
                break;
            }
        }
        if let Some(err) = failed {
            self.mapped = Some(done);
            let _ = self.release();
            return Err(err);
        }
        let zero: Vec<(usize, usize)> = done.iter().map(|&(o, n, _)| (o, n)).collect();
        self.mapped = Some(done);
        for (o, n) in zero {
            // SAFETY: the part is mapped read-write; any byte is valid.
            unsafe {
                cudarc::driver::result::memset_d8_async(
                    self.base + o as u64,
                    0,
                    n,
                    g.stream().cu_stream(),
                )
            }
            .ctx("zeroing the KV cache")?;
        }
        Ok(())
    }

    /// Wait for `g`'s stream (its queued work may still read the range), then
    /// give the memory back; the addresses stay reserved.
    pub fn unmap(&mut self, g: &Gpu) -> Result<()> {
        if self.mapped.is_none() {
            return Ok(());
        }
        g.sync()?;
        self.release()
    }

    /// Unmap every part and release its memory; parts that fail to unmap stay
    /// (mapped: the range's addresses are then not freed on drop).
    fn release(&mut self) -> Result<()> {
        let Some(parts) = self.mapped.take() else {
            return Ok(());
        };
        self.ctx.bind_to_thread().ctx("binding the device")?;
        let mut left = Vec::new();
        let mut first_err = None;
        for (o, n, h) in parts {
            // SAFETY: the part is mapped to `h`, and nothing queued reads it.
            match unsafe { sys::cuMemUnmap(self.base + o as u64, n) }.result() {
                Ok(()) => {
                    // SAFETY: the handle is no longer mapped anywhere.
                    let _ = unsafe { sys::cuMemRelease(h) };
                }
                Err(e) => {
                    left.push((o, n, h));
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            None => Ok(()),
            Some(e) => {
                self.mapped = Some(left);
                Err(driver_err("unmapping the KV cache's memory", e))
            }
        }
    }

    /// `n` values of `T` at byte `offset` of the range, as a device buffer
    /// that never frees (the range owns the memory). It must lie in a mapped
    /// part whenever it is used.
    pub fn view<T: DeviceRepr>(&self, g: &Gpu, offset: usize, n: usize) -> Result<RangeView<T>> {
        let end = n
            .checked_mul(std::mem::size_of::<T>())
            .and_then(|b| b.checked_add(offset));
        let ok = end.is_some_and(|e| e <= self.bytes) && offset.is_multiple_of(256);
        if !ok {
            return Err(CudaError::Invalid(format!(
                "a view of {n} values at byte {offset} of a reserved range of {} bytes (256-aligned)",
                self.bytes
            )));
        }
        // SAFETY: the bytes lie inside the reserved range; the caller maps them
        // before any use, and `RangeView` never frees them. With the context's
        // event tracking on, cudarc would make (and unwrap) two events here;
        // `Gpu` turns it off.
        let s = unsafe { g.stream().upgrade_device_ptr(self.base + offset as u64, n) };
        Ok(RangeView(std::mem::ManuallyDrop::new(s)))
    }
}

impl Drop for FixedRange {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        if self.mapped.is_some() {
            // The owner unmaps after waiting for its stream; a range dropped
            // mapped (an error path) waits for the whole context.
            let _ = self.ctx.synchronize();
            if self.release().is_err() {
                return; // still mapped: its addresses cannot be freed
            }
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
