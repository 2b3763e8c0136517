//! Timings of the CUDA path (ignored by default; run on the GPU machine with
//! `--ignored --nocapture`). Device events around each call, a warm-up first,
//! median of the repeats; weights rotate over several copies so that decode
//! timings do not read them from L2. Prints `TIMING` lines.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, DevicePtr};
use jet_kernels::cuda::{self, gemm, gemv, gemv_bf16, linear as glin, quantize as gq, Gpu};
use jet_kernels::{Flow, GemmPrecision};

mod common;
use common::gpu;

/// Mean device time of one call of `f` in microseconds: after a warm-up, `reps`
/// calls are queued back to back behind a ~4 ms prelude (a memset of `pre`), so the
/// host's launch work is hidden and the events time the GPU alone.
fn time_us(g: &Gpu, pre: &mut CudaSlice<u8>, reps: usize, mut f: impl FnMut(usize)) -> f64 {
    for i in 0..3 {
        f(i);
    }
    g.sync().unwrap();
    let ev = || {
        g.context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap()
    };
    let (a, b) = (ev(), ev());
    g.stream().memset_zeros(pre).unwrap();
    a.record(g.stream()).unwrap();
    for i in 0..reps {
        f(i);
    }
    b.record(g.stream()).unwrap();
    b.synchronize().unwrap();
    a.elapsed_ms(&b).unwrap() as f64 * 1e3 / reps as f64
}

/// Median latency of one call in microseconds, host launch work included (an
/// event pair around each call on an idle stream).
fn latency_us(g: &Gpu, reps: usize, mut f: impl FnMut(usize)) -> f64 {
    for i in 0..3 {
        f(i);
    }
    g.sync().unwrap();
    let ev = || {
        g.context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap()
    };
    let mut ts: Vec<f64> = (0..reps)
        .map(|i| {
            let (a, b) = (ev(), ev());
            a.record(g.stream()).unwrap();
            f(i);
            b.record(g.stream()).unwrap();
            b.synchronize().unwrap();
            a.elapsed_ms(&b).unwrap() as f64 * 1e3
        })
        .collect();
    ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    ts[reps / 2]
}

fn rand_dev(g: &Gpu, n: usize, seed: u32, amp: f32) -> CudaSlice<f32> {
    let mut x = g.zeros::<f32>(n).unwrap();
    gq::fill_random(g, &mut x, seed, amp).unwrap();
    x
}

fn p<T>(g: &Gpu, s: &CudaSlice<T>) -> u64 {
    s.device_ptr(g.stream()).0
}

/// The rows kernels' view of a BF16 matrix `v`: `rows` (of `rows_pad` allocated)
/// x `cols` values, rows `cols_pad` apart.
fn bf16_rows(
    v: &CudaSlice<u16>,
    (rows, rows_pad): (usize, usize),
    (cols, cols_pad): (usize, usize),
) -> gemv_bf16::Bf16Rows<'_> {
    gemv_bf16::Bf16Rows {
        v: v.into(),
        rows,
        cols,
        rows_pad,
        cols_pad,
    }
}

fn bf16_op(g: &Gpu, s: &CudaSlice<u16>, rows: usize, cols: usize) -> gemm::Dense {
    gemm::Dense {
        ptr: p(g, s),
        ty: gemm::LtType::Bf16,
        rows,
        cols,
        ld: cols,
    }
}

