//! The CUDA path: the same numbers as the CPU reference, on an NVIDIA GPU.
//!
//! Host code is cudarc with dynamic loading, so this module builds everywhere and
//! finds `libcuda`, `libnvrtc` and `libcublasLt` at run time: [`cuda_available`]
//! probes each one first and returns a [`CudaError::Unavailable`] naming what is
//! missing, never a panic. Kernels are `.cu` sources compiled by NVRTC on first use
//! (cached by sha256 of source, architecture and NVRTC version).
//!
//! Layout convention, as on the CPU: row-major device buffers of `f32`
//! (`CudaSlice<f32>`) with the shape in the arguments. BF16 and E4M3 copies exist
//! only as GEMM operands, padded to the alignment cuBLASLt needs (see [`quantize`]).
//!
//! What runs where:
//! - [`quantize`]: E4M3 quantization 1x128, 128x1 (transposed, for WGrad) and
//!   128x128 blocks, bit-exact with `fp8::Fp8Matrix::quantize`.
//! - [`gemm`]: cuBLASLt GEMMs (F32, BF16, FP8 VEC128 x BLK128x128).
//! - [`gemv`]: the decode-sized FP8 GEMM that reads the weight bytes directly.
//! - [`linear`]: the linear layer per [`crate::GemmPrecision`], forward and backward.
//! - [`act`]: layer outputs kept as their BF16 values where the flow rounds them
//!   so (gate, up, the logits of a training forward): half the bytes, same bits.
//! - [`ops`], [`attention`], [`logsoftmax`]: the other ops, forward and backward.
//! - [`policy_loss`]: the GRPO loss of each scored token and its gradient, in f64
//!   as the host's `rl::loss::token_loss` (no host round trip inside a pass).
//! - [`tensor`]: element-wise glue, row gather/scatter, deterministic sum of squares.
//! - [`adamw`]: the AdamW step, bit-exact with [`adamw::adamw_reference`].
//! - [`grad`]: a gradient accumulator whose last BF16 WGrad output its readers add.
//! - [`sample`]: greedy and Gumbel-max token sampling, as [`sample::sample_reference`];
//!   [`draw`]: the plain tempered draw by inverse CDF, as [`draw::draw_reference`].
//! - [`graph`]: CUDA graphs (the decode step captured once, replayed per token).
//! - [`pinned`]: page-locked host buffers for the decode loop's copies, which the
//!   host enqueues without waiting for the stream.

pub mod act;
pub mod adamw;
pub mod attention;
mod context;
pub mod draw;
pub mod flash;
pub mod gemm;
mod gemm_tune;
pub mod gemv;
pub mod gemv_bf16;
pub mod grad;
pub mod graph;
pub mod linear;
pub mod logsoftmax;
pub mod ops;
pub mod part;
pub mod pinned;
pub mod policy_loss;
pub mod profile;
pub mod quantize;
pub mod row_map;
pub mod sample;
pub mod sample_top;
pub mod tensor;
mod tma;
pub mod vmm;

pub use context::{
    compile_all_sources, cuda_available, cuda_device, cuda_device_count, DirKernelStore, Gpu,
    KernelStats, KernelStore,
};

use std::fmt::Display;

/// Everything that can go wrong on the CUDA path, with context.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// CUDA cannot be used here: a library or the device is missing.
    #[error("{0}")]
    Unavailable(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver error while {what}: {err}")]
    Driver { what: String, err: String },
    /// NVRTC rejected a kernel source.
    #[error("NVRTC could not compile {module}.cu: {log}")]
    Compile { module: String, log: String },
    /// A cuBLASLt call failed.
    #[error("cuBLASLt error while {what}: {err}")]
    Blas { what: String, err: String },
    /// Arguments that do not fit together (shapes, lengths, tokens out of range).
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, CudaError>;

/// Attach "while doing what" to a driver or cuBLASLt error.
pub(crate) trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T>;
}

impl<T> Ctx<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn ctx(self, what: &str) -> Result<T> {
        self.map_err(|e| CudaError::Driver {
            what: what.to_string(),
            err: e.to_string(),
        })
    }
}

impl<T> Ctx<T> for std::result::Result<T, cudarc::cublaslt::result::CublasError> {
    fn ctx(self, what: &str) -> Result<T> {
        self.map_err(|e| CudaError::Blas {
            what: what.to_string(),
            err: e.to_string(),
        })
    }
}

/// A measurement switch read from the environment: on unless `var` is `0` (the
/// kernels' alternative forms kept side by side, each the same bits, so one binary
/// can time both). Callers cache it (a `OnceLock`): it is read on hot paths.
pub fn switch_on(var: &str) -> bool {
    std::env::var(var).map_or(true, |v| v.trim() != "0")
}

/// `Err(CudaError::Invalid)` unless `cond`.
pub(crate) fn ensure(cond: bool, msg: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(CudaError::Invalid(msg()))
    }
}

/// Check that a device buffer holds at least `need` values.
pub(crate) fn check_len<T>(
    what: &str,
    buf: &cudarc::driver::CudaSlice<T>,
    need: usize,
    shape: impl Display,
) -> Result<()> {
    ensure(buf.len() >= need, || {
        format!(
            "{what} holds {} values, fewer than {need} for {shape}",
            buf.len()
        )
    })
}

/// Round up to a multiple of 16: the padding of every GEMM operand dimension
/// (16-byte rows of E4M3; M and N multiples of 4 for the block-scaled GEMM).
pub const fn pad16(x: usize) -> usize {
    x.div_ceil(16) * 16
}
