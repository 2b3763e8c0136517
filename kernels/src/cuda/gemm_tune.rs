//! Which cuBLASLt algorithm a GEMM shape runs: its heuristic's candidates timed
//! on the device at the first call of the shape's size class (`gemm.rs` `bucket`:
//! sizes to powers of two up to 1,024, then to multiples of 1,024; the class's
//! algorithm serves its other shapes where cuBLASLt accepts it), the fastest kept
//! for the process and, where the GPU has a [`KernelStore`], between runs.
//!
//! Why time them: the heuristic's first pick is not the fastest at every shape. At
//! Qwen3-0.6B's FP8 WGrad of the down projection (`dw [1024, 3072]`, K = 4,096
//! tokens) it ran at 570 TFLOP/s where the same FLOPs in gate/up's orientation ran
//! at 800 (H100, fifty-second session), and no shape rule carries to other GPUs or
//! cuBLASLt versions; timing the candidates does.
//!
//! Bits: algorithms may add a dot product's terms in different orders, so a shape's
//! algorithm is fixed at its first call and kept. Every later call in the process
//! runs the same algorithm, and with a store a later run loads the choice instead
//! of timing again, so a run resumed on the same GPU adds in the same order. `JET_GEMM_TUNE=0`
//! takes the heuristic's first pick without timing (the behaviour before tuning).
//! While a CUDA graph is being captured nothing may synchronise, so a shape first
//! met there takes the first pick too.

use std::ffi::c_void;

use cudarc::cublaslt::sys;
use cudarc::driver::sys::CUevent_flags;
use sha2::{Digest, Sha256};

use super::{Ctx, Gpu, Result};

/// How many of the heuristic's candidates are timed.
const CANDIDATES: usize = 8;
/// Timed runs a candidate (after one untimed): the fastest counts.
const RUNS: usize = 3;
/// A candidate replaces the heuristic's first pick only when it runs in at most
/// this share of the first pick's time, so that timing noise between near-equal
/// algorithms does not decide the choice.
const MARGIN: f32 = 0.97;

/// Whether candidates are timed (`JET_GEMM_TUNE`, on unless "0"; read once).
pub(crate) fn tuning_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| super::switch_on("JET_GEMM_TUNE"))
}

/// One GEMM as cuBLASLt runs it: everything but the algorithm.
pub(crate) struct Problem {
    pub handle: sys::cublasLtHandle_t,
    pub desc: sys::cublasLtMatmulDesc_t,
    /// A, B and C = D layouts.
    pub layouts: [sys::cublasLtMatrixLayout_t; 3],
    pub a: u64,
    pub b: u64,
    pub d: u64,
    pub workspace: (u64, usize),
    pub stream: sys::cudaStream_t,
}