#[test]
#[ignore]
fn timing_report() {
    let Some(g) = gpu() else { return };
    println!(
        "TIMING device: {} (cc {:?}, NVRTC {:?})",
        g.name(),
        g.compute_capability(),
        g.nvrtc_version()
    );

    let mut pre = g.zeros::<u8>(16 << 30).unwrap();
    let pre = &mut pre;
    // Memory: a device-to-device copy against the quantizers (bytes read + written).
    let (m, k) = (8192usize, 4096usize);
    let x = rand_dev(&g, m * k, 1, 3.0);
    let mut y = g.zeros::<f32>(m * k).unwrap();
    let t = time_us(&g, pre, 20, |_| g.stream().memcpy_dtod(&x, &mut y).unwrap());
    let copy_gbs = 2.0 * (m * k * 4) as f64 / t / 1e3;
    println!("TIMING copy f32 [8192, 4096]: {t:.1} us, {copy_gbs:.0} GB/s (read + write)");
    let bytes = (m * k * 5 + m * 32 * 4) as f64;
    let t = time_us(&g, pre, 20, |_| {
        drop(gq::quantize_row1x128(&g, &x, m, k).unwrap())
    });
    println!(
        "TIMING quantize 1x128 f32 [8192, 4096]: {t:.1} us, {:.0} GB/s ({:.0}% of copy)",
        bytes / t / 1e3,
        bytes / t / 1e3 / copy_gbs * 100.0
    );
    let t = time_us(&g, pre, 20, |_| {
        drop(gq::quantize_row1x128_sw(&g, &x, m, k).unwrap())
    });
    println!(
        "TIMING quantize 1x128 f32 [8192, 4096], software encoder: {t:.1} us, {:.0} GB/s",
        bytes / t / 1e3
    );
    let t = time_us(&g, pre, 20, |_| {
        drop(gq::quantize_col128x1(&g, &x, m, k).unwrap())
    });
    println!(
        "TIMING quantize 128x1^T f32 [8192, 4096]: {t:.1} us, {:.0} GB/s ({:.0}% of copy)",
        bytes / t / 1e3,
        bytes / t / 1e3 / copy_gbs * 100.0
    );
    let t = time_us(&g, pre, 20, |_| {
        drop(gq::quantize_block128(&g, &x, m, k, true).unwrap())
    });
    let bytes_b = (m * k * 6) as f64;
    println!(
        "TIMING quantize 128x128 (+W^T) f32 [8192, 4096]: {t:.1} us, {:.0} GB/s ({:.0}% of copy)",
        bytes_b / t / 1e3,
        bytes_b / t / 1e3 / copy_gbs * 100.0
    );
    drop((x, y));

    // Training-sized GEMMs, Qwen3-8B shapes (qkv 6144, o 4096, gate+up 24576, down K = 12288).
    let m = 8192;
    for (k, n) in [
        (4096usize, 4096usize),
        (4096, 6144),
        (4096, 24576),
        (12288, 4096),
    ] {
        let flops = 2.0 * (m * k * n) as f64;
        let (xa, wa) = (rand_dev(&g, m * k, 2, 2.0), rand_dev(&g, n * k, 3, 0.05));
        let (xb, wb) = (
            gq::to_bf16_padded(&g, &xa, m, k, m, k).unwrap(),
            gq::to_bf16_padded(&g, &wa, n, k, n, k).unwrap(),
        );
        let d = g.zeros::<f32>(m * n).unwrap();
        let t_bf = time_us(&g, pre, 20, |_| {
            gemm::dense_gemm(
                &g,
                bf16_op(&g, &xb, m, k),
                false,
                bf16_op(&g, &wb, n, k),
                true,
                p(&g, &d),
                n,
            )
            .unwrap()
        });
        drop((xb, wb));
        let qx = gq::quantize_row1x128(&g, &xa, m, k).unwrap();
        let (qw, _) = gq::quantize_block128(&g, &wa, n, k, false).unwrap();
        let mut d8 = g.zeros::<f32>(qx.outer_pad() * qw.outer_pad()).unwrap();
        let t_f8 = time_us(&g, pre, 20, |_| {
            gemm::fp8_gemm_nt_into(&g, &qx, &qw, &mut d8).unwrap()
        });
        println!(
            "TIMING GEMM M=8192 K={k} N={n}: BF16 {t_bf:.0} us = {:.0} TFLOP/s | FP8 1x128 x 128x128 {t_f8:.0} us = {:.0} TFLOP/s | speed-up {:.2}x",
            flops / t_bf / 1e6,
            flops / t_f8 / 1e6,
            t_bf / t_f8
        );
    }

    // Decode: M = 64, K = N = 4096, weights rotating over 8 copies (128 MiB of FP8).
    let (m, k, n, copies) = (64usize, 4096usize, 4096usize, 8usize);
    let xa = rand_dev(&g, m * k, 4, 2.0);
    let ws: Vec<CudaSlice<f32>> = (0..copies)
        .map(|i| rand_dev(&g, n * k, 10 + i as u32, 0.05))
        .collect();
    let wbf: Vec<CudaSlice<u16>> = ws
        .iter()
        .map(|w| gq::to_bf16_padded(&g, w, n, k, n, k).unwrap())
        .collect();
    let wq: Vec<_> = ws
        .iter()
        .map(|w| gq::quantize_block128(&g, w, n, k, false).unwrap().0)
        .collect();
    let xb = gq::to_bf16_padded(&g, &xa, m, k, m, k).unwrap();
    let qx = gq::quantize_row1x128(&g, &xa, m, k).unwrap();
    let mut d = g.zeros::<f32>(m * n).unwrap();
    let dp = p(&g, &d);
    let t_bf = time_us(&g, pre, 50, |i| {
        gemm::dense_gemm(
            &g,
            bf16_op(&g, &xb, m, k),
            false,
            bf16_op(&g, &wbf[i % copies], n, k),
            true,
            dp,
            n,
        )
        .unwrap()
    });
    let t_lt8 = time_us(&g, pre, 50, |i| {
        gemm::fp8_gemm_nt_into(&g, &qx, &wq[i % copies], &mut d).unwrap()
    });
    let t_gemv = time_us(&g, pre, 50, |i| {
        gemv::gemv_fp8_into(&g, &qx, &wq[i % copies], &mut d, n).unwrap()
    });
    let t_gemv32 = time_us(&g, pre, 50, |i| {
        let w = &wq[i % copies];
        gemv::gemv_fp8_with(&g, &qx, w, &mut d, n, 32, gemv::GemvKernel::SplitK).unwrap()
    });
    let t_tiled = time_us(&g, pre, 50, |i| {
        let w = &wq[i % copies];
        gemv::gemv_fp8_with(&g, &qx, w, &mut d, n, 64, gemv::GemvKernel::Tiled(None)).unwrap()
    });
    println!("TIMING decode 64x4096x4096 GEMV tiled (first version): {t_tiled:.1} us");
    let t_m1 = time_us(&g, pre, 50, |i| {
        let w = &wq[i % copies];
        let kern = gemv::GemvKernel::Tiled(Some(gemv::GEMV_T8_M1));
        gemv::gemv_fp8_with(&g, &qx, w, &mut d, n, 64, kern).unwrap()
    });
    println!("TIMING decode 64x4096x4096 GEMV tiled variant t8_w8_m1: {t_m1:.1} us");
    let t_q = time_us(&g, pre, 50, |_| {
        drop(gq::quantize_row1x128(&g, &xa, m, k).unwrap())
    });
    println!("TIMING decode 64x4096x4096 GEMM: BF16 cuBLASLt {t_bf:.1} us | FP8 cuBLASLt block-scaled {t_lt8:.1} us | FP8 GEMV split-K {t_gemv:.1} us ({:.0} GB/s of weights) | FP8 GEMV split-K as 2x32 tokens {t_gemv32:.1} us | quantize X 1x128 {t_q:.1} us", (n * k) as f64 / t_gemv / 1e3);
    for (mm, name) in [(1usize, "M=1"), (8, "M=8"), (16, "M=16"), (32, "M=32")] {
        let qs = gq::quantize_row1x128(&g, &xa, mm, k).unwrap();
        let t = time_us(&g, pre, 50, |i| {
            gemv::gemv_fp8_into(&g, &qs, &wq[i % copies], &mut d, n).unwrap()
        });
        let t1 = time_us(&g, pre, 50, |i| {
            let w = &wq[i % copies];
            gemv::gemv_fp8_with(&g, &qs, w, &mut d, n, 64, gemv::GemvKernel::Tiled(None)).unwrap()
        });
        println!(
            "TIMING decode GEMV {name} K=N=4096: split-K {t:.1} us ({:.0} GB/s of weights) | tiled {t1:.1} us",
            (n * k) as f64 / t / 1e3
        );
    }
    // Whole linear layers (input f32 -> output f32 BF16 values), decode size.
    let gw8: Vec<_> = ws
        .iter()
        .map(|w| glin::GpuWeight::prepare(&g, w, n, k, Flow::Fp8).unwrap())
        .collect();
    let gwb: Vec<_> = ws
        .iter()
        .map(|w| glin::GpuWeight::prepare(&g, w, n, k, Flow::Bf16).unwrap())
        .collect();
    let t8 = time_us(&g, pre, 50, |i| {
        drop(glin::linear_forward(&g, &xa, m, &gw8[i % copies], None, GemmPrecision::Fp8).unwrap())
    });
    let tb = time_us(&g, pre, 50, |i| {
        drop(glin::linear_forward(&g, &xa, m, &gwb[i % copies], None, GemmPrecision::Bf16).unwrap())
    });
    println!("TIMING decode linear_forward 64x4096x4096 (quantize/convert + GEMM + epilogue), device time: FP8 {t8:.1} us | BF16 {tb:.1} us");
    let l8 = latency_us(&g, 50, |i| {
        drop(glin::linear_forward(&g, &xa, m, &gw8[i % copies], None, GemmPrecision::Fp8).unwrap())
    });
    let lb = latency_us(&g, 50, |i| {
        drop(glin::linear_forward(&g, &xa, m, &gwb[i % copies], None, GemmPrecision::Bf16).unwrap())
    });
    println!("TIMING decode linear_forward 64x4096x4096, latency with host launch work: FP8 {l8:.1} us | BF16 {lb:.1} us");

    // Decode at other Qwen3-8B shapes (M = 64): BF16 cuBLASLt against the FP8 kernel.
    drop((gw8, gwb, wq, wbf, ws));
    for (k, n) in [(4096usize, 1024usize), (4096, 12288), (12288, 4096)] {
        let xa = rand_dev(&g, m * k, 5, 2.0);
        let ws: Vec<_> = (0..copies)
            .map(|i| rand_dev(&g, n * k, 30 + i as u32, 0.05))
            .collect();
        let wbf: Vec<_> = ws
            .iter()
            .map(|w| gq::to_bf16_padded(&g, w, n, k, n, k).unwrap())
            .collect();
        let wq: Vec<_> = ws
            .iter()
            .map(|w| gq::quantize_block128(&g, w, n, k, false).unwrap().0)
            .collect();
        drop(ws);
        let xb = gq::to_bf16_padded(&g, &xa, m, k, m, k).unwrap();
        let qx = gq::quantize_row1x128(&g, &xa, m, k).unwrap();
        let mut d = g.zeros::<f32>(m * n).unwrap();
        let dp = p(&g, &d);
        let t_bf = time_us(&g, pre, 50, |i| {
            let w = bf16_op(&g, &wbf[i % copies], n, k);
            gemm::dense_gemm(&g, bf16_op(&g, &xb, m, k), false, w, true, dp, n).unwrap()
        });
        let t_gemv = time_us(&g, pre, 50, |i| {
            gemv::gemv_fp8_into(&g, &qx, &wq[i % copies], &mut d, n).unwrap()
        });
        let t_m1 = time_us(&g, pre, 50, |i| {
            let w = &wq[i % copies];
            gemv::gemv_fp8_with(&g, &qx, w, &mut d, n, 64, gemv::GemvKernel::Tiled(None)).unwrap()
        });
        println!("TIMING decode 64x{k}x{n}: BF16 cuBLASLt {t_bf:.1} us | FP8 GEMV split-K {t_gemv:.1} us | FP8 GEMV tiled {t_m1:.1} us");
    }

    // A whole training-sized linear layer (M = 8192, K = N = 4096), f32 in and out.
    let (m, k, n) = (8192usize, 4096usize, 4096usize);
    let (xa, w, dy) = (
        rand_dev(&g, m * k, 6, 2.0),
        rand_dev(&g, n * k, 7, 0.05),
        rand_dev(&g, m * n, 8, 1.0),
    );
    for (flow, prec) in [
        (Flow::Bf16, GemmPrecision::Bf16),
        (Flow::Fp8, GemmPrecision::Fp8),
    ] {
        let t_prep = time_us(&g, pre, 10, |_| {
            drop(glin::GpuWeight::prepare(&g, &w, n, k, flow).unwrap())
        });
        let gw = glin::GpuWeight::prepare(&g, &w, n, k, flow).unwrap();
        let t_f = time_us(&g, pre, 10, |_| {
            drop(glin::linear_forward(&g, &xa, m, &gw, None, prec).unwrap())
        });
        let t_b = time_us(&g, pre, 10, |_| {
            drop(glin::linear_backward(&g, &dy, &xa, m, &gw, false, prec, prec).unwrap())
        });
        println!("TIMING linear {flow} 8192x4096x4096 (f32 in/out, incl. quantize/convert and epilogue): prepare W {t_prep:.0} us | forward {t_f:.0} us | backward (DGrad+WGrad) {t_b:.0} us");
    }
}

