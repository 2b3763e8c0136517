//! The device, its stream, NVRTC compilation with a module cache, and launches.
//!
//! Every op runs on one stream per [`Gpu`]; cudarc's per-buffer event tracking is
//! switched off (one stream needs none, and it costs two events per allocation).

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::{result as nvrtc_result, sys as nvrtc_sys, Ptx};
use sha2::{Digest, Sha256};

use super::gemm::LtState;
use super::{Ctx, CudaError, Result};

/// One `.cu` file; the common header is prepended before compiling.
pub(crate) struct Source {
    pub name: &'static str,
    pub code: &'static str,
}

const COMMON: &str = include_str!("kernels/common.cuh");
pub(crate) const QUANTIZE: Source = Source {
    name: "quantize",
    code: concat!(
        include_str!("kernels/block128.cuh"),
        include_str!("kernels/quantize.cu")
    ),
};
pub(crate) const GEMV: Source = Source {
    name: "gemv_fp8",
    code: include_str!("kernels/gemv_fp8.cu"),
};
pub(crate) const ROWS: Source = Source {
    name: "gemm_rows",
    code: include_str!("kernels/gemm_rows.cu"),
};
/// The wgmma twins of the split-K and rows kernels (sm_90a only; empty elsewhere).
pub(crate) const WG: Source = Source {
    name: "gemm_wg",
    code: concat!(
        include_str!("kernels/wgmma.cuh"),
        include_str!("kernels/wg_common.cuh"),
        include_str!("kernels/gemm_wg.cu"),
        include_str!("kernels/block128.cuh"),
        include_str!("kernels/gate_up_swiglu.cu")
    ),
};
pub(crate) const OPS: Source = Source {
    name: "ops",
    code: include_str!("kernels/ops.cu"),
};
pub(crate) const ATTENTION: Source = Source {
    name: "attention",
    code: include_str!("kernels/attention.cu"),
};
pub(crate) const LOGSOFTMAX: Source = Source {
    name: "logsoftmax",
    code: concat!(
        include_str!("kernels/mass.cuh"),
        include_str!("kernels/logsoftmax.cu"),
        include_str!("kernels/draw.cu")
    ),
};
pub(crate) const TENSOR: Source = Source {
    name: "tensor",
    code: include_str!("kernels/tensor.cu"),
};
/// The GRPO policy loss per scored token (policy_loss.rs).
pub(crate) const POLICY_LOSS: Source = Source {
    name: "policy_loss",
    code: include_str!("kernels/policy_loss.cu"),
};
pub(crate) const ADAMW: Source = Source {
    name: "adamw",
    code: concat!(
        include_str!("kernels/block128.cuh"),
        include_str!("kernels/adamw.cu")
    ),
};
pub(crate) const SAMPLE: Source = Source {
    name: "sample",
    code: concat!(
        include_str!("kernels/mass.cuh"),
        include_str!("kernels/sample.cu"),
        include_str!("kernels/sample_top.cu")
    ),
};
pub(crate) const FLASH: Source = Source {
    name: "flash",
    code: include_str!("kernels/flash.cu"),
};
/// The attention backward on wgmma (sm_90a only; empty elsewhere).
pub(crate) const FLASH_WG: Source = Source {
    name: "flash_wg",
    code: concat!(
        include_str!("kernels/wgmma.cuh"),
        include_str!("kernels/wg_common.cuh"),
        include_str!("kernels/flash_wg.cu")
    ),
};
const SOURCES: [&Source; 13] = [
    &QUANTIZE,
    &GEMV,
    &ROWS,
    &WG,
    &OPS,
    &ATTENTION,
    &LOGSOFTMAX,
    &TENSOR,
    &POLICY_LOSS,
    &ADAMW,
    &SAMPLE,
    &FLASH,
    &FLASH_WG,
];

