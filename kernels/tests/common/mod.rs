//! Helpers shared by the GPU test binaries: the device or a skip message, seeded
//! random inputs, norm-wise relative error, and PARITY lines that record misses
//! and fail at [`done`] once every line of a test is printed.
#![allow(dead_code)]

use std::sync::Arc;

use jet_kernels::cuda::{self, Gpu};
use rand::{Rng, SeedableRng};

pub fn gpu() -> Option<Arc<Gpu>> {
    match cuda::cuda_available() {
        Ok(g) => Some(g),
        Err(e) => {
            println!("skipping: no CUDA device: {e}");
            None
        }
    }
}

pub fn rnd(n: usize, seed: u64, amp: f32) -> Vec<f32> {
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| r.random_range(-amp..amp)).collect()
}

pub fn rel(gpu: &[f32], cpu: &[f32]) -> f64 {
    assert_eq!(gpu.len(), cpu.len(), "lengths");
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in gpu.iter().zip(cpu) {
        assert!(
            a.is_finite() == b.is_finite(),
            "finite mismatch: gpu {a} cpu {b}"
        );
        if b.is_finite() {
            num += ((a - b) as f64).powi(2);
            den += (*b as f64).powi(2);
        }
    }
    (num / den.max(1e-300)).sqrt()
}

thread_local! {
    static FAILS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Print the PARITY line; a miss is recorded and fails the test at [`done`], so
/// that every line of a test gets printed first.
pub fn report(op: &str, shape: &str, err: f64, bound: f64) {
    println!("PARITY | {op:<34} | {shape:<24} | {err:.2e} | <= {bound:.0e}");
    if err.is_nan() || err > bound {
        let msg = format!("{op} {shape}: error {err:.3e} above {bound:.0e}");
        FAILS.with(|f| f.borrow_mut().push(msg));
    }
}

pub fn report_exact(op: &str, shape: &str, mismatches: usize) {
    println!("PARITY | {op:<34} | {shape:<24} | {mismatches} differing | bit-exact");
    if mismatches > 0 {
        let msg = format!("{op} {shape}: {mismatches} values differ");
        FAILS.with(|f| f.borrow_mut().push(msg));
    }
}

pub fn done() {
    let fails = FAILS.with(|f| std::mem::take(&mut *f.borrow_mut()));
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

pub fn dl(g: &Gpu, x: &cudarc::driver::CudaSlice<f32>, n: usize) -> Vec<f32> {
    g.download_n(x, n).unwrap()
}

pub fn up(g: &Gpu, x: &[f32]) -> cudarc::driver::CudaSlice<f32> {
    g.upload(x).unwrap()
}

/// `x` rounded to BF16 values, uploaded in both forms a kernel may read them in:
/// f32, and the BF16 bits (the same numbers).
pub fn up_bf16_values(
    g: &Gpu,
    x: &[f32],
) -> (
    cudarc::driver::CudaSlice<f32>,
    cudarc::driver::CudaSlice<u16>,
) {
    let r: Vec<f32> = x.iter().map(|&v| jet_kernels::bf16::round(v)).collect();
    let h: Vec<u16> = r
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect();
    (up(g, &r), g.upload(&h).unwrap())
}

/// Values whose bits differ between `a` and `b`.
pub fn bits_differ(a: &[f32], b: &[f32]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

/// The AdamW step the stacked-weight tests take (the third step's bias corrections,
/// decay on).
pub fn adam_step() -> jet_kernels::cuda::adamw::AdamStep {
    jet_kernels::cuda::adamw::AdamStep {
        lr: 3e-4,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        bc1: 1.0 - 0.9f64.powi(3),
        bc2: 1.0 - 0.95f64.powi(3),
        wd_factor: 1.0 - 3e-4 * 0.1,
        decay: true,
        grad_scale: 1.0,
    }
}

/// AdamW's state `[p, g, m, v]` on the device for weights `ws` (`ns[i] k` values
/// each), seeded per weight (v positive).
pub fn adam_state(
    g: &Gpu,
    ws: &[Vec<f32>],
    ns: &[usize],
    k: usize,
) -> Vec<[cudarc::driver::CudaSlice<f32>; 4]> {
    ws.iter()
        .zip(ns)
        .enumerate()
        .map(|(i, (w, &n))| {
            let sd = 900 + 10 * i as u64;
            let v: Vec<f32> = rnd(n * k, sd + 3, 1e-2).iter().map(|x| x * x).collect();
            [
                up(g, w),
                up(g, &rnd(n * k, sd + 1, 1.0)),
                up(g, &rnd(n * k, sd + 2, 1e-2)),
                up(g, &v),
            ]
        })
        .collect()
}