impl Problem {
    /// `D = A B` (alpha 1, beta 0) with `algo`, queued on the stream.
    pub(crate) fn run(&self, algo: &sys::cublasLtMatmulAlgo_t) -> Result<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let [la, lb, lc] = self.layouts;
        // SAFETY: the caller built the descriptors and layouts for these device
        // buffers, whose lengths it checked; the stream is the Gpu's.
        unsafe {
            cudarc::cublaslt::result::matmul(
                self.handle,
                self.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                self.a as *const c_void,
                la,
                self.b as *const c_void,
                lb,
                self.d as *const c_void,
                lc,
                self.d as *mut c_void,
                lc,
                algo,
                self.workspace.0 as *mut c_void,
                self.workspace.1,
                self.stream,
            )
        }
        .ctx("running a matmul")
    }

    /// Up to `n` of the heuristic's candidates that fit the workspace, its first
    /// pick first.
    fn candidates(&self, n: usize) -> Result<Vec<sys::cublasLtMatmulAlgo_t>> {
        /// The preference, destroyed on every exit path.
        struct Pref(sys::cublasLtMatmulPreference_t);
        impl Drop for Pref {
            fn drop(&mut self) {
                // SAFETY: created once below.
                let _ = unsafe { cudarc::cublaslt::result::destroy_matmul_pref(self.0) };
            }
        }
        let pref = Pref(
            cudarc::cublaslt::result::create_matmul_pref().ctx("creating a matmul preference")?,
        );
        let ws = self.workspace.1 as u64;
        // SAFETY: a live u64 for the workspace-size attribute.
        unsafe {
            cudarc::cublaslt::result::set_matmul_pref_attribute(
                pref.0,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                8,
            )
        }
        .ctx("setting the workspace size")?;
        let [la, lb, lc] = self.layouts;
        // SAFETY: a plain C struct; zero is a valid bit pattern for it.
        let mut res: Vec<sys::cublasLtMatmulHeuristicResult_t> =
            vec![unsafe { std::mem::zeroed() }; n];
        let mut count = 0i32;
        // SAFETY: res holds n results; the descriptors are live.
        unsafe {
            sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                self.desc,
                la,
                lb,
                lc,
                lc,
                pref.0,
                n as i32,
                res.as_mut_ptr(),
                &mut count,
            )
        }
        .result()
        .ctx("asking cuBLASLt for algorithms")?;
        let out: Vec<_> = res
            .iter()
            .take(count.max(0) as usize)
            .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|r| r.algo)
            .collect();
        if out.is_empty() {
            return Err(cudarc::cublaslt::result::CublasError(
                sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
            ))
            .ctx("cuBLASLt has no algorithm");
        }
        Ok(out)
    }

    /// Whether cuBLASLt accepts `algo` for this problem (a stored choice from
    /// another cuBLASLt build may not be).
    pub(crate) fn accepts(&self, algo: &sys::cublasLtMatmulAlgo_t) -> bool {
        let [la, lb, lc] = self.layouts;
        // SAFETY: as candidates'.
        let mut r: sys::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        let st = unsafe {
            sys::cublasLtMatmulAlgoCheck(self.handle, self.desc, la, lb, lc, lc, algo, &mut r)
        };
        st == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && r.workspaceSize <= self.workspace.1
    }
}

/// What timing chose for one GEMM problem ([`super::gemm::tuned`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Tuned {
    /// The problem: shape, operand types, transposes, strides and scales.
    pub what: String,
    /// Candidates timed.
    pub candidates: usize,
    /// The heuristic's first pick's time, microseconds (fastest of its runs).
    pub first_us: f32,
    /// The chosen one's index among the candidates (0: the first pick) and time.
    pub chosen: usize,
    pub chosen_us: f32,
}

/// The fastest of `cands` on the device, each run once untimed and then [`RUNS`]
/// times; a candidate that fails to run is left out. The first stays unless
/// another takes at most [`MARGIN`] of its time.
fn fastest(
    gpu: &Gpu,
    p: &Problem,
    cands: &[sys::cublasLtMatmulAlgo_t],
    what: &str,
) -> Result<Tuned> {
    let new = || {
        gpu.context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .ctx("creating a timing event")
    };
    // (candidate, start, end) of every timed run, read after one synchronise.
    let mut runs = Vec::with_capacity(cands.len() * RUNS);
    for (i, algo) in cands.iter().enumerate() {
        if p.run(algo).is_err() {
            continue;
        }
        for _ in 0..RUNS {
            let (s, e) = (new()?, new()?);
            s.record(gpu.stream()).ctx("recording a timing event")?;
            p.run(algo)?;
            e.record(gpu.stream()).ctx("recording a timing event")?;
            runs.push((i, s, e));
        }
    }
    gpu.stream()
        .synchronize()
        .ctx("waiting for the timed GEMMs")?;
    let mut best = vec![f32::INFINITY; cands.len()];
    for (i, s, e) in &runs {
        let ms = s.elapsed_ms(e).ctx("reading timing events")?;
        best[*i] = best[*i].min(ms);
    }
    let pick = pick(&best);
    let first = best[0];
    Ok(Tuned {
        what: what.to_string(),
        candidates: cands.len(),
        first_us: first * 1e3,
        chosen: pick,
        chosen_us: best[pick] * 1e3,
    })
}

/// The candidate to keep from each one's best time (infinite: it failed to run):
/// the first (the heuristic's pick) unless another takes at most [`MARGIN`] of its
/// time, then the fastest of those.
fn pick(best: &[f32]) -> usize {
    let mut pick = 0;
    for (i, &t) in best.iter().enumerate().skip(1) {
        if t <= best[0] * MARGIN && t < best[pick] {
            pick = i;
        }
    }
    pick
}