/// Somewhere to keep compiled kernel images between runs (the daemon keeps them in
/// sled). Keys are hex sha256 of source, architecture, NVRTC version and options.
pub trait KernelStore: Send + Sync {
    fn load(&self, key: &str) -> Option<Vec<u8>>;
    fn save(&self, key: &str, image: &[u8]);
}

/// A [`KernelStore`] in a folder: one `<key>.cubin` file per module.
pub struct DirKernelStore(pub PathBuf);

impl KernelStore for DirKernelStore {
    fn load(&self, key: &str) -> Option<Vec<u8>> {
        std::fs::read(self.0.join(format!("{key}.cubin"))).ok()
    }
    fn save(&self, key: &str, image: &[u8]) {
        // Written under a temporary name and renamed, so a reader never sees half a file.
        // A cache that cannot be written is only slower: errors are ignored.
        let tmp = self.0.join(format!("{key}.tmp{}", std::process::id()));
        if std::fs::create_dir_all(&self.0).is_ok() && std::fs::write(&tmp, image).is_ok() {
            let _ = std::fs::rename(&tmp, self.0.join(format!("{key}.cubin")));
        }
    }
}

/// A kernel argument: device pointers travel as u64.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
    D(f64),
    /// A bulk tensor copy's map (`CUtensorMap`, 128 bytes), passed by value.
    T(super::tma::TensorMap),
    /// A struct passed by value, as the bytes of its C layout (`SkGroup`, `EpiGroup`;
    /// the kernel reads as many as its parameter holds, at most 256).
    S([u8; 256]),
}

/// One CUDA device with its stream, compiled modules and cuBLASLt state.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    name: String,
    cc: (i32, i32),
    sms: usize,
    nvrtc: (i32, i32),
    include: Option<String>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    funcs: Mutex<HashMap<(&'static str, &'static str), CudaFunction>>,
    /// Dynamic shared memory each function was allowed beyond the default 48 KiB.
    smem_opt_in: Mutex<HashMap<(&'static str, &'static str), u32>>,
    store: Mutex<Option<Arc<dyn KernelStore>>>,
    stats: Mutex<KernelStats>,
    pub(crate) lt: LtState,
    pub(crate) prof: Mutex<super::profile::ProfState>,
    /// Launch with programmatic dependent launch (`pdl_entry` in common.cuh):
    /// compute capability 9.0 and up, unless `JET_PDL=0`.
    pdl: bool,
    /// The forward GEMMs run on wgmma (`gemm_wg.cu`): compute capability 9.0,
    /// unless `JET_WGMMA=0` (then the mma.sync kernels, as on other GPUs).
    wgmma: bool,
    /// Host resources one user of the device hands to the next ([`Gpu::park`]).
    pub(crate) parked: Mutex<HashMap<std::any::TypeId, Box<dyn std::any::Any + Send>>>,
}

/// The shared device 0, or why there is none. Probed once per process.
pub fn cuda_available() -> Result<Arc<Gpu>> {
    cuda_device(0)
}

/// The shared device `ordinal` (as the driver numbers them, after
/// `CUDA_VISIBLE_DEVICES`), or why it cannot be used. Opened once per process, so
/// every run on it shares its compiled modules and cuBLASLt state.
pub fn cuda_device(ordinal: usize) -> Result<Arc<Gpu>> {
    static GPUS: OnceLock<Mutex<HashMap<usize, Result<Arc<Gpu>>>>> = OnceLock::new();
    let mut gpus = GPUS.get_or_init(Default::default).lock().unwrap();
    gpus.entry(ordinal)
        .or_insert_with(|| Gpu::new(ordinal).map(Arc::new))
        .clone()
}

/// How many CUDA devices the driver sees, or why CUDA cannot be used here (the
/// error names the missing library or says there is no device). Opens no device.
pub fn cuda_device_count() -> Result<usize> {
    probe_libraries()?;
    no_panic("the CUDA driver could not be used", || {
        let n = CudaContext::device_count()
            .map_err(|e| CudaError::Unavailable(format!("no CUDA device: the driver says {e}")))?;
        if n <= 0 {
            return Err(CudaError::Unavailable(
                "no CUDA device: the driver sees none".into(),
            ));
        }
        Ok(n as usize)
    })
}