/// The batch-invariant FP8 forward against cuBLASLt's block-scaled GEMM at the
/// Qwen3-0.6B projections (`JET_TIMING_SHAPES=8b`: Qwen3-8B's): training (4,096
/// rows) and batch-256 decode. TFLOP/s.
/// `JET_TIMING_ONLY=NAME` times that shape alone.
#[test]
#[ignore]
fn fp8_rows_timing() {
    let Some(g) = gpu() else { return };
    let mut pre = g.zeros::<u8>(4 << 30).unwrap();
    let pre = &mut pre;
    // (name, K, N)
    let shapes: &[(&str, usize, usize)] =
        if std::env::var("JET_TIMING_SHAPES").as_deref() == Ok("8b") {
            &[
                ("q/o_proj", 4096, 4096),
                ("k/v_proj", 4096, 1024),
                ("gate/up", 4096, 12288),
                ("down", 12288, 4096),
                ("lm_head", 4096, 151936),
            ]
        } else {
            &[
                ("q_proj", 1024, 2048),
                ("k/v_proj", 1024, 1024),
                ("o_proj", 2048, 1024),
                ("gate/up", 1024, 3072),
                ("down", 3072, 1024),
                ("lm_head", 1024, 151936),
                // q/k/v and gate/up stacked: what one launch a group would take.
                ("qkv", 1024, 4096),
                ("gate+up", 1024, 6144),
            ]
        };
    for m in [4096usize, 256] {
        // JET_TIMING_ONLY=NAME: that shape alone (for a profiler run).
        let only = std::env::var("JET_TIMING_ONLY").ok();
        for &(name, k, n) in shapes
            .iter()
            .filter(|s| only.as_deref().is_none_or(|o| s.0 == o))
        {
            let x = rand_dev(&g, m * k, 1, 2.0);
            let w = rand_dev(&g, n * k, 2, 0.05);
            let qx = gq::quantize_row1x128(&g, &x, m, k).unwrap();
            let (qw, _) = gq::quantize_block128(&g, &w, n, k, false).unwrap();
            // JET_TIMING_COLD=C: the outputs rotate over C buffers, so that (for C of
            // a few) they leave L2 between calls as a training step's do.
            let cold: usize = std::env::var("JET_TIMING_COLD")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1)
                .max(1);
            let ds: Vec<CudaSlice<f32>> = (0..cold)
                .map(|_| {
                    g.zeros::<f32>(qx.rows_pad * n.next_multiple_of(16))
                        .unwrap()
                })
                .collect();
            let mut d = g
                .zeros::<f32>(qx.rows_pad * n.next_multiple_of(16))
                .unwrap();
            let tf = |us: f64| 2.0 * (m * n * k) as f64 / us / 1e6;
            let lt = time_us(&g, pre, 10, |_| {
                gemm::fp8_gemm_nt_into(&g, &qx, &qw, &mut d).unwrap()
            });
            let r64 = time_us(&g, pre, 10, |i| {
                gemv::gemm_fp8_rows(&g, &qx, &qw, &ds[i % cold], n).unwrap()
            });
            let sk = time_us(&g, pre, 10, |_| {
                gemv::gemv_fp8_into(&g, &qx, &qw, &mut d, n).unwrap()
            });
            // BF16 outputs, as a step writes q, k, v, gate, up and the LM head.
            let np16 = n.next_multiple_of(16);
            let ys: Vec<CudaSlice<u16>> = (0..cold)
                .map(|_| g.zeros::<u16>(qx.rows_pad * np16).unwrap())
                .collect();
            let r16 = time_us(&g, pre, 10, |i| {
                gemv::gemm_fp8_rows_bf16(&g, &qx, &qw, &ys[i % cold], np16).unwrap()
            });
            drop(ys);
            println!(
                "TIMING fp8 rows {m}x{k}x{n} {name:<8}: cuBLASLt {lt:8.1} us {:5.0} TF | rows {r64:8.1} us {:5.0} TF | split-K chunks {sk:8.1} us {:5.0} TF | rows BF16 out {r16:8.1} us",
                tf(lt),
                tf(r64),
                tf(sk)
            );
            // The BF16 forward: cuBLASLt against the batch-invariant kernels.
            let (kp, np) = (cuda::pad16(k), cuda::pad16(n));
            let xb = gq::to_bf16_padded(&g, &x, m, k, m, kp).unwrap();
            let wb = gq::to_bf16_padded(&g, &w, n, k, np, kp).unwrap();
            let rows = |v, r, rp| bf16_rows(v, (r, rp), (k, kp));
            let dense = |s: &cudarc::driver::CudaSlice<u16>, r| gemm::Dense {
                ptr: s.device_ptr(g.stream()).0,
                ty: gemm::LtType::Bf16,
                rows: r,
                cols: k,
                ld: kp,
            };
            let dps: Vec<u64> = ds.iter().map(|d| d.device_ptr(g.stream()).0).collect();
            let lt = time_us(&g, pre, 10, |i| {
                gemm::dense_gemm(
                    &g,
                    dense(&xb, m),
                    false,
                    dense(&wb, n),
                    true,
                    dps[i % cold],
                    np,
                )
                .unwrap()
            });
            let r64 = time_us(&g, pre, 10, |i| {
                gemv_bf16::gemm_bf16_rows(&g, rows(&xb, m, m), rows(&wb, n, np), &ds[i % cold], n)
                    .unwrap()
            });
            let sk = time_us(&g, pre, 10, |_| {
                gemv_bf16::gemv_bf16_into(&g, rows(&xb, m, m), rows(&wb, n, np), &mut d, n).unwrap()
            });
            println!(
                "TIMING bf16 rows {m}x{k}x{n} {name:<8}: cuBLASLt {lt:8.1} us {:5.0} TF | rows64 {r64:8.1} us {:5.0} TF | split-K chunks {sk:8.1} us {:5.0} TF",
                tf(lt),
                tf(r64),
                tf(sk)
            );
        }
    }
}