/// The store's key for a problem described by `what` (the shape, types, transposes
/// and strides) on this GPU and cuBLASLt build.
fn store_key(gpu: &Gpu, what: &str) -> String {
    let mut h = Sha256::new();
    // SAFETY: a plain query of the loaded library.
    let ver = unsafe { sys::cublasLtGetVersion() };
    let (ma, mi) = gpu.compute_capability();
    for part in [
        "cublasLt algorithm v1",
        &ver.to_string(),
        gpu.name(),
        &format!("{ma}.{mi}"),
        what,
    ] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The algorithm for `p`: the stored choice of its size class (`names.0`) or, where
/// cuBLASLt refuses that here, of the problem itself (`names.1`); else the
/// heuristic's candidates timed, the choice stored under the class's name if the
/// class had none (else under the problem's, so a class's entry is never replaced
/// by a problem it did not fit) and what timing found returned; else (tuning off,
/// or a graph capture) the heuristic's first pick.
pub(crate) fn choose(
    gpu: &Gpu,
    p: &Problem,
    names: (&str, &str),
) -> Result<(sys::cublasLtMatmulAlgo_t, Option<Tuned>)> {
    let on = tuning_on();
    // Timing synchronises, which a graph capture may not; a stored choice is only read.
    let tune = on && !gpu.capturing();
    let store = if on { gpu.kernel_store() } else { None };
    let mut save_as = None;
    if let Some(s) = &store {
        for name in [names.0, names.1] {
            let key = store_key(gpu, name);
            match s.load(&key).and_then(|b| decode(&b)) {
                Some(algo) if p.accepts(&algo) => return Ok((algo, None)),
                Some(_) => {}
                None => {
                    save_as.get_or_insert(key);
                }
            }
        }
    }
    let cands = p.candidates(if tune { CANDIDATES } else { 1 })?;
    if !tune || cands.len() == 1 {
        return Ok((cands[0], None));
    }
    let t = fastest(gpu, p, &cands, names.1)?;
    let algo = cands[t.chosen];
    if let (Some(s), Some(k)) = (&store, &save_as) {
        s.save(k, &encode(&algo));
    }
    Ok((algo, Some(t)))
}

/// An algorithm's 64 bytes (its eight words, little-endian), as stored.
fn encode(a: &sys::cublasLtMatmulAlgo_t) -> Vec<u8> {
    a.data.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// [`encode`]'s inverse; None for anything but 64 bytes (a damaged entry is timed
/// again and replaced).
fn decode(b: &[u8]) -> Option<sys::cublasLtMatmulAlgo_t> {
    if b.len() != 64 {
        return None;
    }
    let mut data = [0u64; 8];
    for (w, c) in data.iter_mut().zip(b.chunks_exact(8)) {
        *w = u64::from_le_bytes(c.try_into().ok()?);
    }
    Some(sys::cublasLtMatmulAlgo_t { data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_pick_stays_unless_another_is_clearly_faster() {
        // Within the margin: noise, the heuristic's pick stays.
        assert_eq!(pick(&[10.0, 9.8, 9.9]), 0);
        // Clearly faster candidates: the fastest of them.
        assert_eq!(pick(&[10.0, 9.0, 8.0, 9.5]), 2);
        // A candidate that failed to run is never taken; a failed first pick is
        // replaced by the fastest that ran.
        assert_eq!(pick(&[10.0, f32::INFINITY, 9.0]), 2);
        assert_eq!(pick(&[f32::INFINITY, 12.0, 11.0]), 2);
        assert_eq!(pick(&[5.0]), 0);
    }

    #[test]
    fn stored_algorithms_round_trip_and_damaged_ones_are_refused() {
        let a = sys::cublasLtMatmulAlgo_t {
            data: [1, u64::MAX, 3, 0, 5, 1 << 40, 7, 8],
        };
        let b = encode(&a);
        assert_eq!(b.len(), 64);
        assert_eq!(decode(&b).map(|x| x.data), Some(a.data));
        assert!(decode(&b[..63]).is_none());
        assert!(decode(&[b.as_slice(), &[0]].concat()).is_none());
    }
}
