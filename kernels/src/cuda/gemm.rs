//! cuBLASLt GEMMs through cudarc's `result`/`sys` layers (the safe wrapper has no FP8).
//!
//! cuBLASLt is column-major. A row-major `Y [P][Q]` is the column-major `Q x P`
//! matrix, so `Y = A B^T` with both operands K-contiguous (`A [P, K]`, `B [Q, K]`)
//! is the TN call `m = Q, n = P`, cuBLASLt's A = `B` (TRANSA = T), its B = `A`
//! (TRANSB = N). FP8 exists only in that TN form; BF16 and F32 take any transposes.
//!
//! FP8: E4M3 operands, `CUBLAS_COMPUTE_32F`, f32 scale type, f32 output, no fast
//! accumulation. Scale modes VEC128_32F (one scale per 1x128 along K) and
//! BLK128x128_32F; VEC x BLK, BLK x VEC and VEC x VEC are allowed, BLK x BLK is not.
//! Layouts are those of [`super::quantize`].

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublaslt::{result, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

pub use super::gemm_tune::Tuned;
use super::gemm_tune::{self, Problem};
use super::quantize::Fp8Quantized;
use super::{ensure, Ctx, CudaError, Gpu, Result};
use crate::fp8::Grouping;

/// cuBLASLt's recommended workspace on Hopper.
const WORKSPACE: usize = 32 << 20;

/// Element type of a GEMM operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LtType {
    F32,
    Bf16,
    E4M3,
}

/// How an E4M3 operand is scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LtScale {
    None,
    Vec128,
    Blk128,
}

/// One operand as cuBLASLt sees it: column-major storage with leading dimension
/// `ld`, transposed or not, at device address `ptr`.
#[derive(Clone, Copy, Debug)]
pub struct LtOperand {
    pub ptr: u64,
    pub ty: LtType,
    pub trans: bool,
    pub ld: usize,
    pub scale: LtScale,
    pub scale_ptr: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    mnk: (usize, usize, usize),
    a: (LtType, bool, usize, LtScale),
    b: (LtType, bool, usize, LtScale),
    d: (LtType, usize),
}

struct Inner {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    algos: HashMap<Key, sys::cublasLtMatmulAlgo_t>,
    /// What timing chose, a problem each, in the order they were met.
    tuned: Vec<Tuned>,
    /// Each size class's algorithm ([`bucket`]), chosen at its first problem.
    by_class: HashMap<Key, sys::cublasLtMatmulAlgo_t>,
}

// SAFETY: the handle is used only under the Mutex, on the Gpu's one stream.
unsafe impl Send for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: created in LtState::new, destroyed once.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}

/// The cuBLASLt handle, its workspace and the chosen algorithms of each shape.
pub(crate) struct LtState(Mutex<Inner>);

impl LtState {
    pub(crate) fn new(stream: &std::sync::Arc<CudaStream>) -> Result<LtState> {
        let handle = result::create_handle().ctx("creating the cuBLASLt handle")?;
        let workspace = stream
            .alloc_zeros::<u8>(WORKSPACE)
            .ctx("allocating the cuBLASLt workspace")?;
        Ok(LtState(Mutex::new(Inner {
            handle,
            workspace,
            algos: HashMap::new(),
            tuned: Vec::new(),
            by_class: HashMap::new(),
        })))
    }
}

fn data_type(t: LtType) -> sys::cudaDataType {
    match t {
        LtType::F32 => sys::cudaDataType::CUDA_R_32F,
        LtType::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        LtType::E4M3 => sys::cudaDataType::CUDA_R_8F_E4M3,
    }
}

/// Descriptors destroyed on every exit path.
struct Descs {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: Vec<sys::cublasLtMatrixLayout_t>,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: each was created once below.
        unsafe {
            for &l in &self.layouts {
                let _ = result::destroy_matrix_layout(l);
            }
            let _ = result::destroy_matmul_desc(self.desc);
        }
    }
}

fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<()> {
    // SAFETY: v is a live value of the size the attribute takes.
    unsafe {
        result::set_matmul_desc_attribute(
            desc,
            attr,
            v as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    }
    .ctx(&format!("setting {attr:?}"))
}

/// `D [m x n] (column-major, f32, ldd) = op(A) [m x k] op(B) [k x n]`.
pub fn lt_matmul(
    gpu: &Gpu,
    mnk: (usize, usize, usize),
    a: LtOperand,
    b: LtOperand,
    d: u64,
    ldd: usize,
) -> Result<()> {
    lt_matmul_to(gpu, mnk, a, b, (d, ldd, LtType::F32))
}

/// [`lt_matmul`] with D of type `dty` (f32, or BF16: the f32 accumulation rounded
/// to nearest even by cuBLASLt's epilogue).
pub fn lt_matmul_to(
    gpu: &Gpu,
    (m, n, k): (usize, usize, usize),
    a: LtOperand,
    b: LtOperand,
    (d, ldd, dty): (u64, usize, LtType),
) -> Result<()> {
    ensure(matches!(dty, LtType::F32 | LtType::Bf16), || {
        format!("GEMM output type {dty:?}: f32 or BF16 only")
    })?;
    use sys::cublasLtMatmulDescAttributes_t as A;
    ensure(m > 0 && n > 0 && k > 0, || {
        format!("empty GEMM {m}x{n}x{k}")
    })?;
    gpu.context().bind_to_thread().ctx("binding the device")?;
    let mut lt = gpu.lt.0.lock().unwrap();
    let desc = result::create_matmul_desc(
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        sys::cudaDataType::CUDA_R_32F,
    )
    .ctx("creating a matmul descriptor")?;
    let mut ds = Descs {
        desc,
        layouts: Vec::new(),
    };
    set_desc(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &(a.trans as i32))?;
    set_desc(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &(b.trans as i32))?;
    for (op, ptr_attr, mode_attr) in [
        (
            &a,
            A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
            A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
        ),
        (
            &b,
            A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
            A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
        ),
    ] {
        let mode = match op.scale {
            LtScale::None => continue,
            LtScale::Vec128 => {
                sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
            }
            LtScale::Blk128 => {
                sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
            }
        };
        set_desc(desc, ptr_attr, &op.scale_ptr)?;
        set_desc(desc, mode_attr, &(mode as i32))?;
    }
    let shape = |op: &LtOperand, rows: usize, cols: usize| {
        if op.trans {
            (cols, rows)
        } else {
            (rows, cols)
        }
    };
    let (ar, ac) = shape(&a, m, k);
    let (br, bc) = shape(&b, k, n);
    for (ty, r, c, ld) in [(a.ty, ar, ac, a.ld), (b.ty, br, bc, b.ld), (dty, m, n, ldd)] {
        let l = result::create_matrix_layout(data_type(ty), r as u64, c as u64, ld as i64)
            .ctx("creating a matrix layout")?;
        ds.layouts.push(l);
    }
    let (la, lb, lc) = (ds.layouts[0], ds.layouts[1], ds.layouts[2]);
    let key = Key {
        mnk: (m, n, k),
        a: (a.ty, a.trans, a.ld, a.scale),
        b: (b.ty, b.trans, b.ld, b.scale),
        d: (dty, ldd),
    };
    let problem = Problem {
        handle: lt.handle,
        desc,
        layouts: [la, lb, lc],
        a: a.ptr,
        b: b.ptr,
        d,
        workspace: (lt.workspace.device_ptr(gpu.stream()).0, WORKSPACE),
        stream: gpu.stream().cu_stream() as sys::cudaStream_t,
    };
    let algo = match lt.algos.get(&key).copied() {
        Some(al) => al,
        None => {
            // A problem not met before takes its size class's algorithm where
            // cuBLASLt accepts it for this problem, so that a run whose token counts
            // change every step (RL responses end at random lengths) times
            // candidates once a class, not once a length.
            let class = bucket(&key);
            let tuning = gemm_tune::tuning_on();
            let class_algo = match tuning {
                true => lt.by_class.get(&class).copied(),
                false => None,
            };
            let algo = match class_algo.filter(|al| problem.accepts(al)) {
                Some(al) => al,
                None => {
                    let names = (format!("{class:?}"), format!("{key:?}"));
                    let chosen = gemm_tune::choose(gpu, &problem, (&names.0, &names.1));
                    let (algo, timed) = chosen.map_err(|e| {
                        let shape = format!(
                            "finding an algorithm for {m}x{n}x{k} ({:?} x {:?}, scales {:?} x {:?})",
                            a.ty, b.ty, a.scale, b.scale
                        );
                        within(e, &shape)
                    })?;
                    // The class's first problem names its algorithm; one its
                    // algorithm did not fit keeps its own choice without replacing
                    // the class's.
                    if tuning && class_algo.is_none() {
                        lt.by_class.insert(class, algo);
                    }
                    lt.tuned.extend(timed);
                    algo
                }
            };
            lt.algos.insert(key, algo);
            algo
        }
    };
    gpu.span("gemm", "cublasLt matmul", || {
        problem
            .run(&algo)
            .map_err(|e| within(e, &format!("running a {m}x{n}x{k} matmul")))
    })
}

/// A size up to 1,024 rounded up to a power of two, a larger one to a multiple of
/// 1,024: the classes of problems that share a timed algorithm.
fn size_class(x: usize) -> usize {
    if x <= 1024 {
        x.next_power_of_two()
    } else {
        x.next_multiple_of(1024)
    }
}

/// `k`'s size class: every size and stride through [`size_class`].
fn bucket(k: &Key) -> Key {
    let c = size_class;
    Key {
        mnk: (c(k.mnk.0), c(k.mnk.1), c(k.mnk.2)),
        a: (k.a.0, k.a.1, c(k.a.2), k.a.3),
        b: (k.b.0, k.b.1, c(k.b.2), k.b.3),
        d: (k.d.0, c(k.d.1)),
    }
}

/// `e` with what it happened within prefixed to its "while".
fn within(e: CudaError, outer: &str) -> CudaError {
    match e {
        CudaError::Blas { what, err } => CudaError::Blas {
            what: format!("{outer}, {what}"),
            err,
        },
        CudaError::Driver { what, err } => CudaError::Driver {
            what: format!("{outer}, {what}"),
            err,
        },
        other => other,
    }
}

/// The GEMM problems whose cuBLASLt algorithm this process chose by timing
/// (`gemm_tune`), with the heuristic's first pick's time and the chosen one's.
pub fn tuned(gpu: &Gpu) -> Vec<Tuned> {
    gpu.lt.0.lock().unwrap().tuned.clone()
}

/// The VEC128 or BLK128x128 operand of a quantized matrix, K-contiguous and
/// transposed for cuBLASLt's A, or plain for its B.
fn fp8_operand(gpu: &Gpu, q: &Fp8Quantized, trans: bool) -> LtOperand {
    LtOperand {
        ptr: gpu.ptr(&q.codes),
        ty: LtType::E4M3,
        trans,
        ld: q.inner_pad(),
        scale: if q.grouping == Grouping::Block128 {
            LtScale::Blk128
        } else {
            LtScale::Vec128
        },
        scale_ptr: gpu.ptr(&q.scales),
    }
}

/// What cuBLASLt's block-scaled FP8 GEMM needs of the device and the operands.
fn fp8_checks(gpu: &Gpu, a: &Fp8Quantized, b: &Fp8Quantized) -> Result<()> {
    ensure(gpu.has_fp8_block_scaling(), || {
        format!(
            "the block-scaled FP8 GEMM needs a Hopper GPU (compute capability 9.0); {} is {}.{}",
            gpu.name(),
            gpu.compute_capability().0,
            gpu.compute_capability().1
        )
    })?;
    ensure(
        a.inner_pad() == b.inner_pad() && a.inner() == b.inner(),
        || format!("FP8 GEMM: contraction {} vs {}", a.inner(), b.inner()),
    )?;
    ensure(
        !(a.grouping == Grouping::Block128 && b.grouping == Grouping::Block128),
        || "FP8 GEMM: cuBLASLt has no 128x128 x 128x128 block scaling".into(),
    )
}

/// `Y [P_pad][Q_pad] (row-major f32, row stride Q_pad) = A [P, K] B [Q, K]^T` on
/// quantized K-contiguous operands: the forward (`A` = X 1x128, `B` = W blocks),
/// DGrad (`A` = dY 1x128, `B` = W^T blocks) and WGrad (`A` = dY^T, `B` = X^T,
/// both 128x1). Rows past P and columns past Q are padding.
pub fn fp8_gemm_nt_into(
    gpu: &Gpu,
    a: &Fp8Quantized,
    b: &Fp8Quantized,
    y: &mut CudaSlice<f32>,
) -> Result<()> {
    fp8_checks(gpu, a, b)?;
    let (p, q) = (a.outer_pad(), b.outer_pad());
    ensure(y.len() >= p * q, || {
        format!(
            "FP8 GEMM output holds {} values, fewer than {p}x{q}",
            y.len()
        )
    })?;
    let yp = gpu.ptr(y);
    lt_matmul(
        gpu,
        (q, p, a.inner_pad()),
        fp8_operand(gpu, b, true),
        fp8_operand(gpu, a, false),
        yp,
        q,
    )
}

/// [`fp8_gemm_nt_into`] with a BF16 output (`[P_pad][Q_pad]` BF16 bits, row
/// stride Q_pad): the backward's GEMMs, whose gradients are BF16.
pub fn fp8_gemm_nt_bf16(
    gpu: &Gpu,
    a: &Fp8Quantized,
    b: &Fp8Quantized,
) -> Result<(CudaSlice<u16>, usize)> {
    fp8_checks(gpu, a, b)?;
    let (p, q) = (a.outer_pad(), b.outer_pad());
    let y = gpu.uninit::<u16>(p * q)?;
    let (fa, fb) = (fp8_operand(gpu, b, true), fp8_operand(gpu, a, false));
    let out = (gpu.ptr(&y), q, LtType::Bf16);
    lt_matmul_to(gpu, (q, p, a.inner_pad()), fa, fb, out)?;
    Ok((y, q))
}

/// [`fp8_gemm_nt_into`] into a new buffer; returns it with its row stride.
pub fn fp8_gemm_nt(
    gpu: &Gpu,
    a: &Fp8Quantized,
    b: &Fp8Quantized,
) -> Result<(CudaSlice<f32>, usize)> {
    let mut y = gpu.uninit::<f32>(a.outer_pad() * b.outer_pad())?;
    fp8_gemm_nt_into(gpu, a, b, &mut y)?;
    Ok((y, b.outer_pad()))
}

/// A row-major dense matrix for [`dense_gemm`]: `rows x cols` with row stride `ld`.
#[derive(Clone, Copy, Debug)]
pub struct Dense {
    pub ptr: u64,
    pub ty: LtType,
    pub rows: usize,
    pub cols: usize,
    pub ld: usize,
}

/// `Y [P, Q] (row-major f32, stride ldy) = op(A) op(B)` with `op` a transpose when
/// asked: A is `[P, K]` (or `[K, P]` with `ta`), B is `[K, Q]` (or `[Q, K]` with `tb`).
/// F32 or BF16 operands (both the same type), f32 accumulation.
pub fn dense_gemm(
    gpu: &Gpu,
    a: Dense,
    ta: bool,
    b: Dense,
    tb: bool,
    y: u64,
    ldy: usize,
) -> Result<()> {
    dense_gemm_to(gpu, (a, ta), (b, tb), (y, ldy, LtType::F32))
}

/// [`dense_gemm`] with Y of type `yty` (f32, or BF16: rounded by cuBLASLt).
pub fn dense_gemm_to(
    gpu: &Gpu,
    (a, ta): (Dense, bool),
    (b, tb): (Dense, bool),
    (y, ldy, yty): (u64, usize, LtType),
) -> Result<()> {
    let (p, ka) = if ta {
        (a.cols, a.rows)
    } else {
        (a.rows, a.cols)
    };
    let (kb, q) = if tb {
        (b.cols, b.rows)
    } else {
        (b.rows, b.cols)
    };
    ensure(ka == kb && a.ty == b.ty && a.ty != LtType::E4M3, || {
        format!(
            "dense GEMM: [{p}, {ka}] x [{kb}, {q}] of {:?} and {:?}",
            a.ty, b.ty
        )
    })?;
    // Row-major Y = A B is column-major Y^T = B^T A^T: cuBLASLt's A is our B.
    // A row-major [r][c] buffer is the column-major c x r matrix, i.e. already
    // transposed, so cuBLASLt's flag is the negation of ours.
    let op = |x: Dense, t: bool| LtOperand {
        ptr: x.ptr,
        ty: x.ty,
        trans: t,
        ld: x.ld,
        scale: LtScale::None,
        scale_ptr: 0,
    };
    lt_matmul_to(gpu, (q, p, ka), op(b, tb), op(a, ta), (y, ldy, yty))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_share_algorithms_by_power_of_two_then_by_1024() {
        let c = size_class;
        assert_eq!((c(1), c(8), c(9), c(200), c(1024)), (1, 8, 16, 256, 1024));
        assert_eq!(
            (c(1025), c(2048), c(20029), c(151936)),
            (2048, 2048, 20480, 152576)
        );
        // Two token counts of one class share a key; the types and transposes stay.
        let k = |m| Key {
            mnk: (1024, m, 3072),
            a: (LtType::E4M3, true, 3072, LtScale::Vec128),
            b: (LtType::E4M3, false, 3072, LtScale::Vec128),
            d: (LtType::Bf16, 1024),
        };
        assert_eq!(bucket(&k(19_500)), bucket(&k(20_029)));
        assert_ne!(bucket(&k(19_000)), bucket(&k(20_029)));
        assert_eq!(bucket(&k(20_029)).a.0, LtType::E4M3);
    }
}