/// The BF16 rows kernel at Qwen3-0.6B's 8 x 512 training shapes in the forms a
/// step runs it: the plain f32 output (as `fp8_rows_timing`; q and k in a step),
/// BF16 values out (v, gate, up, the LM head; timed at every shape without a
/// residual) or f32 plus the residual (o, down), each hot (the same
/// operands every call, in L2) and cold (eight weight copies and four output and
/// residual buffers in turn, so the weights come from DRAM and the outputs do
/// not stay in L2, as in a step).
#[test]
#[ignore]
fn bf16_rows_step_forms() {
    let Some(g) = gpu() else { return };
    let mut pre = g.zeros::<u8>(4 << 30).unwrap();
    let pre = &mut pre;
    let m = 4096;
    // (name, K, N, residual)
    let shapes: &[(&str, usize, usize, bool)] = &[
        ("q_proj", 1024, 2048, false),
        ("k/v_proj", 1024, 1024, false),
        ("o_proj", 2048, 1024, true),
        ("gate/up", 1024, 3072, false),
        ("down", 3072, 1024, true),
    ];
    for &(name, k, n, has_res) in shapes {
        let (kp, np) = (cuda::pad16(k), cuda::pad16(n));
        let x = rand_dev(&g, m * k, 1, 2.0);
        let xb = gq::to_bf16_padded(&g, &x, m, k, m, kp).unwrap();
        let ws: Vec<CudaSlice<u16>> = (0..8)
            .map(|i| {
                let w = rand_dev(&g, n * k, 2 + i, 0.05);
                gq::to_bf16_padded(&g, &w, n, k, np, kp).unwrap()
            })
            .collect();
        let ys: Vec<CudaSlice<f32>> = (0..4).map(|_| g.zeros::<f32>(m * n).unwrap()).collect();
        let rs: Vec<CudaSlice<f32>> = (0..4).map(|i| rand_dev(&g, m * n, 40 + i, 1.0)).collect();
        let xr = |v| bf16_rows(v, (m, m), (k, kp));
        let wr = |v| bf16_rows(v, (n, np), (k, kp));
        let tf = |us: f64| 2.0 * (m * n * k) as f64 / us / 1e6;
        let mut line = format!("TIMING bf16 step forms {m}x{k}x{n} {name:<8}:");
        for cold in [false, true] {
            let (nw, ny) = if cold { (8, 4) } else { (1, 1) };
            let plain = time_us(&g, pre, 12, |i| {
                gemv_bf16::gemm_bf16_rows(&g, xr(&xb), wr(&ws[i % nw]), &ys[i % ny], n).unwrap()
            });
            let form = time_us(&g, pre, 12, |i| {
                let res = has_res.then(|| &rs[i % ny]);
                gemv_bf16::gemm_bf16_rows_step_form(&g, xr(&xb), wr(&ws[i % nw]), &ys[i % ny], res)
                    .unwrap()
            });
            let tag = if cold { "cold" } else { "hot" };
            let fname = if has_res { "f32+res" } else { "bf16 out" };
            line += &format!(
                " | {tag}: f32 {plain:6.1} us {:4.0} TF, {fname} {form:6.1} us {:4.0} TF",
                tf(plain),
                tf(form)
            );
        }
        println!("{line}");
    }
}