/// Where a device's kernel modules came from since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    /// Modules compiled by NVRTC.
    pub compiled: usize,
    /// Modules loaded from the [`KernelStore`] without compiling.
    pub from_store: usize,
}

/// Check that the three libraries can be opened before cudarc touches them:
/// with dynamic loading it panics on a missing library.
fn probe_libraries() -> Result<()> {
    // SAFETY: these only try to dlopen the candidate names.
    let (cuda, nvrtc, lt) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            nvrtc_sys::is_culib_present(),
            cudarc::cublaslt::sys::is_culib_present(),
        )
    };
    let missing = |m: &str| Err(CudaError::Unavailable(m.to_string()));
    if !cuda {
        return missing("libcuda.so not found: no NVIDIA driver on this machine");
    }
    if !nvrtc {
        return missing(
            "libnvrtc.so.13 not found: install the CUDA 13 toolkit (NVRTC) or add its lib64 folder to LD_LIBRARY_PATH",
        );
    }
    if !lt {
        return missing(
            "libcublasLt.so.13 not found: install cuBLAS from CUDA 13 or add its lib64 folder to LD_LIBRARY_PATH",
        );
    }
    Ok(())
}

/// The device's default stream-ordered memory pool (the one `cuMemAllocAsync` uses).
fn default_pool(ctx: &Arc<CudaContext>) -> Result<cudarc::driver::sys::CUmemoryPool> {
    let mut pool: cudarc::driver::sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: an out-pointer for the pool handle, as the driver API documents.
    unsafe { cudarc::driver::sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }
        .result()
        .ctx("finding the device's memory pool")?;
    Ok(pool)
}

/// Let the device's stream-ordered memory pool keep what is freed instead of
/// handing it back to the driver at every synchronisation (its default release
/// threshold is 0): a training step frees gigabytes of activations and allocates
/// them again next step, and each round trip through the driver maps the pages
/// anew. The pool then holds the run's peak, as PyTorch's caching allocator does.
fn keep_pool_memory(ctx: &Arc<CudaContext>) -> Result<()> {
    use cudarc::driver::sys;
    let pool = default_pool(ctx)?;
    let mut keep: u64 = u64::MAX;
    // SAFETY: the driver's pool and a u64 for the threshold attribute.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut keep as *mut u64 as *mut std::ffi::c_void,
        )
    }
    .result()
    .ctx("setting the memory pool's release threshold")
}

/// Release the memory the device's pool holds beyond what is allocated.
fn trim_pool(ctx: &Arc<CudaContext>) -> Result<()> {
    let pool = default_pool(ctx)?;
    // SAFETY: the driver's pool.
    unsafe { cudarc::driver::sys::cuMemPoolTrimTo(pool, 0) }
        .result()
        .ctx("trimming the memory pool")
}

/// Run `f`, turning a panic inside cudarc (a missing symbol, say) into an error.
fn no_panic<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(CudaError::Unavailable(format!("{what}: {msg}")))
        }
    }
}

fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to live integers.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::Unavailable(format!("NVRTC does not answer: {e:?}")))?;
    Ok((major, minor))
}

/// The CUDA include folder: `$CUDA_PATH/include`, `$CUDA_HOME/include`, or
/// /usr/local/cuda/include, if it exists. NVRTC does not search it on its own.
fn include_dir() -> Option<String> {
    let mut cands: Vec<PathBuf> = ["CUDA_PATH", "CUDA_HOME"]
        .iter()
        .filter_map(std::env::var_os)
        .map(|p| Path::new(&p).join("include"))
        .collect();
    cands.push(PathBuf::from("/usr/local/cuda/include"));
    cands
        .into_iter()
        .find(|p| p.is_dir())
        .map(|p| p.to_string_lossy().into_owned())
}