/// What one launch for q, k and v (and one for gate and up) could save a 0.6B
/// training forward: a layer's five rows GEMMs as the step runs them (q and k f32
/// out, v, gate and up BF16 out), against one launch of the concatenated weights
/// for each group (N = 4,096 with f32 out, N = 6,144 with BF16 out), four layers'
/// weights in turn. The merged launches' sums are not the separate ones' bits
/// (their split slices follow N); this bounds the gain of a grouped launch.
#[test]
#[ignore]
fn bf16_rows_grouping_bound() {
    let Some(g) = gpu() else { return };
    let mut pre = g.zeros::<u8>(4 << 30).unwrap();
    let pre = &mut pre;
    let (m, k, kp) = (4096, 1024, 1024);
    let x = rand_dev(&g, m * k, 1, 2.0);
    let xb = gq::to_bf16_padded(&g, &x, m, k, m, kp).unwrap();
    let wts = |n: usize, seed: u32| -> Vec<CudaSlice<u16>> {
        (0..4)
            .map(|i| {
                let w = rand_dev(&g, n * k, seed + i, 0.05);
                gq::to_bf16_padded(&g, &w, n, k, n, kp).unwrap()
            })
            .collect()
    };
    let (wq, wk, wv, wqkv) = (wts(2048, 10), wts(1024, 20), wts(1024, 30), wts(4096, 40));
    let (wg, wu, wgu) = (wts(3072, 50), wts(3072, 60), wts(6144, 70));
    let ys: Vec<CudaSlice<f32>> = (0..6).map(|_| g.zeros::<f32>(m * 6144).unwrap()).collect();
    let xr = || bf16_rows(&xb, (m, m), (k, kp));
    let plain = |w: &CudaSlice<u16>, n: usize, y: &CudaSlice<f32>| {
        let w = bf16_rows(w, (n, n), (k, kp));
        gemv_bf16::gemm_bf16_rows(&g, xr(), w, y, n).unwrap()
    };
    let bf16_out = |w: &CudaSlice<u16>, n: usize, y: &CudaSlice<f32>| {
        let w = bf16_rows(w, (n, n), (k, kp));
        gemv_bf16::gemm_bf16_rows_step_form(&g, xr(), w, y, None).unwrap()
    };
    let sep_qkv = time_us(&g, pre, 16, |i| {
        plain(&wq[i % 4], 2048, &ys[0]);
        plain(&wk[i % 4], 1024, &ys[1]);
        bf16_out(&wv[i % 4], 1024, &ys[2]);
    });
    let one_qkv = time_us(&g, pre, 16, |i| plain(&wqkv[i % 4], 4096, &ys[0]));
    let sep_gu = time_us(&g, pre, 16, |i| {
        bf16_out(&wg[i % 4], 3072, &ys[3]);
        bf16_out(&wu[i % 4], 3072, &ys[4]);
    });
    let one_gu = time_us(&g, pre, 16, |i| bf16_out(&wgu[i % 4], 6144, &ys[3]));
    let layer = time_us(&g, pre, 16, |i| {
        plain(&wq[i % 4], 2048, &ys[0]);
        plain(&wk[i % 4], 1024, &ys[1]);
        bf16_out(&wv[i % 4], 1024, &ys[2]);
        bf16_out(&wg[i % 4], 3072, &ys[3]);
        bf16_out(&wu[i % 4], 3072, &ys[4]);
    });
    let layer_one = time_us(&g, pre, 16, |i| {
        plain(&wqkv[i % 4], 4096, &ys[0]);
        bf16_out(&wgu[i % 4], 6144, &ys[3]);
    });
    println!(
        "TIMING rows grouping 4096x1024: q,k,v {sep_qkv:6.1} us, one launch {one_qkv:6.1} | \
         gate,up {sep_gu:6.1} us, one launch {one_gu:6.1} | layer's five {layer:6.1} us, two \
         {layer_one:6.1}: {:.2} ms a 28-layer step",
        (layer - layer_one) * 28.0 / 1e3
    );
}

/// The training step's quantizers at Qwen3-0.6B shapes (4,096 tokens): dY's one
/// pass (1x128 + 128x1), X's 128x1 alone, a weight's 128x128 blocks (with the
/// transposed copy), and the BF16 copy, each with its bytes moved (f32 in, codes,
/// scales and copies out) over its time.
#[test]
#[ignore]
fn quant_timing() {
    let Some(g) = gpu() else { return };
    let mut pre = g.zeros::<u8>(4 << 30).unwrap();
    let pre = &mut pre;
    let m = 4096usize;
    for n in [1024usize, 2048, 3072] {
        let x = rand_dev(&g, m * n, 3, 2.0);
        let gbs = |bytes: usize, us: f64| bytes as f64 / us / 1e3;
        let dual = time_us(&g, pre, 20, |_| {
            gq::quantize_dual(&g, &x, m, n).unwrap();
        });
        let col = time_us(&g, pre, 20, |_| {
            gq::quantize_col128x1(&g, &x, m, n).unwrap();
        });
        let row = time_us(&g, pre, 20, |_| {
            gq::quantize_row1x128(&g, &x, m, n).unwrap();
        });
        let blk = time_us(&g, pre, 20, |_| {
            gq::quantize_block128(&g, &x, n, m, true).unwrap();
        });
        let bf = time_us(&g, pre, 20, |_| {
            gq::to_bf16_padded(&g, &x, m, n, m, n).unwrap();
        });
        let e = m * n;
        println!(
            "TIMING quant [{m}, {n}]: dual {dual:7.1} us {:5.0} GB/s | 128x1 {col:7.1} us {:5.0} GB/s | 1x128 {row:7.1} us {:5.0} GB/s | block128+T [{n}, {m}] {blk:7.1} us {:5.0} GB/s | bf16 copy {bf:7.1} us {:5.0} GB/s",
            gbs(6 * e, dual),
            gbs(5 * e, col),
            gbs(5 * e, row),
            gbs(6 * e, blk),
            gbs(6 * e, bf),
        );
    }
}