fn options(arch: &str, include: Option<&str>) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
        // No fused multiply-add: element-wise ops then round like the CPU reference
        // (Rust never contracts a*b+c), which makes rope and the dot products bit-exact.
        "--fmad=false".to_string(),
    ];
    if let Some(i) = include {
        o.push(format!("--include-path={i}"));
    }
    // A developer's switch between kernel variants kept side by side in a source
    // (`JET_NVRTC_DEFINES="NAME NAME=1"`), so one binary can time them in one call;
    // the options are part of the compiled-kernel cache key.
    if let Ok(defs) = std::env::var("JET_NVRTC_DEFINES") {
        o.extend(defs.split_whitespace().map(|d| format!("-D{d}")));
    }
    o
}

/// Compile one source to a CUBIN for `arch` (e.g. "sm_90"). Needs only libnvrtc.
fn compile_cubin(src: &Source, opts: &[String]) -> Result<Vec<u8>> {
    let code = format!("{COMMON}\n{}", src.code);
    let c_src = CString::new(code).map_err(|e| CudaError::Compile {
        module: src.name.into(),
        log: e.to_string(),
    })?;
    let c_name = CString::new(format!("{}.cu", src.name)).expect("no NUL in a module name");
    let err = |log: String| CudaError::Compile {
        module: src.name.into(),
        log,
    };
    let prog =
        nvrtc_result::create_program(&c_src, Some(&c_name)).map_err(|e| err(e.to_string()))?;
    // SAFETY: prog is live until destroy_program below; buffers are sized by NVRTC.
    let out = unsafe {
        match nvrtc_result::compile_program(prog, opts) {
            Err(e) => {
                let log = nvrtc_result::get_program_log(prog)
                    .map(|l| {
                        let bytes: Vec<u8> =
                            l.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
                        String::from_utf8_lossy(&bytes).into_owned()
                    })
                    .unwrap_or_default();
                Err(err(format!("{e:?}\n{log}")))
            }
            Ok(()) => {
                let mut size = 0usize;
                nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(|e| err(format!("{e:?}")))
                    .and_then(|_| {
                        let mut image = vec![0u8; size];
                        nvrtc_sys::nvrtcGetCUBIN(prog, image.as_mut_ptr() as *mut c_char)
                            .result()
                            .map_err(|e| err(format!("{e:?}")))
                            .map(|_| image)
                    })
            }
        }
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { nvrtc_result::destroy_program(prog) };
    out
}

/// Compile every kernel source for `arch` without a device (needs only libnvrtc):
/// a check that the `.cu` files are valid. Returns (module, CUBIN bytes).
pub fn compile_all_sources(arch: &str) -> Result<Vec<(&'static str, usize)>> {
    // SAFETY: only tries to dlopen.
    if !unsafe { nvrtc_sys::is_culib_present() } {
        return Err(CudaError::Unavailable("libnvrtc.so.13 not found".into()));
    }
    no_panic("NVRTC", || {
        let opts = options(arch, include_dir().as_deref());
        SOURCES
            .iter()
            .map(|s| compile_cubin(s, &opts).map(|img| (s.name, img.len())))
            .collect()
    })
}

impl Gpu {
    /// Open device `ordinal`. Errors name the missing library or device.
    pub fn new(ordinal: usize) -> Result<Gpu> {
        probe_libraries()?;
        no_panic("the CUDA libraries could not be used", || {
            let n = CudaContext::device_count().map_err(|e| {
                CudaError::Unavailable(format!("no CUDA device: the driver says {e}"))
            })?;
            if ordinal as i32 >= n {
                return Err(CudaError::Unavailable(format!(
                    "no CUDA device {ordinal}: the driver sees {n}"
                )));
            }
            let ctx = CudaContext::new(ordinal).ctx("opening the device")?;
            // SAFETY: every op of a Gpu runs on its one stream (see the module doc).
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx.new_stream().ctx("creating a stream")?;
            keep_pool_memory(&ctx)?;
            let name = ctx.name().ctx("reading the device name")?;
            let cc = ctx
                .compute_capability()
                .ctx("reading the compute capability")?;
            let sms = ctx
                .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .ctx("reading the SM count")? as usize;
            let nvrtc = nvrtc_version()?;
            let lt = LtState::new(&stream)?;
            let store: Option<Arc<dyn KernelStore>> = std::env::var_os("JET_KERNEL_CACHE_DIR")
                .map(|d| Arc::new(DirKernelStore(PathBuf::from(d))) as Arc<dyn KernelStore>);
            Ok(Gpu {
                ctx,
                stream,
                name,
                cc,
                sms,
                nvrtc,
                include: include_dir(),
                modules: Mutex::new(HashMap::new()),
                funcs: Mutex::new(HashMap::new()),
                smem_opt_in: Mutex::new(HashMap::new()),
                store: Mutex::new(store),
                stats: Mutex::new(KernelStats::default()),
                lt,
                prof: Mutex::new(Default::default()),
                parked: Mutex::new(HashMap::new()),
                pdl: cc.0 >= 9 && std::env::var("JET_PDL").map_or(true, |v| v != "0"),
                wgmma: cc == (9, 0) && std::env::var("JET_WGMMA").map_or(true, |v| v != "0"),
            })
        })
    }

    /// The device name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }
    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> usize {
        self.sms
    }
    /// The device's memory in bytes (all of it, used or not).
    pub fn total_memory(&self) -> Result<usize> {
        self.ctx.total_mem().ctx("reading the device's memory size")
    }
    /// NVRTC version (major, minor).
    pub fn nvrtc_version(&self) -> (i32, i32) {
        self.nvrtc
    }
    /// Hand the memory the stream-ordered pool caches (beyond what is
    /// allocated) back to the driver, for an allocation made outside the pool.
    pub(crate) fn trim_memory_pool(&self) -> Result<()> {
        trim_pool(&self.ctx)
    }
    /// The stream every op of this device runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// Whether cuBLASLt's 1x128 x 128x128 block-scaled FP8 GEMM exists here (Hopper).
    pub fn has_fp8_block_scaling(&self) -> bool {
        self.cc == (9, 0)
    }
    /// Where compiled kernels are kept between runs (replaces `JET_KERNEL_CACHE_DIR`).
    pub fn set_kernel_store(&self, store: Arc<dyn KernelStore>) {
        *self.store.lock().unwrap() = Some(store);
    }

    /// The store set by [`Gpu::set_kernel_store`] or `JET_KERNEL_CACHE_DIR`, if any
    /// (it also keeps the GEMM algorithms chosen by timing: `gemm_tune`).
    pub(crate) fn kernel_store(&self) -> Option<Arc<dyn KernelStore>> {
        self.store.lock().unwrap().clone()
    }

    /// How many modules were compiled and how many came from the kernel store.
    pub fn kernel_stats(&self) -> KernelStats {
        *self.stats.lock().unwrap()
    }

    /// PCI (domain, bus, device) of this GPU: how NVML's numbering is matched
    /// with the driver's. None if the driver does not say.
    pub fn pci_location(&self) -> Option<(u32, u32, u32)> {
        use cudarc::driver::sys::CUdevice_attribute as A;
        let get = |a| self.ctx.attribute(a).ok().map(|v| v as u32);
        Some((
            get(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            get(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            get(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
        ))
    }

    /// Whether the batch-invariant forward GEMMs run on wgmma (see the field).
    pub fn wgmma(&self) -> bool {
        self.wgmma
    }

    /// The NVRTC target: `sm_90a` on Hopper (wgmma is an arch-specific feature;
    /// the image then runs on compute capability 9.0 only, which is this device).
    fn arch(&self) -> String {
        let a = if self.cc == (9, 0) { "a" } else { "" };
        format!("sm_{}{}{a}", self.cc.0, self.cc.1)
    }

    /// The module of `src`, compiled or taken from the caches.
    fn module(&self, src: &Source) -> Result<Arc<CudaModule>> {
        if let Some(m) = self.modules.lock().unwrap().get(src.name) {
            return Ok(m.clone());
        }
        let opts = options(&self.arch(), self.include.as_deref());
        let mut h = Sha256::new();
        for part in [COMMON, src.code, &opts.join(" ")] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        h.update(format!("nvrtc {}.{}", self.nvrtc.0, self.nvrtc.1).as_bytes());
        let key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        let store = self.store.lock().unwrap().clone();
        // A stored image that the driver refuses (truncated, another driver's) is
        // compiled again and replaced.
        let cached = store.as_ref().and_then(|s| s.load(&key));
        let m = match cached.and_then(|img| self.ctx.load_module(Ptx::from_binary(img)).ok()) {
            Some(m) => {
                self.stats.lock().unwrap().from_store += 1;
                m
            }
            None => {
                let img = compile_cubin(src, &opts)?;
                self.stats.lock().unwrap().compiled += 1;
                let m = self
                    .ctx
                    .load_module(Ptx::from_binary(img.clone()))
                    .ctx(&format!("loading module {}", src.name))?;
                if let Some(s) = &store {
                    s.save(&key, &img);
                }
                m
            }
        };
        self.modules.lock().unwrap().insert(src.name, m.clone());
        Ok(m)
    }

    pub(crate) fn function(&self, src: &Source, name: &'static str) -> Result<CudaFunction> {
        if let Some(f) = self.funcs.lock().unwrap().get(&(src.name, name)) {
            return Ok(f.clone());
        }
        let f = self
            .module(src)?
            .load_function(name)
            .ctx(&format!("finding kernel {name} in {}.cu", src.name))?;
        self.funcs
            .lock()
            .unwrap()
            .insert((src.name, name), f.clone());
        Ok(f)
    }

    /// Compile (or load) every module now, so that the first step does not pay for it.
    pub fn warm_up(&self) -> Result<()> {
        for s in SOURCES {
            self.module(s)?;
        }
        Ok(())
    }

    /// Launch `name` of `src`; an empty grid launches nothing.
    pub(crate) fn launch(
        &self,
        src: &Source,
        name: &'static str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_clustered(src, name, grid, block, smem, 1, args)
    }

    /// [`Gpu::launch`] in clusters of `cluster` blocks along x (`grid.0` a
    /// multiple of it; sm_90), whose blocks share distributed shared memory.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_clustered(
        &self,
        src: &Source,
        name: &'static str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        cluster: u32,
        args: &[Arg],
    ) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        super::ensure(cluster >= 1 && grid.0.is_multiple_of(cluster), || {
            format!(
                "launching {name}: a grid of {} blocks in clusters of {cluster}",
                grid.0
            )
        })?;
        let f = self.function(src, name)?;
        if smem > 48 * 1024 {
            let mut opted = self.smem_opt_in.lock().unwrap();
            if opted.get(&(src.name, name)).is_none_or(|&s| s < smem) {
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
                .ctx(&format!("allowing {name} {smem} bytes of shared memory"))?;
                opted.insert((src.name, name), smem);
            }
        }
        if self.pdl || cluster > 1 || args.iter().any(|a| matches!(a, Arg::T(_) | Arg::S(_))) {
            return self.span(super::profile::category(src.name, name), name, || {
                self.launch_ex(&f, (grid, block, smem), cluster, args)
                    .ctx(&format!("launching {name}"))
            });
        }
        let mut b = self.stream.launch_builder(&f);
        for a in args {
            match a {
                Arg::P(p) => b.arg(p),
                Arg::I(i) => b.arg(i),
                Arg::L(l) => b.arg(l),
                Arg::F(x) => b.arg(x),
                Arg::D(x) => b.arg(x),
                Arg::T(_) | Arg::S(_) => unreachable!("by-value structs launch through launch_ex"),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: block,
            shared_mem_bytes: smem,
        };
        // SAFETY: each caller passes the arguments its kernel declares, with buffer
        // lengths checked against the shapes first.
        self.span(super::profile::category(src.name, name), name, || {
            unsafe { b.launch(cfg) }
                .map(|_| ())
                .ctx(&format!("launching {name}"))
        })
    }

    /// `cuLaunchKernelEx`, with programmatic stream serialization allowed when PDL
    /// is on (the kernel may be scheduled while the stream's previous kernel
    /// finishes; its `pdl_entry` waits for that kernel's completion before touching
    /// memory). Takes any argument, tensor maps included.
    fn launch_ex(
        &self,
        f: &CudaFunction,
        (grid, block, smem): ((u32, u32, u32), (u32, u32, u32), u32),
        cluster: u32,
        args: &[Arg],
    ) -> std::result::Result<(), cudarc::driver::DriverError> {
        use cudarc::driver::sys;
        use std::ffi::c_void;
        let mut params: Vec<*mut c_void> = args
            .iter()
            .map(|a| match a {
                Arg::P(p) => p as *const u64 as *mut c_void,
                Arg::I(i) => i as *const i32 as *mut c_void,
                Arg::L(l) => l as *const i64 as *mut c_void,
                Arg::F(x) => x as *const f32 as *mut c_void,
                Arg::D(x) => x as *const f64 as *mut c_void,
                Arg::T(m) => m as *const super::tma::TensorMap as *mut c_void,
                Arg::S(v) => v.as_ptr() as *mut c_void,
            })
            .collect();
        // SAFETY: a zeroed attribute is valid; ids and values are set below.
        let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
        attrs[0].id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[0].value.programmaticStreamSerializationAllowed = self.pdl as i32;
        attrs[1].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attrs[1].value.clusterDim.x = cluster;
        attrs[1].value.clusterDim.y = 1;
        attrs[1].value.clusterDim.z = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block.0,
            blockDimY: block.1,
            blockDimZ: block.2,
            sharedMemBytes: smem,
            hStream: self.stream.cu_stream(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: if cluster > 1 { 2 } else { 1 },
        };
        self.ctx.bind_to_thread()?;
        // SAFETY: `params` points at the argument values, which outlive the call;
        // each caller passes the arguments its kernel declares (see `launch`).
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
    }

    /// The device address of a buffer (one stream, so no events to record).
    pub(crate) fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        s.device_ptr(&self.stream).0
    }

    /// [`Gpu::ptr`] for other crates: an address to compare, not to use.
    pub fn device_ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        self.ptr(s)
    }

    /// A zeroed device buffer of `n` values.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
        self.or_trim(|| self.stream.alloc_zeros(n))
    }

    /// Run an allocation; if the device is out of memory, hand the pool's cached
    /// memory back to the driver (see `keep_pool_memory`) and try once more.
    fn or_trim<T>(
        &self,
        alloc: impl Fn() -> std::result::Result<T, cudarc::driver::DriverError>,
    ) -> Result<T> {
        use cudarc::driver::sys::CUresult;
        match alloc() {
            Err(e) if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                // Not while capturing a graph: nothing may synchronise then.
                if self.capturing() {
                    return Err(e).ctx("allocating device memory");
                }
                self.sync()?;
                trim_pool(&self.ctx)?;
                alloc().ctx("allocating device memory (after trimming the pool)")
            }
            r => r.ctx("allocating device memory"),
        }
    }

    /// A device buffer of `n` values that the caller's kernel writes in full.
    pub(crate) fn uninit<T: DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>> {
        // SAFETY: callers write every element before anything reads it.
        self.or_trim(|| unsafe { self.stream.alloc(n.max(1)) })
    }

    /// Copy host values to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, x: &[T]) -> Result<CudaSlice<T>> {
        if x.is_empty() {
            return self.uninit(1);
        }
        self.stream.clone_htod(x).ctx("copying to the device")
    }

    /// Set every byte of `dst` to `v` (stream-ordered, from no host buffer).
    pub(crate) fn fill_bytes(&self, dst: &mut CudaSlice<u8>, v: u8) -> Result<()> {
        let n = dst.len();
        if n == 0 {
            return Ok(());
        }
        // A raw driver call: the context must be this thread's, as cudarc's own
        // calls make it.
        self.ctx.bind_to_thread().ctx("binding the device")?;
        let (p, _sync) = dst.device_ptr_mut(&self.stream);
        // SAFETY: `p` addresses the `n` bytes of a live allocation used on this
        // stream, and any byte is a valid `u8`.
        unsafe { cudarc::driver::result::memset_d8_async(p, v, n, self.stream.cu_stream()) }
            .ctx("setting device memory")
    }

    /// Overwrite the first `src.len()` values of the device buffer `dst` with
    /// `src` (stream-ordered; `src` is staged before this returns).
    pub fn write<T: DeviceRepr>(&self, dst: &mut CudaSlice<T>, src: &[T]) -> Result<()> {
        super::ensure(src.len() <= dst.len(), || {
            format!(
                "writing {} values into a buffer of {}",
                src.len(),
                dst.len()
            )
        })?;
        if src.is_empty() {
            return Ok(());
        }
        self.stream
            .memcpy_htod(src, &mut dst.slice_mut(..src.len()))
            .ctx("copying to the device")
    }

    /// Copy the first `n` values of `src` into `dst` on the device.
    pub fn copy_into<T: DeviceRepr>(
        &self,
        src: &CudaSlice<T>,
        dst: &mut CudaSlice<T>,
        n: usize,
    ) -> Result<()> {
        self.copy_into_at(src, dst, 0, n)
    }

    /// Copy the first `n` values of `src` into `dst[at..at + n]` on the device
    /// (stream-ordered: a pass gathers its micro-batches' results so).
    pub fn copy_into_at<T: DeviceRepr>(
        &self,
        src: &CudaSlice<T>,
        dst: &mut CudaSlice<T>,
        at: usize,
        n: usize,
    ) -> Result<()> {
        super::ensure(
            n <= src.len() && at.checked_add(n).is_some_and(|end| end <= dst.len()),
            || {
                format!(
                    "copying {n} values from a buffer of {} into one of {} at {at}",
                    src.len(),
                    dst.len()
                )
            },
        )?;
        if n == 0 {
            return Ok(());
        }
        self.stream
            .memcpy_dtod(&src.slice(..n), &mut dst.slice_mut(at..at + n))
            .ctx("copying on the device")
    }

    /// Copy the first `n` values of a device buffer to the host (waits for the stream).
    pub fn download_n<T: DeviceRepr + Default + Clone>(
        &self,
        x: &CudaSlice<T>,
        n: usize,
    ) -> Result<Vec<T>> {
        super::ensure(n <= x.len(), || {
            format!("download of {n} values from a buffer of {}", x.len())
        })?;
        let mut out = vec![T::default(); n];
        if n > 0 {
            self.stream
                .memcpy_dtoh(&x.slice(..n), &mut out)
                .ctx("copying to the host")?;
        }
        self.sync()?;
        Ok(out)
    }

    /// Copy a whole device buffer to the host.
    pub fn download<T: DeviceRepr + Default + Clone>(&self, x: &CudaSlice<T>) -> Result<Vec<T>> {
        self.download_n(x, x.len())
    }

    /// Wait for every queued op; reports asynchronous kernel faults.
    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().ctx("waiting for the stream")
    }
}