/// The decode attention's cache layout, measured without changing it: the same
/// 512 chains (row, KV head) of 2 query heads each over the same bytes, once as
/// Qwen3-0.6B lays them out (64 rows x 8 KV heads: a chain reads 256-byte pieces
/// 2 KiB apart) and once as 512 rows of 1 KV head (a chain's rows contiguous, as a
/// head-major cache would hold them). Also batch 256 against 2,048 rows.
#[test]
#[ignore]
fn decode_layout_timing() {
    use jet_kernels::cuda::flash;
    use jet_kernels::ops::attention::AttnShape;
    let Some(g) = gpu() else { return };
    let mut pre = g.zeros::<u8>(8 << 30).unwrap();
    for (b0, ctx) in [(64usize, 256usize), (64, 192), (256, 192)] {
        for (nh, nkv, b) in [(16usize, 8usize, b0), (2, 1, b0 * 8)] {
            let shape = AttnShape {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: 128,
            };
            let kvw = nkv * 128;
            let q = rand_dev(&g, b * nh * 128, 3, 1.0);
            let (kc, vc) = (
                g.zeros::<u16>(b * ctx * kvw).unwrap(),
                g.zeros::<u16>(b * ctx * kvw).unwrap(),
            );
            let kv0: Vec<i32> = (0..b).map(|s| (s * ctx) as i32).collect();
            let len = vec![ctx as i32; b];
            let (kv0, len) = (g.upload(&kv0).unwrap(), g.upload(&len).unwrap());
            let us = time_us(&g, &mut pre, 50, |_| {
                flash::flash_decode_dev(&g, &q, (&kc, &vc), (&kv0, &len), b, shape).unwrap();
            });
            let bytes = (2 * b * ctx * kvw * 2) as f64;
            println!(
                "TIMING decode layout | {nh}q/{nkv}kv x {b} rows, {ctx} cached | {us:8.1} us | {:6.0} GB/s",
                bytes / us / 1e3
            );
        }
    }
}

/// The backward's cuBLASLt GEMMs at Qwen3-0.6B's shapes, BF16 against FP8's
/// block-scaled ones, DGrad (`dx [m, k] = dy [m, n] w [n, k]`: 1x128 x 128x128) and
/// WGrad (`dw [n, k] = dy^T x`: 128x1 x 128x1), BF16 outputs as in a step; with
/// the stacked shapes of q/k/v (N 4,096) and gate/up (N 6,144), which read one x:
/// what one GEMM in place of three or two would take. TFLOP/s and the layer's sum;
/// each FP8 WGrad also with its operands swapped (`dw^T`).
#[test]
#[ignore]
fn backward_gemm_timing() {
    let Some(g) = gpu() else { return };
    let mut pre = g.zeros::<u8>(4 << 30).unwrap();
    let pre = &mut pre;
    // (name, K, N, times a layer)
    let shapes: &[(&str, usize, usize, usize)] = &[
        ("q_proj", 1024, 2048, 1),
        ("k/v_proj", 1024, 1024, 2),
        ("o_proj", 2048, 1024, 1),
        ("gate/up", 1024, 3072, 2),
        ("down", 3072, 1024, 1),
        ("qkv", 1024, 4096, 0),
        ("gate+up", 1024, 6144, 0),
        ("lm_head", 1024, 151936, 0),
    ];
    for m in [4096usize, 256] {
        let mut layer = [0.0f64; 4];
        let mut stacked = [0.0f64; 4];
        for &(name, k, n, per) in shapes {
            if name == "lm_head" && m != 4096 {
                continue;
            }
            let (x, w, dy) = (
                rand_dev(&g, m * k, 1, 2.0),
                rand_dev(&g, n * k, 2, 0.05),
                rand_dev(&g, m * n, 3, 1.0),
            );
            let (kp, np) = (cuda::pad16(k), cuda::pad16(n));
            let xb = gq::to_bf16_padded(&g, &x, m, k, m, kp).unwrap();
            let wb = gq::to_bf16_padded(&g, &w, n, k, np, kp).unwrap();
            let dyb = gq::to_bf16_padded(&g, &dy, m, n, m, np).unwrap();
            let op = |s: &CudaSlice<u16>, rows, cols, ld| gemm::Dense {
                ptr: p(&g, s),
                ty: gemm::LtType::Bf16,
                rows,
                cols,
                ld,
            };
            let yd = g.zeros::<u16>(m * kp).unwrap();
            let yw = g.zeros::<u16>(np * kp).unwrap();
            let (ydp, ywp) = (p(&g, &yd), p(&g, &yw));
            let bd = time_us(&g, pre, 10, |_| {
                let (a, b) = (op(&dyb, m, n, np), op(&wb, n, k, kp));
                gemm::dense_gemm_to(&g, (a, false), (b, false), (ydp, kp, gemm::LtType::Bf16))
                    .unwrap()
            });
            let bw = time_us(&g, pre, 10, |_| {
                let (a, b) = (op(&dyb, m, n, np), op(&xb, m, k, kp));
                gemm::dense_gemm_to(&g, (a, true), (b, false), (ywp, kp, gemm::LtType::Bf16))
                    .unwrap()
            });
            drop((xb, wb, dyb, yd, yw));
            let qdy = gq::quantize_row1x128(&g, &dy, m, n).unwrap();
            let (_, wt) = gq::quantize_block128(&g, &w, n, k, true).unwrap();
            let wt = wt.unwrap();
            let qdyt = gq::quantize_col128x1(&g, &dy, m, n).unwrap();
            let qxt = gq::quantize_col128x1(&g, &x, m, k).unwrap();
            drop((x, w, dy));
            let fd = time_us(&g, pre, 10, |_| {
                drop(gemm::fp8_gemm_nt_bf16(&g, &qdy, &wt).unwrap())
            });
            let fw = time_us(&g, pre, 10, |_| {
                drop(gemm::fp8_gemm_nt_bf16(&g, &qdyt, &qxt).unwrap())
            });
            // The same WGrad with the operands swapped: dw^T [k, n] = x^T dy (what
            // a transpose into the held [n, k] output would follow).
            let fwt = time_us(&g, pre, 10, |_| {
                drop(gemm::fp8_gemm_nt_bf16(&g, &qxt, &qdyt).unwrap())
            });
            let tf = |us: f64| 2.0 * (m * n * k) as f64 / us / 1e6;
            println!(
                "TIMING backward {m}x{k}x{n} {name:<8}: BF16 DGrad {bd:8.1} us {:5.0} TF, WGrad {bw:8.1} us {:5.0} TF | FP8 DGrad {fd:8.1} us {:5.0} TF, WGrad {fw:8.1} us {:5.0} TF (swapped {fwt:8.1} us) | FP8/BF16 {:.2}x",
                tf(bd),
                tf(bw),
                tf(fd),
                tf(fw),
                (bd + bw) / (fd + fw)
            );
            for (i, t) in [bd, bw, fd, fw].into_iter().enumerate() {
                layer[i] += per as f64 * t;
                if per > 0 && name != "q_proj" && name != "k/v_proj" && name != "gate/up" {
                    stacked[i] += per as f64 * t;
                }
                if name == "qkv" || name == "gate+up" {
                    stacked[i] += t;
                }
            }
        }
        println!(
            "TIMING backward {m} rows, a 0.6B layer (us): BF16 DGrad {:.1} WGrad {:.1} | FP8 DGrad {:.1} WGrad {:.1} | with q/k/v and gate/up stacked: BF16 {:.1} {:.1} | FP8 {:.1} {:.1}",
            layer[0], layer[1], layer[2], layer[3], stacked[0], stacked[1], stacked[2], stacked[3]
        );
    }
    print_tuned(&g);
}

/// What cuBLASLt algorithm timing chose in this process (`JET_GEMM_TUNE`, on by
/// default): the heuristic's first pick's time against the chosen one's.
fn print_tuned(g: &Gpu) {
    for t in gemm::tuned(g) {
        println!(
            "TUNED {:<110} first {:8.1} us | chosen #{} of {} {:8.1} us | {:.3}x",
            t.what,
            t.first_us,
            t.chosen,
            t.candidates,
            t.chosen_us,
            t.first_us / t.chosen_us
        );
    }
}

/// The forward of one projection as a training pass runs it (x's operand made once,
/// BF16 out without a residual, f32 plus the residual with one), through the
/// split-K path and through the rows kernel (`gemv::set_split_k_div`: 1 takes
/// split-K wherever today's rule does, `usize::MAX` never past a decode's 64 rows),
/// at every token count where today's rule sends the shape to split-K. Prints each
/// pair and which is faster: the data for `split_k_pays`'s divisor. Both paths give
/// the same bits (`cuda_parity`), so the rule is speed alone.
#[test]
#[ignore]
fn split_k_rule_timing() {
    let Some(g) = gpu() else { return };
    let mut pre = g.zeros::<u8>(4 << 30).unwrap();
    let pre = &mut pre;
    let sms = g.sm_count();
    // (name, K, N): 0.6B, then 8B widths.
    let shapes: &[(&str, usize, usize)] = &[
        ("0.6B k/v", 1024, 1024),
        ("0.6B o", 2048, 1024),
        ("0.6B down", 3072, 1024),
        ("0.6B q", 1024, 2048),
        ("0.6B gate/up", 1024, 3072),
        ("8B k/v", 4096, 1024),
        ("8B q/o", 4096, 4096),
        ("8B down", 12288, 4096),
    ];
    for &(name, k, n) in shapes {
        for m in [128usize, 256, 384, 512, 768, 1024, 1152, 1536, 2048] {
            let tiles = m.div_ceil(128) * n.div_ceil(128);
            if tiles >= sms {
                continue;
            }
            let (x, w, res) = (
                rand_dev(&g, m * k, 1, 2.0),
                rand_dev(&g, n * k, 2, 0.05),
                rand_dev(&g, m * n, 3, 1.0),
            );
            for (flow, prec) in [
                (Flow::Bf16, GemmPrecision::Bf16),
                (Flow::Fp8, GemmPrecision::Fp8),
            ] {
                let gw = glin::GpuWeight::prepare(&g, &w, n, k, flow).unwrap();
                let mut t = [[0.0f64; 2]; 2];
                for (i, div) in [1usize, usize::MAX].into_iter().enumerate() {
                    gemv::set_split_k_div(div);
                    let xo = &mut glin::XOperand::default();
                    let layer = [(&gw, None)];
                    drop(glin::linear_forward_group_act(&g, &x, xo, m, &layer, prec).unwrap());
                    t[i][0] = time_us(&g, pre, 20, |_| {
                        drop(glin::linear_forward_group_act(&g, &x, xo, m, &layer, prec).unwrap())
                    });
                    t[i][1] = time_us(&g, pre, 20, |_| {
                        drop(glin::linear_forward_residual(&g, &x, xo, m, &gw, prec, &res).unwrap())
                    });
                }
                gemv::set_split_k_div(0);
                let win = |s: f64, r: f64| if s < r { "split-K" } else { "rows" };
                println!(
                    "TIMING split-K rule {flow:<4} {name:<12} {m:>5}x{k}x{n} ({tiles:>3} tiles): act split-K {:7.1} us rows {:7.1} us ({}) | residual split-K {:7.1} us rows {:7.1} us ({})",
                    t[0][0],
                    t[1][0],
                    win(t[0][0], t[1][0]),
                    t[0][1],
                    t[1][1],
                    win(t[0][1], t[1][1]),
                );
            }
        }
    }
}
