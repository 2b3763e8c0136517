//! The CUDA path against the CPU reference, op by op, on random inputs with edge
//! shapes (K = 896: 7 groups, not a multiple of 4 groups; M = 130: not a multiple
//! of 128 or 16). Without CUDA every test prints "skipping: no CUDA device: ..."
//! and passes. Run on a GPU machine with `--test-threads=1 --nocapture`; each check
//! prints a `PARITY` line with the measured error before asserting its bound.
//!
//! Errors are norm-wise relative, ||gpu - cpu|| / ||cpu||, unless "bit-exact".

use jet_kernels::cuda::act::{Act, ActRef};
use jet_kernels::cuda::{
    self, adamw as gadam, attention as gatt, draw as gdraw, gemm, gemv, linear as glin,
    logsoftmax as glsm, ops as gops, quantize as gq, row_map as grm, sample as gsam,
    sample_top as gtop, tensor as gten,
};
use jet_kernels::fp8::{decode, fp8_gemm, Fp8Matrix, Fp8Operand, Grouping};
use jet_kernels::ops::{attention, embedding, linear, logsoftmax, rmsnorm, rope, swiglu};
use jet_kernels::{bf16, Flow, GemmPrecision};
use rand::{Rng, SeedableRng};

mod common;
use common::*;

/// Codes and scale bits, GPU against CPU.
fn diff_q(gq: &Fp8Matrix, cq: &Fp8Matrix) -> usize {
    assert_eq!(
        (gq.rows, gq.cols, gq.scales.len()),
        (cq.rows, cq.cols, cq.scales.len())
    );
    let codes = gq
        .codes
        .iter()
        .zip(&cq.codes)
        .filter(|(a, b)| a != b)
        .count();
    let scales = gq
        .scales
        .iter()
        .zip(&cq.scales)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    codes + scales
}

/// Random values over many magnitudes, with a zero group, NaN, inf and tiny values.
fn nasty(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut x: Vec<f32> = (0..rows * cols)
        .map(|_| r.random_range(-1.0f32..1.0) * 10f32.powi(r.random_range(-8..3)))
        .collect();
    if rows > 3 && cols > 130 {
        x[cols..cols + 128].iter_mut().for_each(|v| *v = 0.0); // row 1, group 0 all zero
        x[2 * cols + 5] = f32::NAN;
        x[3 * cols + 129] = f32::INFINITY;
        x[3 * cols + 130] = -2.5;
        x[3 * cols] = -1e-30;
    }
    x
}

/// BF16 codes of `x` as held WGrad outputs, with -0 and +0 at every `every`-th
/// value (the first two of each run of `every`).
fn bf16_with_zeros(x: &[f32], every: usize) -> Vec<u16> {
    x.iter()
        .enumerate()
        .map(|(i, v)| match i % every {
            0 => 0x8000,
            1 => 0,
            _ => half::bf16::from_f32(*v).to_bits(),
        })
        .collect()
}

/// Both groupings of one pass (dY's DGrad and WGrad operands) against the CPU's.
fn dual_is_bit_exact(g: &cuda::Gpu, x: &[f32], rows: usize, cols: usize) {
    let (r, c) = gq::quantize_dual(g, &up(g, x), rows, cols).unwrap();
    let shape = format!("[{rows}, {cols}]");
    let cpu = |grouping| Fp8Matrix::quantize(x, rows, cols, grouping);
    report_exact(
        "quantize 1x128 + 128x1^T in one pass",
        &shape,
        diff_q(&r.to_host(g).unwrap(), &cpu(Grouping::Row1x128))
            + diff_q(&c.to_host(g).unwrap(), &cpu(Grouping::Col128x1)),
    );
}

/// `quantize_block128_multi` of several weights in one launch writes each one's
/// buffers as `quantize_block128` of it alone, byte for byte, the scales' stride
/// padding included (zeros, written by the kernels: nothing else clears them).
fn block128_multi_is_each(g: &cuda::Gpu) {
    let shapes = [(130, 896), (7, 300), (256, 136), (300, 1000), (1, 4096)];
    let xs: Vec<_> = shapes
        .iter()
        .map(|&(r, c)| up(g, &nasty(r, c, (r * 7 + c) as u64)))
        .collect();
    let ws: Vec<_> = xs
        .iter()
        .zip(&shapes)
        .map(|(x, &(r, c))| (x, r, c))
        .collect();
    for transposed in [false, true] {
        let many = gq::quantize_block128_multi(g, &ws, transposed).unwrap();
        let mut differ = 0;
        for ((got, got_t), &(x, r, c)) in many.iter().zip(&ws) {
            let (want, want_t) = gq::quantize_block128(g, x, r, c, transposed).unwrap();
            let mut pairs = vec![(got, &want)];
            if let (Some(a), Some(b)) = (got_t, want_t.as_ref()) {
                pairs.push((a, b));
            }
            assert_eq!(got_t.is_some(), transposed);
            for (a, b) in pairs {
                let (ac, bc) = (g.download(&a.codes).unwrap(), g.download(&b.codes).unwrap());
                let n = b.scales.len();
                let (asc, bsc) = (dl(g, &a.scales, n), dl(g, &b.scales, n));
                differ += ac.iter().zip(&bc).filter(|(x, y)| x != y).count();
                differ += bits_differ(&asc, &bsc);
                // The padding of each scale row (entries past ceil(K/128)) is 0.
                let kb = a.cols.div_ceil(128);
                differ += asc
                    .chunks(a.lds)
                    .flat_map(|row| &row[kb..])
                    .filter(|v| v.to_bits() != 0)
                    .count();
            }
        }
        report_exact(
            "quantize 128x128 of 5 weights in one launch == each alone",
            &format!("transposed {transposed}"),
            differ,
        );
    }
}

/// `quantize_dual_multi` of several matrices in one launch writes each one's
/// operands as `quantize_dual` (or `quantize_col128x1`) of it alone, byte for byte.
fn dual_multi_is_each(g: &cuda::Gpu) {
    let shapes = [
        (130, 896, true),
        (7, 300, false),
        (259, 203, true),
        (300, 1000, false),
    ];
    let xs: Vec<_> = shapes
        .iter()
        .map(|&(r, c, _)| up(g, &nasty(r, c, (r * 5 + c) as u64)))
        .collect();
    let args: Vec<_> = xs
        .iter()
        .zip(&shapes)
        .map(|(x, &(r, c, d))| (x, r, c, d))
        .collect();
    let refs: Vec<_> = args
        .iter()
        .map(|&(x, r, c, d)| (x.into(), r, c, d))
        .collect();
    let many = gq::quantize_dual_multi(g, &refs).unwrap();
    let same = |a: &gq::Fp8Quantized, b: &gq::Fp8Quantized| {
        let (ac, bc) = (g.download(&a.codes).unwrap(), g.download(&b.codes).unwrap());
        let n = b.scales.len();
        assert_eq!((ac.len(), a.scales.len()), (bc.len(), n));
        ac.iter().zip(&bc).filter(|(x, y)| x != y).count()
            + bits_differ(&dl(g, &a.scales, n), &dl(g, &b.scales, n))
    };
    let mut differ = 0;
    for ((row, col), &(x, r, c, dual)) in many.iter().zip(&args) {
        assert_eq!(row.is_some(), dual);
        match row {
            Some(row) => {
                let (wr, wc) = gq::quantize_dual(g, x, r, c).unwrap();
                differ += same(row, &wr) + same(col, &wc);
            }
            None => differ += same(col, &gq::quantize_col128x1(g, x, r, c).unwrap()),
        }
    }
    report_exact(
        "quantize 1x128 + 128x1 of 4 matrices in one launch == each alone",
        "2 dual, 2 128x1 only",
        differ,
    );
    // BF16 inputs (a gradient stored as its rounded values) quantize as their f32
    // widening, beside f32 ones in one launch; 259 x 203 takes the scalar loads.
    let mut differ = 0;
    for &(r, c) in &[(130, 896), (259, 203)] {
        let v: Vec<f32> = nasty(r, c, (r + c) as u64)
            .iter()
            .map(|&x| bf16::round(x))
            .collect();
        let bits: Vec<u16> = v
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect();
        let (xf, xb) = (up(g, &v), g.upload(&bits).unwrap());
        let both = gq::quantize_dual_multi(
            g,
            &[((&xb).into(), r, c, true), ((&xf).into(), r, c, false)],
        )
        .unwrap();
        let (wr, wc) = gq::quantize_dual(g, &xf, r, c).unwrap();
        differ +=
            same(both[0].0.as_ref().unwrap(), &wr) + same(&both[0].1, &wc) + same(&both[1].1, &wc);
        // BF16 alone: the launch takes quant_dual_multi_bf16 (the mixed one above the
        // kernel of both forms, the f32 ones before it quant_dual_multi_f32).
        let only = gq::quantize_dual_multi(
            g,
            &[((&xb).into(), r, c, false), ((&xb).into(), r, c, true)],
        )
        .unwrap();
        differ +=
            same(&only[0].1, &wc) + same(only[1].0.as_ref().unwrap(), &wr) + same(&only[1].1, &wc);
    }
    report_exact(
        "quantize 1x128 + 128x1 of BF16 values in one launch (alone and beside f32) == of their f32",
        "[130, 896], [259, 203]",
        differ,
    );
}

#[test]
fn quantize_is_bit_exact() {
    let Some(g) = gpu() else { return };
    for (rows, cols) in [(130, 896), (7, 300), (1, 4096), (256, 136)] {
        let x = nasty(rows, cols, rows as u64 * 31 + cols as u64);
        let dx = up(&g, &x);
        let shape = format!("[{rows}, {cols}]");
        let q = gq::quantize_row1x128(&g, &dx, rows, cols)
            .unwrap()
            .to_host(&g)
            .unwrap();
        report_exact(
            "quantize 1x128 (codes+scales)",
            &shape,
            diff_q(&q, &Fp8Matrix::quantize(&x, rows, cols, Grouping::Row1x128)),
        );
        let q = gq::quantize_col128x1(&g, &dx, rows, cols)
            .unwrap()
            .to_host(&g)
            .unwrap();
        report_exact(
            "quantize 128x1^T (codes+scales)",
            &shape,
            diff_q(&q, &Fp8Matrix::quantize(&x, rows, cols, Grouping::Col128x1)),
        );
        dual_is_bit_exact(&g, &x, rows, cols);
        let (q, qt) = gq::quantize_block128(&g, &dx, rows, cols, true).unwrap();
        let cpu = Fp8Matrix::quantize(&x, rows, cols, Grouping::Block128);
        report_exact(
            "quantize 128x128 (codes+scales)",
            &shape,
            diff_q(&q.to_host(&g).unwrap(), &cpu),
        );
        let xt: Vec<f32> = (0..cols * rows)
            .map(|i| x[(i % rows) * cols + i / rows])
            .collect();
        let cpu_t = Fp8Matrix::quantize(&xt, cols, rows, Grouping::Block128);
        report_exact(
            "quantize 128x128 of W^T",
            &shape,
            diff_q(&qt.unwrap().to_host(&g).unwrap(), &cpu_t),
        );
        // BF16 input: the same numbers as f32.
        let xb: Vec<f32> = x.iter().map(|&v| bf16::round(v)).collect();
        let bits: Vec<u16> = xb
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect();
        let q = gq::quantize_row1x128_bf16(&g, &g.upload(&bits).unwrap(), rows, cols)
            .unwrap()
            .to_host(&g)
            .unwrap();
        report_exact(
            "quantize 1x128 from BF16",
            &shape,
            diff_q(
                &q,
                &Fp8Matrix::quantize(&xb, rows, cols, Grouping::Row1x128),
            ),
        );
    }
    block128_multi_is_each(&g);
    dual_multi_is_each(&g);
    // Columns not a multiple of 4 (scalar loads) and more than one row tile.
    dual_is_bit_exact(&g, &nasty(259, 203, 5), 259, 203);
    // More tiles than a GPU has SMs (blocks in more than one wave): 16-byte loads with
    // a partial last group, and scalar loads (a row stride not a multiple of 4).
    dual_is_bit_exact(&g, &nasty(1030, 2100, 6), 1030, 2100);
    dual_is_bit_exact(&g, &nasty(600, 4099, 7), 600, 4099);
    done();
}

/// Every E4M3 midpoint and its neighbours one f32 ulp away, both signs, at scale 1
/// (each row starts with 448, so amax / 448 = 1 exactly).
#[test]
fn quantize_rounds_every_midpoint_like_the_cpu() {
    let Some(g) = gpu() else { return };
    let mut pos: Vec<f32> = (0..=0x7eu8).map(decode).collect();
    pos.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mut vals = vec![];
    for w in pos.windows(2) {
        let mid = (w[0] + w[1]) / 2.0;
        for v in [
            mid,
            f32::from_bits(mid.to_bits() - 1),
            f32::from_bits(mid.to_bits() + 1),
            w[0],
        ] {
            vals.extend([v, -v]);
        }
    }
    vals.extend([1e-12, -1e-12, 0.0, -0.0, 500.0, -1e9]);
    let rows = vals.len().div_ceil(127);
    let mut x = vec![0f32; rows * 128];
    for r in 0..rows {
        x[r * 128] = 448.0;
        for (j, v) in vals.iter().skip(r * 127).take(127).enumerate() {
            x[r * 128 + 1 + j] = *v;
        }
    }
    let cpu = Fp8Matrix::quantize(&x, rows, 128, Grouping::Row1x128);
    let dx = up(&g, &x);
    let n = format!("{} values", vals.len());
    let q = gq::quantize_row1x128(&g, &dx, rows, 128).unwrap();
    report_exact(
        "E4M3 midpoints, +-1 ulp, +-0 (cvt)",
        &n,
        diff_q(&q.to_host(&g).unwrap(), &cpu),
    );
    let q = gq::quantize_row1x128_sw(&g, &dx, rows, 128).unwrap();
    report_exact(
        "E4M3 midpoints (software encoder)",
        &n,
        diff_q(&q.to_host(&g).unwrap(), &cpu),
    );
    let x = nasty(130, 896, 77);
    let q = gq::quantize_row1x128_sw(&g, &up(&g, &x), 130, 896).unwrap();
    let cpu = Fp8Matrix::quantize(&x, 130, 896, Grouping::Row1x128);
    report_exact(
        "quantize 1x128 (software encoder)",
        "[130, 896]",
        diff_q(&q.to_host(&g).unwrap(), &cpu),
    );
    done();
}

/// The quantizers divide by a group's scale through its reciprocal and an exact
/// residual correction (`qdiv`, quantize.cu); the E4M3 code can only differ from
/// the CPU's division where a quotient sits next to a rounding midpoint. Each
/// 128 x 128 tile here has one scale (amax on its diagonal, so every row, column
/// and block of it shares it), and holds the f32 values nearest each E4M3 midpoint
/// times that scale and their neighbours up to two ulps away, both signs: every
/// grouping, against the CPU, bit for bit. The scales span the f32 range,
/// including a subnormal one (the division's own path).
#[test]
fn quantize_rounds_midpoints_at_any_scale() {
    let Some(g) = gpu() else { return };
    let mut pos: Vec<f32> = (0..=0x7eu8).map(decode).collect();
    pos.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mut amaxes = vec![
        492.8f32, 448.0, 1.0, 3.7e-5, 1.3e-20, 2.9e30, 0.3333, 6e-36, 1e-38, 3e38,
    ];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(91);
    amaxes.extend(
        (0..6).map(|_| rng.random_range(1.0f32..2.0) * 2f32.powi(rng.random_range(-60..60))),
    );
    let (t, n) = (amaxes.len(), 128);
    let mut x = vec![0f32; t * n * n];
    for (ti, &amax) in amaxes.iter().enumerate() {
        let s = amax / 448.0;
        let mut cands = vec![];
        for w in pos.windows(2) {
            let v0 = (w[0] + w[1]) / 2.0 * s;
            for d in -2i32..=2 {
                let v = f32::from_bits((v0.to_bits() as i32 + d) as u32);
                if v.is_finite() && v.abs() <= amax {
                    cands.extend([v, -v]);
                }
            }
        }
        let mut k = 0;
        for i in 0..n {
            for j in 0..n {
                x[(ti * n + i) * n + j] = if i == j {
                    amax
                } else {
                    k += 1;
                    cands[k % cands.len()]
                };
            }
        }
    }
    let rows = t * n;
    let shape = format!("{t} scales, [{rows}, {n}]");
    let cpu = |x: &[f32], rows, cols, grouping| Fp8Matrix::quantize(x, rows, cols, grouping);
    let dx = up(&g, &x);
    let q = gq::quantize_row1x128(&g, &dx, rows, n).unwrap();
    report_exact(
        "midpoints x scale, 1x128",
        &shape,
        diff_q(
            &q.to_host(&g).unwrap(),
            &cpu(&x, rows, n, Grouping::Row1x128),
        ),
    );
    let q = gq::quantize_col128x1(&g, &dx, rows, n).unwrap();
    report_exact(
        "midpoints x scale, 128x1^T",
        &shape,
        diff_q(
            &q.to_host(&g).unwrap(),
            &cpu(&x, rows, n, Grouping::Col128x1),
        ),
    );
    dual_is_bit_exact(&g, &x, rows, n);
    let (q, _) = gq::quantize_block128(&g, &dx, rows, n, false).unwrap();
    report_exact(
        "midpoints x scale, 128x128",
        &shape,
        diff_q(
            &q.to_host(&g).unwrap(),
            &cpu(&x, rows, n, Grouping::Block128),
        ),
    );
    // The scale itself (amax / 448, by a correction of amax 2^-6 times RN(1/7) from
    // 2^-94 up): 8,192 groups whose largest magnitude is any positive finite f32.
    let rows = 8192;
    let mut y = vec![0f32; rows * n];
    for r in 0..rows {
        let amax = f32::from_bits(rng.random_range(1u32..0x7f80_0000));
        y[r * n] = amax;
        for v in &mut y[r * n + 1..(r + 1) * n] {
            *v = amax * rng.random_range(-1.0f32..1.0);
        }
    }
    let q = gq::quantize_row1x128(&g, &up(&g, &y), rows, n).unwrap();
    report_exact(
        "scales of any amax, 1x128",
        &format!("[{rows}, {n}]"),
        diff_q(
            &q.to_host(&g).unwrap(),
            &cpu(&y, rows, n, Grouping::Row1x128),
        ),
    );
    done();
}

/// cuBLASLt VEC128 x BLK128x128 (and VEC x VEC) and the decode kernel against
/// `fp8_gemm` on the same quantized operands. Products of E4M3 values are exact.
/// The decode kernel (mma.sync, f32 accumulators) differs only in summation order:
/// 1e-5. cuBLASLt's Hopper FP8 kernels (wgmma) add the products of each 128-group
/// in the tensor core's own accumulator, narrower than f32 (measured 1.1e-4 on an
/// H200; the same effect DeepSeek-V3 reports), before the f32 scaled sum: 3e-4.
const LT_FP8_BOUND: f64 = 3e-4;

#[test]
fn fp8_gemm_matches_cpu() {
    let Some(g) = gpu() else { return };
    for (m, k, n) in [(130, 896, 136), (256, 1024, 512), (64, 4096, 256)] {
        let shape = format!("{m}x{k}x{n}");
        let (x, w, dy) = (rnd(m * k, 1, 2.0), rnd(n * k, 2, 0.05), rnd(m * n, 3, 1.0));
        let (dx, dw, ddy) = (up(&g, &x), up(&g, &w), up(&g, &dy));
        let (qw, qwt) = gq::quantize_block128(&g, &dw, n, k, true).unwrap();
        let qwt = qwt.unwrap();
        let cqw = Fp8Matrix::quantize(&w, n, k, Grouping::Block128);
        // forward
        let qx = gq::quantize_row1x128(&g, &dx, m, k).unwrap();
        let (y, ld) = gemm::fp8_gemm_nt(&g, &qx, &qw).unwrap();
        let yg = unpad(&dl(&g, &y, qx.rows_pad * ld), m, n, ld);
        let cqx = Fp8Matrix::quantize(&x, m, k, Grouping::Row1x128);
        report(
            "FP8 GEMM fwd (1x128 x 128x128)",
            &shape,
            rel(
                &yg,
                &fp8_gemm(Fp8Operand::plain(&cqx), Fp8Operand::plain(&cqw)),
            ),
            LT_FP8_BOUND,
        );
        // the decode kernel on the same operands
        for mm in [1usize, 5, 16, 33, 64, 130] {
            let mm = mm.min(m);
            let qxs = gq::quantize_row1x128(&g, &dx, mm, k).unwrap();
            let cq = Fp8Matrix::quantize(&x[..mm * k], mm, k, Grouping::Row1x128);
            let want = fp8_gemm(Fp8Operand::plain(&cq), Fp8Operand::plain(&cqw));
            // mma.sync sums a group's products exactly in f32; wgmma's E4M3 steps
            // keep fewer bits, as cuBLASLt's do on this hardware.
            let (sk, sk_bound) = if g.wgmma() {
                ("FP8 decode GEMV split-K (wgmma)", LT_FP8_BOUND)
            } else {
                ("FP8 decode GEMV split-K (mma)", 1e-5)
            };
            for (kern, name, bound) in [
                (gemv::GemvKernel::SplitK, sk, sk_bound),
                (
                    gemv::GemvKernel::Tiled(None),
                    "FP8 decode GEMV tiled (mma)",
                    1e-5,
                ),
            ] {
                let mut yd = g.zeros::<f32>(mm * n).unwrap();
                gemv::gemv_fp8_with(&g, &qxs, &qw, &mut yd, n, gemv::GEMV_MAX_TOKENS, kern)
                    .unwrap();
                let err = rel(&dl(&g, &yd, mm * n), &want);
                report(name, &format!("{mm}x{k}x{n}"), err, bound);
            }
        }
        // DGrad: dy 1x128 x W^T blocks
        let qdy = gq::quantize_row1x128(&g, &ddy, m, n).unwrap();
        let (y, ld) = gemm::fp8_gemm_nt(&g, &qdy, &qwt).unwrap();
        let cqdy = Fp8Matrix::quantize(&dy, m, n, Grouping::Row1x128);
        let want = fp8_gemm(Fp8Operand::plain(&cqdy), Fp8Operand::t(&cqw));
        report(
            "FP8 GEMM DGrad (1x128 x W^T blk)",
            &shape,
            rel(&unpad(&dl(&g, &y, qdy.rows_pad * ld), m, k, ld), &want),
            LT_FP8_BOUND,
        );
        // WGrad: dy^T x, both 128x1 along tokens
        let (a, b) = (
            gq::quantize_col128x1(&g, &ddy, m, n).unwrap(),
            gq::quantize_col128x1(&g, &dx, m, k).unwrap(),
        );
        let (y, ld) = gemm::fp8_gemm_nt(&g, &a, &b).unwrap();
        let (ca, cb) = (
            Fp8Matrix::quantize(&dy, m, n, Grouping::Col128x1),
            Fp8Matrix::quantize(&x, m, k, Grouping::Col128x1),
        );
        let want = fp8_gemm(Fp8Operand::t(&ca), Fp8Operand::t(&cb));
        report(
            "FP8 GEMM WGrad (128x1 x 128x1)",
            &shape,
            rel(&unpad(&dl(&g, &y, a.outer_pad() * ld), n, k, ld), &want),
            LT_FP8_BOUND,
        );
    }
    done();
}

/// The backward's GEMMs write BF16 (cuBLASLt's rounding of its f32 accumulation):
/// the bits of rounding the f32 output to nearest even, for DGrad and WGrad in FP8
/// and BF16 at the training shapes (cuBLASLt may pick another algorithm for another
/// output type; the count of values that differ says whether it did).
#[test]
fn gemm_bf16_output_is_the_rounded_f32() {
    let Some(g) = gpu() else { return };
    let rne = |v: &[f32]| -> Vec<u16> {
        v.iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect()
    };
    for (m, k, n) in [(130, 896, 136), (4096, 1024, 3072), (4096, 2048, 1024)] {
        let shape = format!("{m}x{k}x{n}");
        let (x, w, dy) = (
            rnd(m * k, 11, 2.0),
            rnd(n * k, 12, 0.05),
            rnd(m * n, 13, 1.0),
        );
        let (dx, dw, ddy) = (up(&g, &x), up(&g, &w), up(&g, &dy));
        let (_, qwt) = gq::quantize_block128(&g, &dw, n, k, true).unwrap();
        let qwt = qwt.unwrap();
        let (qdy, qdyt) = gq::quantize_dual(&g, &ddy, m, n).unwrap();
        let qxt = gq::quantize_col128x1(&g, &dx, m, k).unwrap();
        let mut differ = 0;
        for (a, b) in [(&qdy, &qwt), (&qdyt, &qxt)] {
            let (y, ld) = gemm::fp8_gemm_nt(&g, a, b).unwrap();
            let (yb, ldb) = gemm::fp8_gemm_nt_bf16(&g, a, b).unwrap();
            assert_eq!(ld, ldb);
            let want = rne(&dl(&g, &y, a.outer_pad() * ld));
            let got = g.download(&yb).unwrap();
            differ += got.iter().zip(&want).filter(|(p, q)| p != q).count();
        }
        report_exact(
            "FP8 DGrad + WGrad, BF16 out == f32 out rounded",
            &shape,
            differ,
        );
        // BF16 operands: dy [m, n] x W [n, k] and dy^T [n, m] x X [m, k].
        let (np, kp) = (cuda::pad16(n), cuda::pad16(k));
        let b16 = |t, r, c, cp| gq::to_bf16_padded(&g, t, r, c, r, cp).unwrap();
        let (dyb, wb, xb) = (b16(&ddy, m, n, np), b16(&dw, n, k, kp), b16(&dx, m, k, kp));
        let dense = |s: &cudarc::driver::CudaSlice<u16>, r, c, ld| gemm::Dense {
            ptr: s.device_ptr(g.stream()).0,
            ty: gemm::LtType::Bf16,
            rows: r,
            cols: c,
            ld,
        };
        let mut differ = 0;
        for (ta, b, p) in [
            (false, dense(&wb, n, k, kp), m),
            (true, dense(&xb, m, k, kp), n),
        ] {
            let a = dense(&dyb, m, n, np); // dy, as A (DGrad) or A^T (WGrad)
            let y = g.zeros::<f32>(p * kp).unwrap();
            let yp = y.device_ptr(g.stream()).0;
            gemm::dense_gemm(&g, a, ta, b, false, yp, kp).unwrap();
            let yb = g.zeros::<u16>(p * kp).unwrap();
            let out = (yb.device_ptr(g.stream()).0, kp, gemm::LtType::Bf16);
            gemm::dense_gemm_to(&g, (a, ta), (b, false), out).unwrap();
            let want = rne(&dl(&g, &y, p * kp));
            let got = g.download(&yb).unwrap();
            differ += (0..p)
                .flat_map(|r| r * kp..r * kp + k)
                .filter(|&i| got[i] != want[i])
                .count();
        }
        report_exact(
            "BF16 DGrad + WGrad, BF16 out == f32 out rounded",
            &shape,
            differ,
        );
    }
    done();
}

fn unpad(y: &[f32], rows: usize, cols: usize, ld: usize) -> Vec<f32> {
    (0..rows)
        .flat_map(|r| y[r * ld..r * ld + cols].iter().copied())
        .collect()
}

/// The linear layer of each precision against `ops::linear` (outputs and gradients
/// rounded to BF16 in the low-precision modes, so single values can differ by a
/// BF16 ulp where the f32 sums straddle a rounding boundary): F32 1e-5, BF16 and
/// FP8 1e-2 (measured far below).
#[test]
fn linear_layer_matches_cpu() {
    let Some(g) = gpu() else { return };
    for (m, k, n) in [(130, 896, 136), (8, 896, 136), (64, 256, 100)] {
        let shape = format!("{m}x{k}x{n}");
        let (x, w, b, dy) = (
            rnd(m * k, 5, 1.0),
            rnd(n * k, 6, 0.05),
            rnd(n, 7, 0.5),
            rnd(m * n, 8, 1.0),
        );
        let (dx, db, ddy) = (up(&g, &x), up(&g, &b), up(&g, &dy));
        for (flow, prec, bound) in [
            (Flow::F32, GemmPrecision::F32, 1e-5),
            (Flow::Bf16, GemmPrecision::Bf16, 1e-2),
            (Flow::Fp8, GemmPrecision::Fp8, 1e-2),
        ] {
            let gw = glin::GpuWeight::from_host(&g, &w, n, k, flow).unwrap();
            let cw = linear::PreparedWeight::prepare(&w, n, k, flow);
            let y = glin::linear_forward(&g, &dx, m, &gw, Some(&db), prec).unwrap();
            let want = linear::linear_forward(&x, m, &cw, Some(&b), prec);
            report(
                &format!("linear {flow} forward (+bias)"),
                &shape,
                rel(&dl(&g, &y, m * n), &want),
                bound,
            );
            let gr = glin::linear_backward(&g, &ddy, &dx, m, &gw, true, prec, prec).unwrap();
            let cr = linear::linear_backward(&dy, &x, m, &cw, true, prec, prec);
            report(
                &format!("linear {flow} DGrad"),
                &shape,
                rel(&dl(&g, &gr.dx, m * k), &cr.dx),
                bound,
            );
            report(
                &format!("linear {flow} WGrad"),
                &shape,
                rel(&dl(&g, &gr.dw, n * k), &cr.dw),
                bound,
            );
            report(
                &format!("linear {flow} bias grad"),
                &shape,
                rel(&dl(&g, gr.db.as_ref().unwrap(), n), cr.db.as_ref().unwrap()),
                bound,
            );
            // dy given as its BF16 operand: the bits of dy given in f32 (BF16
            // GEMMs); refused by the others.
            let dyb = gq::to_bf16_padded(&g, &ddy, m, n, m, cuda::pad16(n)).unwrap();
            let gacc = |x: &[f32]| cuda::grad::GradAcc::from_f32(up(&g, x));
            let (mut acc_f, mut acc_b) = (gacc(&w), gacc(&w));
            let (precs, xi) = ((prec, prec), &mut glin::XOperand::default());
            let dx_f = glin::linear_backward_into(
                &g,
                (glin::Dy::F32(&ddy), (&dx).into(), m),
                &gw,
                precs,
                &mut acc_f,
                xi,
            );
            let xi = &mut glin::XOperand::default();
            let dx_b = glin::linear_backward_into(
                &g,
                (glin::Dy::Bf16(&dyb), (&dx).into(), m),
                &gw,
                precs,
                &mut acc_b,
                xi,
            );
            match prec {
                GemmPrecision::Bf16 => report_exact(
                    "linear bf16 backward, dy as its BF16 operand",
                    &shape,
                    bits_differ(
                        &dl(&g, &dx_f.unwrap(), m * k),
                        &dl(&g, &dx_b.unwrap(), m * k),
                    ) + bits_differ(
                        &dl(&g, acc_f.f32_mut(&g).unwrap(), n * k),
                        &dl(&g, acc_b.f32_mut(&g).unwrap(), n * k),
                    ),
                ),
                _ => assert!(
                    dx_b.err()
                        .map(|e| e.to_string())
                        .unwrap_or_default()
                        .contains("BF16 dy"),
                    "a {flow} backward must refuse a BF16 dy"
                ),
            }
        }
        // The BF16 GEMM itself, before rounding: bound 1e-5 against f32 sums of
        // the same BF16-rounded operands.
        let (xb, wb) = (bf16::rounded(&x), bf16::rounded(&w));
        let (pxb, pwb) = (
            gq::to_bf16_padded(&g, &dx, m, k, m, cuda::pad16(k)).unwrap(),
            gq::to_bf16_padded(&g, &up(&g, &w), n, k, n, cuda::pad16(k)).unwrap(),
        );
        let d = g.zeros::<f32>(m * n).unwrap();
        let dense = |s: &cudarc::driver::CudaSlice<u16>, r| gemm::Dense {
            ptr: s.device_ptr(g.stream()).0,
            ty: gemm::LtType::Bf16,
            rows: r,
            cols: k,
            ld: cuda::pad16(k),
        };
        gemm::dense_gemm(
            &g,
            dense(&pxb, m),
            false,
            dense(&pwb, n),
            true,
            d.device_ptr(g.stream()).0,
            n,
        )
        .unwrap();
        report(
            "BF16 GEMM (f32 out, pre-rounding)",
            &shape,
            rel(
                &dl(&g, &d, m * n),
                &jet_kernels::gemm::matmul_nt(&xb, &wb, m, k, n),
            ),
            1e-5,
        );
    }
    done();
}

use cudarc::driver::DevicePtr;

#[test]
fn embedding_matches_cpu() {
    let Some(g) = gpu() else { return };
    let (vocab, dim) = (1000, 896);
    let table = rnd(vocab * dim, 10, 1.0);
    let tokens: Vec<u32> = (0..130).map(|i| (i * 37 % 50) as u32).collect();
    let y = gops::embedding_forward(&g, &up(&g, &table), vocab, dim, &tokens).unwrap();
    let want = embedding::embedding_forward(&table, dim, &tokens);
    report_exact(
        "embedding fwd",
        "130 tokens, dim 896",
        dl(&g, &y, 130 * dim)
            .iter()
            .zip(&want)
            .filter(|(a, b)| a != b)
            .count(),
    );
    let dy = rnd(130 * dim, 11, 1.0);
    let start = rnd(vocab * dim, 12, 1.0);
    let mut dt = up(&g, &start);
    gops::embedding_backward(&g, &mut dt, vocab, dim, &tokens, &up(&g, &dy)).unwrap();
    let mut want = start.clone();
    embedding::embedding_backward(&mut want, dim, &tokens, &dy);
    report_exact(
        "embedding bwd (+=, token order)",
        "130 tokens, dim 896",
        dl(&g, &dt, vocab * dim)
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count(),
    );
    assert!(gops::embedding_forward(&g, &up(&g, &table), vocab, dim, &[3, 1000]).is_err());
    done();
}

/// `rmsnorm_bwd_rows1` with eight rows' loads in flight, and a row a block with the dw
/// terms summed after (the forms taken below one block an SM), give the bits of four
/// rows in flight: dx and dw, rows a whole and a partial block, rounded or not.
#[test]
fn rmsnorm_bwd_rows_forms_give_the_same_bits() {
    let Some(g) = gpu() else { return };
    for (rows, dim) in [(256usize, 1024usize), (77, 1024), (40, 896), (2200, 512)] {
        let (x, w, dy) = (
            up(&g, &rnd(rows * dim, 30, 2.0)),
            up(&g, &rnd(dim, 31, 1.0)),
            up(&g, &rnd(rows * dim, 32, 1.0)),
        );
        let (_, rs) = gops::rmsnorm_forward(&g, &x, &w, rows, dim, 1e-6).unwrap();
        let acc0 = rnd(dim, 33, 1.0);
        for round in [false, true] {
            let run = |form: gops::Rows1| {
                let mut acc = up(&g, &acc0);
                let dx = gops::rmsnorm_backward_acc_rows1(
                    &g,
                    (&dy, &x, &w, &rs),
                    (rows, dim),
                    round,
                    &mut acc,
                    form,
                )
                .unwrap();
                (dl(&g, &dx, rows * dim), dl(&g, &acc, dim))
            };
            let (b, bw) = run(gops::Rows1::Four);
            for form in [gops::Rows1::Eight, gops::Rows1::Terms] {
                let (a, aw) = run(form);
                report_exact(
                    &format!("rmsnorm bwd rows, {form:?} == four rows in flight (round {round})"),
                    &format!("[{rows}, {dim}]"),
                    bits_differ(&a, &b) + bits_differ(&aw, &bw),
                );
            }
        }
    }
    done();
}

/// Sums over a row run as a tree on the GPU and in order on the CPU: 1e-5 (the
/// backward's rows of 128 a warp each, the others 16 rows a block of 256 threads,
/// `rmsnorm_bwd_rows`: 896 and 192 leave threads idle, 4,096 takes four float4
/// groups a thread).
#[test]
fn rmsnorm_matches_cpu() {
    let Some(g) = gpu() else { return };
    let shapes = [
        (130, 896),
        (130 * 4, 128),
        (3, 4096),
        (70, 1024),
        (9, 192),
        (33, 2048),
        (2, 8192),
    ];
    for (rows, dim) in shapes {
        let shape = format!("[{rows}, {dim}]");
        let (x, w, mut dy) = (
            rnd(rows * dim, 20, 2.0),
            rnd(dim, 21, 1.0),
            rnd(rows * dim, 22, 1.0),
        );
        // Signed zeros: a row of -0 gradients, half of another.
        dy[..dim].iter_mut().for_each(|v| *v = -0.0);
        dy[dim..dim + dim / 2].iter_mut().for_each(|v| *v = -0.0);
        let (dx, dw) = (up(&g, &x), up(&g, &w));
        let (y, rs) = gops::rmsnorm_forward(&g, &dx, &dw, rows, dim, 1e-6).unwrap();
        let (cy, crs) = rmsnorm::rmsnorm_forward(&x, &w, rows, dim, 1e-6);
        report(
            "rmsnorm fwd y",
            &shape,
            rel(&dl(&g, &y, rows * dim), &cy),
            1e-5,
        );
        report(
            "rmsnorm fwd rstd",
            &shape,
            rel(&dl(&g, &rs, rows), &crs),
            1e-5,
        );
        let ddy = up(&g, &dy);
        let (gdx, gdw) =
            gops::rmsnorm_backward(&g, &ddy, &dx, &dw, &rs, (rows, dim), (false, None)).unwrap();
        let (cdx, cdw) = rmsnorm::rmsnorm_backward(&dy, &x, &w, &crs, rows, dim);
        // Rounded to BF16 and a residual added, in the kernel: the bits of the
        // unfused round + add_into.
        let res = up(&g, &rnd(rows * dim, 19, 1.0));
        let (fdx, fdw) =
            gops::rmsnorm_backward(&g, &ddy, &dx, &dw, &rs, (rows, dim), (true, Some(&res)))
                .unwrap();
        let (mut want_dx, mut want_dw) = (gdx.clone(), gdw.clone());
        gten::round_bf16(&g, &mut want_dx, rows * dim).unwrap();
        gten::add_into(&g, &mut want_dx, &res, rows * dim).unwrap();
        gten::round_bf16(&g, &mut want_dw, dim).unwrap();
        report_exact(
            "rmsnorm bwd rounded + residual == round, add_into",
            &shape,
            bits_differ(&dl(&g, &fdx, rows * dim), &dl(&g, &want_dx, rows * dim))
                + bits_differ(&dl(&g, &fdw, dim), &dl(&g, &want_dw, dim)),
        );
        // dw added into an accumulator by the column sums' last launch: the bits
        // of add_into of the returned dw.
        let acc0 = rnd(dim, 23, 1.0);
        let mut acc = up(&g, &acc0);
        let adx = gops::rmsnorm_backward_acc(
            &g,
            (&ddy, &dx, &dw, &rs),
            (rows, dim),
            (true, Some(&res)),
            &mut acc,
        )
        .unwrap();
        let mut want_acc = up(&g, &acc0);
        gten::add_into(&g, &mut want_acc, &fdw, dim).unwrap();
        report_exact(
            "rmsnorm bwd dw accumulated == add_into",
            &shape,
            bits_differ(&dl(&g, &adx, rows * dim), &dl(&g, &fdx, rows * dim))
                + bits_differ(&dl(&g, &acc, dim), &dl(&g, &want_acc, dim)),
        );
        // dx's BF16 operand from the same kernel: the bits of the copy of dx (the
        // next projection's dy), dx itself unchanged; none for rows that would need
        // padding columns.
        let mut acc16 = up(&g, &acc0);
        let (odx, o16) = gops::rmsnorm_backward_acc_operand(
            &g,
            (&ddy, &dx, &dw, &rs),
            (rows, dim),
            (true, Some(&res)),
            &mut acc16,
            true,
        )
        .unwrap();
        let o16 = o16.expect("a BF16 operand for rows of a multiple of 16");
        let copy = gq::to_bf16_padded(&g, &odx, rows, dim, rows, dim).unwrap();
        let (a, b) = (g.download(&o16).unwrap(), g.download(&copy).unwrap());
        report_exact(
            "rmsnorm bwd dx + its BF16 operand == dx, its copy",
            &shape,
            bits_differ(&dl(&g, &odx, rows * dim), &dl(&g, &fdx, rows * dim))
                + a.iter().zip(&b).filter(|(x, y)| x != y).count()
                + bits_differ(&dl(&g, &acc16, dim), &dl(&g, &want_acc, dim)),
        );
        // dy as the in-order sum of 1-3 BF16 arrays (the DGrad outputs of the
        // projections that read the norm's output, read by the norm's kernels in
        // place of their f32 epilogues): the bits of the backward of that sum in
        // f32 (dx, its BF16 operand, dw accumulated). Signed zeros: part 0 holds
        // dy's, so -0 + -0 rows stay -0.
        for np in 1..=3usize {
            let vals: Vec<Vec<f32>> = (0..np)
                .map(|i| match i {
                    0 => dy.iter().map(|&x| jet_kernels::bf16::round(x)).collect(),
                    _ => rnd(rows * dim, 40 + i as u64, 1.0)
                        .iter()
                        .map(|&x| jet_kernels::bf16::round(x))
                        .collect(),
                })
                .collect();
            let mut sum = vals[0].clone();
            for v in &vals[1..] {
                sum.iter_mut().zip(v).for_each(|(s, x)| *s += x);
            }
            let parts: Vec<_> = vals
                .iter()
                .map(|v| gq::to_bf16_padded(&g, &up(&g, v), rows, dim, rows, dim).unwrap())
                .collect();
            let refs: Vec<&_> = parts.iter().collect();
            let (mut acc_f, mut acc_s) = (up(&g, &acc0), up(&g, &acc0));
            let opts = (true, Some(&res));
            let (fdx, f16) = gops::rmsnorm_backward_acc_operand(
                &g,
                (&up(&g, &sum), &dx, &dw, &rs),
                (rows, dim),
                opts,
                &mut acc_f,
                true,
            )
            .unwrap();
            let (sdx, s16) = gops::rmsnorm_backward_acc_operand_sum(
                &g,
                &refs,
                (&dx, &dw, &rs),
                (rows, dim),
                opts,
                &mut acc_s,
                true,
            )
            .unwrap();
            let (a, b) = (
                g.download(&f16.unwrap()).unwrap(),
                g.download(&s16.unwrap()).unwrap(),
            );
            report_exact(
                &format!("rmsnorm bwd, dy the sum of {np} BF16 parts == that sum in f32"),
                &shape,
                bits_differ(&dl(&g, &sdx, rows * dim), &dl(&g, &fdx, rows * dim))
                    + a.iter().zip(&b).filter(|(x, y)| x != y).count()
                    + bits_differ(&dl(&g, &acc_s, dim), &dl(&g, &acc_f, dim)),
            );
        }
        // The bias gradient's column sums: near the f64 sums; added into an
        // accumulator, the bits of add_into.
        let sums = gops::column_sums(&g, &ddy, rows, dim, false).unwrap();
        let want: Vec<f32> = (0..dim)
            .map(|c| (0..rows).map(|r| dy[r * dim + c] as f64).sum::<f64>() as f32)
            .collect();
        report("column sums", &shape, rel(&dl(&g, &sums, dim), &want), 1e-5);
        let mut acc = up(&g, &acc0);
        gops::column_sums_acc(&g, &ddy, (rows, dim), true, &mut acc).unwrap();
        let mut want_acc = up(&g, &acc0);
        let rounded = gops::column_sums(&g, &ddy, rows, dim, true).unwrap();
        gten::add_into(&g, &mut want_acc, &rounded, dim).unwrap();
        report_exact(
            "column sums accumulated == add_into",
            &shape,
            bits_differ(&dl(&g, &acc, dim), &dl(&g, &want_acc, dim)),
        );
        // Rows of 128 take a warp each: the same bits as a block a row (the other
        // widths take rmsnorm_bwd_rows, whose dots add in their own order: checked
        // against the CPU below).
        let warp_rows = if dim == 128 { 2 } else { 0 };
        for (round, res) in [(false, None), (true, Some(&res))]
            .into_iter()
            .take(warp_rows)
        {
            let blocks = gops::rmsnorm_bwd_dx_block_rows(
                &g,
                (&ddy, &dx, &dw, &rs),
                (rows, dim),
                (round, res),
            );
            let (got, _) =
                gops::rmsnorm_backward(&g, &ddy, &dx, &dw, &rs, (rows, dim), (round, res)).unwrap();
            report_exact(
                &format!("rmsnorm bwd dx == a block a row ({round})"),
                &shape,
                bits_differ(
                    &dl(&g, &got, rows * dim),
                    &dl(&g, &blocks.unwrap(), rows * dim),
                ),
            );
        }
        report(
            "rmsnorm bwd dx",
            &shape,
            rel(&dl(&g, &gdx, rows * dim), &cdx),
            1e-5,
        );
        report(
            "rmsnorm bwd dw",
            &shape,
            rel(&dl(&g, &gdw, dim), &cdw),
            1e-5,
        );
    }
    // Rows that would need padding columns get no BF16 operand (the linear layer
    // copies dx instead).
    let (rows, dim) = (3usize, 90usize);
    let (x, w) = (
        up(&g, &rnd(rows * dim, 24, 2.0)),
        up(&g, &rnd(dim, 25, 1.0)),
    );
    let dy = up(&g, &rnd(rows * dim, 26, 1.0));
    let (_, rs) = gops::rmsnorm_forward(&g, &x, &w, rows, dim, 1e-6).unwrap();
    let mut acc = up(&g, &rnd(dim, 27, 1.0));
    let (_, o16) = gops::rmsnorm_backward_acc_operand(
        &g,
        (&dy, &x, &w, &rs),
        (rows, dim),
        (true, None),
        &mut acc,
        true,
    )
    .unwrap();
    assert!(
        o16.is_none(),
        "a BF16 operand of rows of 90 would need padding"
    );
    done();
}

/// The norm fused with its GEMM operand: the output within the norm's bound of the
/// CPU, the operand bit for bit what the quantizer or the BF16 copy makes of that
/// output (dims with and without whole groups, one not a multiple of 4).
#[test]
fn rmsnorm_with_operand_matches_cpu_and_the_unfused_operand() {
    let Some(g) = gpu() else { return };
    for (rows, dim) in [(130, 896), (3, 4096), (5, 90), (64, 1024)] {
        let shape = format!("[{rows}, {dim}]");
        let (x, w) = (rnd(rows * dim, 23, 2.0), rnd(dim, 24, 1.0));
        let (dx, dw) = (up(&g, &x), up(&g, &w));
        let (cy, crs) = rmsnorm::rmsnorm_forward(&x, &w, rows, dim, 1e-6);
        for fp8 in [true, false] {
            let (y, rs, op) = gq::rmsnorm_operand(&g, &dx, &dw, (rows, dim), 1e-6, fp8).unwrap();
            let what = if fp8 { "fp8" } else { "bf16" };
            let yh = dl(&g, &y, rows * dim);
            report(
                &format!("rmsnorm+{what} fwd y"),
                &shape,
                rel(&yh, &cy),
                1e-5,
            );
            report(
                &format!("rmsnorm+{what} fwd rstd"),
                &shape,
                rel(&dl(&g, &rs, rows), &crs),
                1e-5,
            );
            let differ = operand_differs(&g, op, &y, rows, dim);
            report_exact(
                &format!("rmsnorm+{what} operand == unfused"),
                &shape,
                differ,
            );
            if fp8 {
                // FP8 WGrad's 128x1 groups of y made again from x, w and rstd (a
                // training forward keeps no f32 y): y's codes, bit for bit.
                let norm = gq::DualIn::Norm {
                    x: &dx,
                    w: &dw,
                    rstd: &rs,
                };
                let both = gq::quantize_dual_multi(&g, &[(norm, rows, dim, true)]).unwrap();
                let (wr, wc) = gq::quantize_dual(&g, &y, rows, dim).unwrap();
                let (row, col) = (both[0].0.as_ref().unwrap(), &both[0].1);
                report_exact(
                    "rmsnorm y's 1x128 + 128x1 from x, w, rstd == of y",
                    &shape,
                    diff_q(&row.to_host(&g).unwrap(), &wr.to_host(&g).unwrap())
                        + diff_q(&col.to_host(&g).unwrap(), &wc.to_host(&g).unwrap()),
                );
            }
        }
    }
    done();
}

/// Rows of at most eight groups take the norm with its operand a warp a row,
/// repeating the block-a-row kernel's sums: y, rstd and the operand bit for bit
/// that kernel's (one group, a part group, eight; rows in part and whole blocks of
/// eight warps; signed zeros and a zero row).
#[test]
fn rmsnorm_operand_a_warp_a_row_equals_a_block_a_row() {
    let Some(g) = gpu() else { return };
    for (rows, dim) in [(1, 128), (7, 90), (130, 896), (64, 1024), (9, 1000)] {
        let shape = format!("[{rows}, {dim}]");
        let mut x = rnd(rows * dim, 30, 2.0);
        x[..dim].iter_mut().for_each(|v| *v = 0.0);
        x[dim / 2..dim].iter_mut().for_each(|v| *v = -0.0);
        let (dx, dw) = (up(&g, &x), up(&g, &rnd(dim, 31, 1.0)));
        for fp8 in [true, false] {
            let (y, rs, op) = gq::rmsnorm_operand(&g, &dx, &dw, (rows, dim), 1e-6, fp8).unwrap();
            let (by, brs, _) =
                gq::rmsnorm_operand_block_rows(&g, &dx, &dw, (rows, dim), 1e-6, fp8).unwrap();
            report_exact(
                &format!(
                    "rmsnorm+{} a warp a row == a block a row",
                    ["bf16", "fp8"][fp8 as usize]
                ),
                &shape,
                bits_differ(&dl(&g, &y, rows * dim), &dl(&g, &by, rows * dim))
                    + bits_differ(&dl(&g, &rs, rows), &dl(&g, &brs, rows))
                    + operand_differs(&g, op, &by, rows, dim),
            );
        }
    }
    done();
}

/// Values in which a fused producer's GEMM operand differs from the quantizer's
/// (codes and scales) or the BF16 copy's of its output `y [rows, cols]`.
fn operand_differs(
    g: &cuda::Gpu,
    op: gq::FusedOperand,
    y: &cudarc::driver::CudaSlice<f32>,
    rows: usize,
    cols: usize,
) -> usize {
    match op {
        gq::FusedOperand::Fp8(q) => {
            let want = gq::quantize_row1x128(g, y, rows, cols).unwrap();
            let (a, b) = (
                g.download(&q.codes).unwrap(),
                g.download(&want.codes).unwrap(),
            );
            let codes = a.iter().zip(&b).filter(|(x, y)| x != y).count();
            let n = want.scales.len();
            codes + bits_differ(&dl(g, &q.scales, n), &dl(g, &want.scales, n))
        }
        gq::FusedOperand::Bf16(b) => {
            let want = gq::to_bf16_padded(g, y, rows, cols, rows, cols.div_ceil(16) * 16).unwrap();
            let (a, b) = (g.download(&b).unwrap(), g.download(&want).unwrap());
            a.iter().zip(&b).filter(|(x, y)| x != y).count()
        }
    }
}

/// The kernels' sigmoid (its division without the IEEE range check, so that a
/// tile's values run interleaved) has the IEEE division's bits at every f32 input.
#[test]
fn sigmoid_has_the_ieee_divisions_bits_everywhere() {
    let Some(g) = gpu() else { return };
    let bad = gops::sigmoid_mismatches(&g).unwrap();
    report_exact(
        "sigmoid (div_unit) == sigmoid (IEEE division)",
        "all 2^32 f32",
        bad as usize,
    );
    done();
}

/// The hardware BF16 conversions have `f32_to_bf16`'s bits at every f32 input but
/// NaNs (which stay NaN).
#[test]
fn bf16_conversion_instructions_have_f32_to_bf16s_bits_everywhere() {
    let Some(g) = gpu() else { return };
    let bad = gops::bf16_cvt_mismatches(&g).unwrap();
    report_exact(
        "cvt.rn.bf16x2.f32 / cvt.rn.bf16.f32 == f32_to_bf16",
        "all 2^32 f32",
        bad as usize,
    );
    done();
}

/// The quantizers' branch-free group scale and reciprocal (`quot_usual`) have the
/// bits of the checked ones (`quot(e4m3_scale(a))`) at every amax they are used for.
#[test]
fn quot_usual_has_the_checked_scales_bits_everywhere() {
    let Some(g) = gpu() else { return };
    let bad = gops::quot_usual_mismatches(&g).unwrap();
    report_exact(
        "quot_usual == quot(e4m3_scale) (scale, reciprocal, fast)",
        "amax 0 and [2^-79, inf)",
        bad as usize,
    );
    done();
}

/// SwiGLU fused with its GEMM operand: the output bit for bit `swiglu_forward`'s,
/// the operand the quantizer's or the BF16 copy's of it.
#[test]
fn swiglu_with_operand_equals_the_unfused_ops() {
    let Some(g) = gpu() else { return };
    for (rows, cols) in [(64, 3072), (130, 896), (5, 90)] {
        let shape = format!("[{rows}, {cols}]");
        let (gt, ut) = (rnd(rows * cols, 28, 4.0), rnd(rows * cols, 29, 2.0));
        let (dg, du) = (up(&g, &gt), up(&g, &ut));
        let want = dl(
            &g,
            &gops::swiglu_forward(&g, &dg, &du, rows * cols).unwrap(),
            rows * cols,
        );
        for fp8 in [true, false] {
            let what = if fp8 { "fp8" } else { "bf16" };
            let (h, op) = gq::swiglu_operand(&g, &dg, &du, (rows, cols), fp8).unwrap();
            report_exact(
                &format!("swiglu+{what} h == swiglu_forward"),
                &shape,
                bits_differ(&dl(&g, &h, rows * cols), &want),
            );
            report_exact(
                &format!("swiglu+{what} operand == unfused"),
                &shape,
                operand_differs(&g, op, &h, rows, cols),
            );
        }
    }
    done();
}

/// The residual added in the linear layer's epilogue (split-K and rows kernels,
/// cuBLASLt in F32; 300x256x3584 takes the rows kernels) has the bits of the layer's
/// output plus `add_into`.
#[test]
fn linear_residual_equals_linear_plus_add() {
    let Some(g) = gpu() else { return };
    for (m, k, n) in [(5, 896, 136), (300, 256, 3584)] {
        let shape = format!("{m}x{k}x{n}");
        let (x, w, r) = (
            rnd(m * k, 25, 1.0),
            rnd(n * k, 26, 0.05),
            rnd(m * n, 27, 1.0),
        );
        let (dx, dr) = (up(&g, &x), up(&g, &r));
        for (flow, prec) in [
            (Flow::F32, GemmPrecision::F32),
            (Flow::Bf16, GemmPrecision::Bf16),
            (Flow::Fp8, GemmPrecision::Fp8),
        ] {
            let gw = glin::GpuWeight::from_host(&g, &w, n, k, flow).unwrap();
            let mut want = glin::linear_forward(&g, &dx, m, &gw, None, prec).unwrap();
            gten::add_into(&g, &mut want, &dr, m * n).unwrap();
            let xo = &mut glin::XOperand::default();
            let got = glin::linear_forward_residual(&g, &dx, xo, m, &gw, prec, &dr).unwrap();
            report_exact(
                &format!("linear {flow} + residual == linear, add_into"),
                &shape,
                bits_differ(&dl(&g, &got, m * n), &dl(&g, &want, m * n)),
            );
        }
    }
    done();
}

/// Qwen3's q/k norms with RoPE in one kernel against the CPU's norm then RoPE
/// (the norm's sum in another order: 1e-5), head_dim 128 and 64.
#[test]
fn qk_norm_rope_matches_cpu() {
    let Some(g) = gpu() else { return };
    let (rows, nh, nkv) = (130, 4, 2);
    for hd in [128, 64] {
        let shape = format!("{rows} rows, {nh}+{nkv} heads x {hd}");
        let table = rope::RopeTable::new(hd, 4096, 1_000_000.0, None);
        let gt = gops::GpuRope::new(&g, &table).unwrap();
        let positions: Vec<usize> = (0..rows).map(|i| (i * 37) % 4096).collect();
        let dpos = gops::upload_positions(&g, &positions, &gt).unwrap();
        let (q, k) = (rnd(rows * nh * hd, 31, 2.0), rnd(rows * nkv * hd, 32, 2.0));
        let (qw, kw) = (rnd(hd, 33, 1.0), rnd(hd, 34, 1.0));
        let (dq, dk, dqw, dkw) = (up(&g, &q), up(&g, &k), up(&g, &qw), up(&g, &kw));
        let (gq_, gk, gqr, gkr) = gops::qk_norm_rope(
            &g,
            (&dq, &dk),
            (&dqw, &dkw),
            (rows, nh, nkv),
            1e-6,
            &dpos,
            &gt,
        )
        .unwrap();
        for (what, x, w, heads, got, got_r) in [
            ("q", &q, &qw, nh, &gq_, &gqr),
            ("k", &k, &kw, nkv, &gk, &gkr),
        ] {
            let (mut want, want_r) = rmsnorm::rmsnorm_forward(x, w, rows * heads, hd, 1e-6);
            rope::rope_forward(&mut want, &positions, heads, &table);
            let n = rows * heads * hd;
            report(
                &format!("qk_norm_rope {what}"),
                &shape,
                rel(&dl(&g, got, n), &want),
                1e-5,
            );
            report(
                &format!("qk_norm_rope {what} rstd"),
                &shape,
                rel(&dl(&g, got_r, rows * heads), &want_r),
                1e-5,
            );
        }
        // The BF16-only form (the training forward's attention operands): the RNE
        // copies of the f32 outputs, and the same rstd.
        let (q16, k16, qr16, kr16) = gops::qk_norm_rope_bf16(
            &g,
            ((&dq).into(), (&dk).into()),
            (&dqw, &dkw),
            (rows, nh, nkv),
            1e-6,
            &dpos,
            &gt,
        )
        .unwrap();
        let mut differ = 0;
        for (got16, f, heads) in [(&q16, &gq_, nh), (&k16, &gk, nkv)] {
            let n = rows * heads * hd;
            let want: Vec<u16> = dl(&g, f, n)
                .iter()
                .map(|&x| half::bf16::from_f32(x).to_bits())
                .collect();
            let got = g.download(got16).unwrap();
            differ += got[..n].iter().zip(&want).filter(|(a, b)| a != b).count();
        }
        differ += bits_differ(&dl(&g, &qr16, rows * nh), &dl(&g, &gqr, rows * nh));
        differ += bits_differ(&dl(&g, &kr16, rows * nkv), &dl(&g, &gkr, rows * nkv));
        report_exact(
            "qk_norm_rope BF16 outputs == copies of the f32",
            &shape,
            differ,
        );
        // q and k before their norms as BF16 values (the projections' stored form):
        // the bits of the f32 kernel given the same values.
        let ((fq, hq), (fk, hk)) = (up_bf16_values(&g, &q), up_bf16_values(&g, &k));
        let run = |pre: (ActRef, ActRef)| {
            gops::qk_norm_rope_bf16(&g, pre, (&dqw, &dkw), (rows, nh, nkv), 1e-6, &dpos, &gt)
                .unwrap()
        };
        let (a, b) = (
            run(((&fq).into(), (&fk).into())),
            run(((&hq).into(), (&hk).into())),
        );
        let u16s = |x: &cudarc::driver::CudaSlice<u16>| g.download(x).unwrap();
        let d16 = u16s(&a.0)
            .iter()
            .zip(&u16s(&b.0))
            .filter(|(x, y)| x != y)
            .count()
            + u16s(&a.1)
                .iter()
                .zip(&u16s(&b.1))
                .filter(|(x, y)| x != y)
                .count()
            + bits_differ(&dl(&g, &a.2, rows * nh), &dl(&g, &b.2, rows * nh))
            + bits_differ(&dl(&g, &a.3, rows * nkv), &dl(&g, &b.3, rows * nkv));
        report_exact(
            "qk_norm_rope from BF16 q, k == from their f32 values",
            &shape,
            d16,
        );
    }
    done();
}

/// Same products, same order, no FMA: bit-exact.
#[test]
fn rope_matches_cpu() {
    let Some(g) = gpu() else { return };
    let table = rope::RopeTable::new(128, 4096, 1_000_000.0, None);
    let gt = gops::GpuRope::new(&g, &table).unwrap();
    let positions: Vec<usize> = (0..130).map(|i| (i * 31) % 4096).collect();
    let nh = 4;
    let x = rnd(130 * nh * 128, 30, 2.0);
    let mut dx = up(&g, &x);
    gops::rope_forward(&g, &mut dx, &positions, nh, &gt).unwrap();
    let mut want = x.clone();
    rope::rope_forward(&mut want, &positions, nh, &table);
    let bits = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count()
    };
    report_exact(
        "rope fwd",
        "130 rows, 4 heads x 128",
        bits(&dl(&g, &dx, x.len()), &want),
    );
    // The backward rounding its output to BF16 (device positions): the bits of the
    // backward, then round_bf16.
    let mut rounded = dx.clone();
    let dpos = gops::upload_positions(&g, &positions, &gt).unwrap();
    gops::rope_backward_dev(&g, &mut rounded, &dpos, (130, nh), &gt, true).unwrap();
    gops::rope_backward(&g, &mut dx, &positions, nh, &gt).unwrap();
    rope::rope_backward(&mut want, &positions, nh, &table);
    report_exact(
        "rope bwd",
        "130 rows, 4 heads x 128",
        bits(&dl(&g, &dx, x.len()), &want),
    );
    let mut want_r = dx.clone();
    gten::round_bf16(&g, &mut want_r, x.len()).unwrap();
    report_exact(
        "rope bwd rounded == rope bwd, round_bf16",
        "130 rows, 4 heads x 128",
        bits(&dl(&g, &rounded, x.len()), &dl(&g, &want_r, x.len())),
    );
    assert!(gops::rope_forward(&g, &mut dx, &[4096; 130], nh, &gt).is_err());
    done();
}

/// Qwen3's q/k norm and RoPE backward in one pass: the bits of rope_backward_dev
/// then rmsnorm_backward_acc (dx, and dw added into an accumulator), for chunks of
/// 256 rows whole and partial, rounded or not.
#[test]
fn qk_norm_rope_backward_equals_the_two_passes() {
    let Some(g) = gpu() else { return };
    let table = rope::RopeTable::new(128, 4096, 1_000_000.0, None);
    let gt = gops::GpuRope::new(&g, &table).unwrap();
    for (tokens, nh) in [(130usize, 16usize), (7, 8), (32, 8)] {
        let rows = tokens * nh;
        let positions: Vec<usize> = (0..tokens).map(|i| (i * 37) % 4096).collect();
        let dpos = gops::upload_positions(&g, &positions, &gt).unwrap();
        let (dy, x, w) = (
            up(&g, &rnd(rows * 128, 90, 1.0)),
            up(&g, &rnd(rows * 128, 91, 2.0)),
            up(&g, &rnd(128, 92, 1.0)),
        );
        let (_, rstd) = gops::rmsnorm_forward(&g, &x, &w, rows, 128, 1e-6).unwrap();
        let acc0 = rnd(128, 93, 1.0);
        for round in [false, true] {
            let mut acc = up(&g, &acc0);
            let got = gops::qk_norm_rope_backward_acc(
                &g,
                (&dy, (&x).into(), &w, &rstd),
                (&dpos, &gt),
                (tokens, nh),
                round,
                &mut acc,
            )
            .unwrap();
            let mut rot = dy.clone();
            gops::rope_backward_dev(&g, &mut rot, &dpos, (tokens, nh), &gt, round).unwrap();
            let mut want_acc = up(&g, &acc0);
            let want = gops::rmsnorm_backward_acc(
                &g,
                (&rot, &x, &w, &rstd),
                (rows, 128),
                (round, None),
                &mut want_acc,
            )
            .unwrap();
            report_exact(
                &format!("q/k norm + rope bwd in one pass == two passes (round {round})"),
                &format!("{tokens} tokens x {nh} heads of 128"),
                bits_differ(&dl(&g, &got, rows * 128), &dl(&g, &want, rows * 128))
                    + bits_differ(&dl(&g, &acc, 128), &dl(&g, &want_acc, 128)),
            );
            // dx's BF16 operand alone from the same pass: dx's copy, bit for bit.
            let mut acc16 = up(&g, &acc0);
            let o16 = gops::qk_norm_rope_backward_acc_operand(
                &g,
                (&dy, (&x).into(), &w, &rstd),
                (&dpos, &gt),
                (tokens, nh),
                round,
                &mut acc16,
                true,
            )
            .unwrap();
            let gops::QkNormGrad::Bf16(o16) = o16 else {
                panic!("the BF16 operand asked for, f32 returned");
            };
            let copy = gq::to_bf16_padded(&g, &got, tokens, nh * 128, tokens, nh * 128).unwrap();
            let (a, b) = (g.download(&o16).unwrap(), g.download(&copy).unwrap());
            report_exact(
                &format!("q/k norm + rope bwd's BF16 operand == the copy of dx (round {round})"),
                &format!("{tokens} tokens x {nh} heads of 128"),
                a.iter().zip(&b).filter(|(x, y)| x != y).count()
                    + bits_differ(&dl(&g, &acc16, 128), &dl(&g, &want_acc, 128)),
            );
            // x as BF16 values (q or k as their projection stored them): the bits of
            // the f32 kernel given the same values.
            let (xf, x16) = up_bf16_values(&g, &dl(&g, &x, rows * 128));
            let (mut a1, mut a2) = (up(&g, &acc0), up(&g, &acc0));
            let r1 = gops::qk_norm_rope_backward_acc(
                &g,
                (&dy, (&xf).into(), &w, &rstd),
                (&dpos, &gt),
                (tokens, nh),
                round,
                &mut a1,
            )
            .unwrap();
            let r2 = gops::qk_norm_rope_backward_acc(
                &g,
                (&dy, (&x16).into(), &w, &rstd),
                (&dpos, &gt),
                (tokens, nh),
                round,
                &mut a2,
            )
            .unwrap();
            report_exact(
                &format!("q/k norm + rope bwd from BF16 x == from its f32 values (round {round})"),
                &format!("{tokens} tokens x {nh} heads of 128"),
                bits_differ(&dl(&g, &r1, rows * 128), &dl(&g, &r2, rows * 128))
                    + bits_differ(&dl(&g, &a1, 128), &dl(&g, &a2, 128)),
            );
        }
    }
    done();
}

/// q's and k's norm + RoPE backward in one launch: each side the bits of its own
/// launch (dx or its BF16 operand, and dw added into its accumulator), with q's and
/// k's chunk counts different and partial, and x in f32 and as BF16. At 4,096
/// tokens of 16 + 8 heads the pair is 384 blocks, more than two an SM on an H100 or
/// H200 (132 SMs), so it takes the three-an-SM kernels (`_o3`) and each side alone
/// does not: the two builds' bits compared.
#[test]
fn qk_norm_rope_backward_pair_equals_one_launch_each() {
    let Some(g) = gpu() else { return };
    let table = rope::RopeTable::new(128, 4096, 1_000_000.0, None);
    let gt = gops::GpuRope::new(&g, &table).unwrap();
    for (tokens, nh, nkv) in [
        (130usize, 16usize, 8usize),
        (7, 8, 2),
        (64, 4, 4),
        (4096, 16, 8),
    ] {
        let positions: Vec<usize> = (0..tokens).map(|i| (i * 53) % 4096).collect();
        let dpos = gops::upload_positions(&g, &positions, &gt).unwrap();
        let side = |heads: usize, seed: u64| {
            let rows = tokens * heads;
            // x's values BF16 ones, so its f32 and BF16 forms hold the same numbers.
            let (x, x16) = up_bf16_values(&g, &rnd(rows * 128, seed + 1, 2.0));
            let (dy, w) = (
                up(&g, &rnd(rows * 128, seed, 1.0)),
                up(&g, &rnd(128, seed + 2, 1.0)),
            );
            let (_, rstd) = gops::rmsnorm_forward(&g, &x, &w, rows, 128, 1e-6).unwrap();
            (dy, x, w, rstd, rnd(128, seed + 3, 1.0), x16)
        };
        let (q, k) = (side(nh, 700), side(nkv, 710));
        let modes = [(false, false), (true, false), (true, true)];
        for ((round, bf16), x16) in modes.into_iter().flat_map(|m| [(m, false), (m, true)]) {
            // x's form for this pass: f32, or the BF16 copy of the same values.
            fn xin<'a>(
                x16: bool,
                x: &'a cudarc::driver::CudaSlice<f32>,
                h: &'a cudarc::driver::CudaSlice<u16>,
            ) -> ActRef<'a> {
                match x16 {
                    false => ActRef::F32(x),
                    true => ActRef::Bf16(h),
                }
            }
            let (mut aq, mut ak) = (up(&g, &q.4), up(&g, &k.4));
            let [gq, gk] = gops::qk_norm_rope_backward_pair(
                &g,
                [
                    (&q.0, xin(x16, &q.1, &q.5), &q.2, &q.3),
                    (&k.0, xin(x16, &k.1, &k.5), &k.2, &k.3),
                ],
                (&dpos, &gt),
                (tokens, [nh, nkv]),
                round,
                (&mut aq, &mut ak),
                bf16,
            )
            .unwrap();
            for ((s, heads, got, acc), name) in [(&q, nh, gq, &aq), (&k, nkv, gk, &ak)]
                .into_iter()
                .zip(["q", "k"])
            {
                let mut want_acc = up(&g, &s.4);
                let want = gops::qk_norm_rope_backward_acc_operand(
                    &g,
                    (&s.0, xin(x16, &s.1, &s.5), &s.2, &s.3),
                    (&dpos, &gt),
                    (tokens, heads),
                    round,
                    &mut want_acc,
                    bf16,
                )
                .unwrap();
                let n = tokens * heads * 128;
                let differ = match (got, want) {
                    (gops::QkNormGrad::F32(a), gops::QkNormGrad::F32(b)) => {
                        bits_differ(&dl(&g, &a, n), &dl(&g, &b, n))
                    }
                    (gops::QkNormGrad::Bf16(a), gops::QkNormGrad::Bf16(b)) => {
                        let (a, b) = (g.download(&a).unwrap(), g.download(&b).unwrap());
                        a.iter().zip(&b).filter(|(x, y)| x != y).count()
                    }
                    _ => panic!("{name}: the pair and the single launch made different forms"),
                };
                report_exact(
                    &format!("q/k norm + rope bwd, q and k in one launch == one each ({name}, round {round}, bf16 {bf16}, x16 {x16})"),
                    &format!("{tokens} tokens x {heads} heads of 128"),
                    differ + bits_differ(&dl(&g, acc, 128), &dl(&g, &want_acc, 128)),
                );
            }
        }
    }
    done();
}

/// CUDA's expf is within 2 ulp of the CPU's exp: 1e-5.
#[test]
fn swiglu_matches_cpu() {
    let Some(g) = gpu() else { return };
    let n = 130 * 4864;
    let (gate, upv, dh) = (rnd(n, 40, 8.0), rnd(n, 41, 2.0), rnd(n, 42, 1.0));
    let (dg, du) = (up(&g, &gate), up(&g, &upv));
    let h = gops::swiglu_forward(&g, &dg, &du, n).unwrap();
    report(
        "swiglu fwd",
        "[130, 4864]",
        rel(&dl(&g, &h, n), &swiglu::swiglu_forward(&gate, &upv)),
        1e-5,
    );
    let ddh = up(&g, &dh);
    let (gg, gu) = gops::swiglu_backward(&g, &ddh, &dg, &du, n, false).unwrap();
    let (cg, cu) = swiglu::swiglu_backward(&dh, &gate, &upv);
    let (rg, ru) = gops::swiglu_backward(&g, &ddh, &dg, &du, n, true).unwrap();
    let (mut wg, mut wu) = (gg.clone(), gu.clone());
    gten::round_bf16(&g, &mut wg, n).unwrap();
    gten::round_bf16(&g, &mut wu, n).unwrap();
    report_exact(
        "swiglu bwd rounded == round_bf16",
        "[130, 4864]",
        bits_differ(&dl(&g, &rg, n), &dl(&g, &wg, n))
            + bits_differ(&dl(&g, &ru, n), &dl(&g, &wu, n)),
    );
    // As the BF16 operands of the gate and up backward, rows padded (4864 is a
    // multiple of 16; 4860 is not): the bits of the rounded f32 results' copies.
    for cols in [4864, 4860] {
        let rows = n / cols;
        let dh = gops::SwigluDh::F32(&ddh);
        let (ob, ub) = gops::swiglu_backward_bf16(&g, dh, &dg, &du, (rows, cols)).unwrap();
        let (rg, ru) = gops::swiglu_backward(&g, &ddh, &dg, &du, n, true).unwrap();
        let cp = cuda::pad16(cols);
        let copy = |x| gq::to_bf16_padded(&g, x, rows, cols, rows, cp).unwrap();
        let differ: usize = [(ob, copy(&rg)), (ub, copy(&ru))]
            .iter()
            .map(|(a, b)| {
                let (a, b) = (g.download(a).unwrap(), g.download(b).unwrap());
                a.iter().zip(&b).filter(|(x, y)| x != y).count()
            })
            .sum();
        report_exact(
            "swiglu bwd BF16 operands == copies of the rounded f32",
            &format!("[{rows}, {cols}]"),
            differ,
        );
    }
    // As the FP8 operands (1x128 and 128x1) of the gate and up backward: the codes
    // and scales of quantize_dual of the rounded f32 results; rows not a multiple of
    // 128 and columns not of 128 or 16 (partial tiles, padding).
    for (rows, cols) in [(130, 4864), (130, 4860), (257, 200)] {
        let dh = gops::SwigluDh::F32(&ddh);
        let (qg, qu) = gq::swiglu_backward_fp8(&g, dh, &dg, &du, (rows, cols)).unwrap();
        let (rg, ru) = gops::swiglu_backward(&g, &ddh, &dg, &du, rows * cols, true).unwrap();
        let differ =
            dual_differ(&g, &qg, &rg, (rows, cols)) + dual_differ(&g, &qu, &ru, (rows, cols));
        report_exact(
            "swiglu bwd FP8 operands == quantize_dual of the rounded f32",
            &format!("[{rows}, {cols}]"),
            differ,
        );
    }
    // dh as a GEMM's BF16 output (row stride past the columns): the same operands
    // as from its values in f32 (what the epilogue would have written).
    for (rows, cols) in [(130, 4864), (257, 200)] {
        let mut dhr = g.zeros::<f32>(rows * cols).unwrap();
        g.copy_into(&ddh, &mut dhr, rows * cols).unwrap();
        gten::round_bf16(&g, &mut dhr, rows * cols).unwrap();
        let ld = cuda::pad16(cols) + 8;
        let dh16 = gq::to_bf16_padded(&g, &dhr, rows, cols, rows, ld).unwrap();
        let (f, b) = (gops::SwigluDh::F32(&dhr), gops::SwigluDh::Bf16(&dh16, ld));
        let (o1, o2) = gops::swiglu_backward_bf16(&g, f, &dg, &du, (rows, cols)).unwrap();
        let (p1, p2) = gops::swiglu_backward_bf16(&g, b, &dg, &du, (rows, cols)).unwrap();
        let mut differ: usize = [(o1, p1), (o2, p2)]
            .iter()
            .map(|(a, b)| {
                let (a, b) = (g.download(a).unwrap(), g.download(b).unwrap());
                a.iter().zip(&b).filter(|(x, y)| x != y).count()
            })
            .sum();
        let (q1, q2) = gq::swiglu_backward_fp8(&g, b, &dg, &du, (rows, cols)).unwrap();
        let (rg, ru) = gops::swiglu_backward(&g, &dhr, &dg, &du, rows * cols, true).unwrap();
        differ += dual_differ(&g, &q1, &rg, (rows, cols)) + dual_differ(&g, &q2, &ru, (rows, cols));
        report_exact(
            "swiglu bwd from a BF16 dh (BF16 and FP8 operands) == from its f32 values",
            &format!("[{rows}, {cols}]"),
            differ,
        );
    }
    report(
        "swiglu bwd dgate",
        "[130, 4864]",
        rel(&dl(&g, &gg, n), &cg),
        1e-5,
    );
    report(
        "swiglu bwd dup",
        "[130, 4864]",
        rel(&dl(&g, &gu, n), &cu),
        1e-5,
    );
    done();
}

/// Dot products in the CPU's order; only the softmax denominator is a tree: 1e-5.
#[test]
fn attention_matches_cpu() {
    let Some(g) = gpu() else { return };
    let shape = attention::AttnShape {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
    };
    let seqs = [5usize, 17, 130];
    let rows: usize = seqs.iter().sum();
    let (qw, kvw) = (4 * 64, 2 * 64);
    let (q, k, v, dout) = (
        rnd(rows * qw, 50, 1.5),
        rnd(rows * kvw, 51, 1.5),
        rnd(rows * kvw, 52, 1.5),
        rnd(rows * qw, 53, 1.0),
    );
    let (dq_, dk_, dv_) = (up(&g, &q), up(&g, &k), up(&g, &v));
    let (out, probs) = gatt::attention_forward(&g, &dq_, &dk_, &dv_, &seqs, shape).unwrap();
    let (gdq, gdk, gdv) =
        gatt::attention_backward(&g, &up(&g, &dout), &dq_, &dk_, &dv_, &probs, &seqs, shape)
            .unwrap();
    let (out, probs, gdq, gdk, gdv) = (
        dl(&g, &out, rows * qw),
        g.download(&probs).unwrap(),
        dl(&g, &gdq, rows * qw),
        dl(&g, &gdk, rows * kvw),
        dl(&g, &gdv, rows * kvw),
    );
    let (mut co, mut cp, mut cdq, mut cdk, mut cdv) = (vec![], vec![], vec![], vec![], vec![]);
    let mut r0 = 0;
    for &s in &seqs {
        let (qs, ks, vs, ds) = (
            &q[r0 * qw..(r0 + s) * qw],
            &k[r0 * kvw..(r0 + s) * kvw],
            &v[r0 * kvw..(r0 + s) * kvw],
            &dout[r0 * qw..(r0 + s) * qw],
        );
        let (o, p) = attention::attention_forward(qs, ks, vs, s, shape);
        let (a, b, c) = attention::attention_backward(ds, qs, ks, vs, &p, s, shape);
        co.extend(o);
        cp.extend(p);
        cdq.extend(a);
        cdk.extend(b);
        cdv.extend(c);
        r0 += s;
    }
    let sh = "seqs 5+17+130, 4q/2kv x 64";
    report("attention fwd out", sh, rel(&out, &co), 1e-5);
    report(
        "attention fwd probs",
        sh,
        rel(&probs[..cp.len()], &cp),
        1e-5,
    );
    report("attention bwd dq", sh, rel(&gdq, &cdq), 1e-5);
    report("attention bwd dk", sh, rel(&gdk, &cdk), 1e-5);
    report("attention bwd dv", sh, rel(&gdv, &cdv), 1e-5);
    // Decode against a cache with spare capacity and garbage past each length gives
    // the forward's rows bit for bit (the same kernel, the same keys).
    let cap = 160;
    let (mut kc, mut vc) = (vec![f32::NAN; 3 * cap * kvw], vec![f32::NAN; 3 * cap * kvw]);
    let (mut qd, mut lens, mut want) = (vec![], vec![], vec![]);
    let mut r0 = 0;
    for (b, &s) in seqs.iter().enumerate() {
        kc[b * cap * kvw..(b * cap + s) * kvw].copy_from_slice(&k[r0 * kvw..(r0 + s) * kvw]);
        vc[b * cap * kvw..(b * cap + s) * kvw].copy_from_slice(&v[r0 * kvw..(r0 + s) * kvw]);
        let t = r0 + s - 1;
        qd.extend_from_slice(&q[t * qw..(t + 1) * qw]);
        want.extend_from_slice(&out[t * qw..(t + 1) * qw]);
        lens.push(s);
        r0 += s;
    }
    let od = gatt::attention_decode(
        &g,
        &up(&g, &qd),
        &up(&g, &kc),
        &up(&g, &vc),
        cap,
        &lens,
        shape,
    )
    .unwrap();
    report_exact(
        "attention decode == forward row",
        "3 rows, cache 160",
        dl(&g, &od, 3 * qw)
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count(),
    );
    done();
}

/// Row reductions are trees on the GPU and sequential f32 sums on the CPU. Against
/// an f64 evaluation of the same formulas the GPU is within 1e-5; against the CPU's
/// f32 the bound is 5e-5, since the CPU's own sequential sum over a 151936-entry
/// vocabulary is off by about 1e-5 (both numbers are printed).
#[test]
fn logsoftmax_matches_cpu() {
    let Some(g) = gpu() else { return };
    for (rows, vocab) in [(7, 1000), (2, 151_936)] {
        let shape = format!("[{rows}, {vocab}]");
        let z = rnd(rows * vocab, 60, 8.0);
        let tg: Vec<u32> = (0..rows).map(|r| ((r * 7919) % vocab) as u32).collect();
        let (dlp, dent) = (rnd(rows, 61, 1.0), rnd(rows, 62, 1.0));
        let dz = up(&g, &z);
        let f = glsm::token_logprobs_forward(&g, &dz, rows, vocab, &tg).unwrap();
        let c = logsoftmax::token_logprobs_forward(&z, rows, vocab, &tg);
        let z64: Vec<f64> = z.iter().map(|&v| v as f64).collect();
        let c64 = logsoftmax::token_logprobs_forward(&z64, rows, vocab, &tg);
        let f32s = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        let (gl, ge, gs) = (
            dl(&g, &f.logp, rows),
            dl(&g, &f.entropy, rows),
            dl(&g, &f.lse, rows),
        );
        for (what, gv, cv, c64v) in [
            ("logp", &gl, &c.logp, &c64.logp),
            ("entropy", &ge, &c.entropy, &c64.entropy),
            ("lse", &gs, &c.lse, &c64.lse),
        ] {
            report(
                &format!("token logprobs fwd {what} vs f64"),
                &shape,
                rel(gv, &f32s(c64v)),
                1e-5,
            );
            println!(
                "         (CPU f32 {what} vs f64: {:.2e})",
                rel(cv, &f32s(c64v))
            );
            report(
                &format!("token logprobs fwd {what}"),
                &shape,
                rel(gv, cv),
                5e-5,
            );
        }
        let d = glsm::token_logprobs_backward(
            &g,
            &dz,
            rows,
            vocab,
            &tg,
            &f,
            &up(&g, &dlp),
            Some(&up(&g, &dent)),
        )
        .unwrap();
        let cd = logsoftmax::token_logprobs_backward(&z, rows, vocab, &tg, &c, &dlp, Some(&dent));
        report(
            "token logprobs bwd dlogits",
            &shape,
            rel(&dl(&g, &d, rows * vocab), &cd),
            1e-5,
        );
        let full = dl(
            &g,
            &glsm::log_softmax_rows(&g, &dz, rows, vocab).unwrap(),
            rows * vocab,
        );
        let lp = dl(&g, &f.logp, rows);
        let same = (0..rows)
            .filter(|&r| full[r * vocab + tg[r] as usize].to_bits() == lp[r].to_bits())
            .count();
        report_exact("log_softmax_rows[target] == logp", &shape, rows - same);
    }
    done();
}

/// The training pass scores response rows in place in the LM head's logits
/// `[total, vocab]`: `token_logprobs_forward_at` / `_backward_at` must equal the
/// forward and backward over those rows gathered, the gradient scaled by the
/// temperature's 1/T and scattered into zeros, bit for bit; a repeated or
/// out-of-range row is refused.
#[test]
fn token_logprobs_in_place_match_gathered() {
    let Some(g) = gpu() else { return };
    let cases = [
        (9, 1000, 1.0f32),
        (6, 151_936, 1.0 / 0.7),
        (7, 1003, 0.5),
        (200, 300, 1.0),
    ];
    for (total, vocab, scale) in cases {
        let shape = format!("[{total}, {vocab}]");
        let at = [4usize, 1, total - 1];
        let r = at.len();
        let z = rnd(total * vocab, 63, 8.0);
        let tg: Vec<u32> = (0..r).map(|i| ((i * 7919 + 3) % vocab) as u32).collect();
        let (dlp, dent) = (up(&g, &rnd(r, 64, 1.0)), up(&g, &rnd(r, 65, 1.0)));
        let gathered: Vec<f32> = at
            .iter()
            .flat_map(|&i| z[i * vocab..(i + 1) * vocab].to_vec())
            .collect();
        let (dz, dzg) = (up(&g, &z), up(&g, &gathered));
        let f = glsm::token_logprobs_forward_at(&g, &dz, total, vocab, &at, &tg).unwrap();
        let want = glsm::token_logprobs_forward(&g, &dzg, r, vocab, &tg).unwrap();
        let differ = [
            (&f.logp, &want.logp),
            (&f.entropy, &want.entropy),
            (&f.lse, &want.lse),
        ]
        .iter()
        .map(|(a, b)| bits_differ(&dl(&g, a, r), &dl(&g, b, r)))
        .sum();
        report_exact("token logprobs fwd in place", &shape, differ);
        let d = glsm::ScoredGrad {
            tgt: &tg,
            fwd: &f,
            dlogp: &dlp,
            dentropy: Some(&dent),
        };
        // The gathered backward scattered into zeros and scaled: what every form must
        // hold (f32), or be the copy of (BF16: to_bf16_padded; FP8: quantize_dual).
        let dg = glsm::token_logprobs_backward(&g, &dzg, r, vocab, &tg, &want, &dlp, Some(&dent));
        let dg = dl(&g, &dg.unwrap(), r * vocab);
        let mut want_full = vec![0.0f32; total * vocab];
        for (i, &row) in at.iter().enumerate() {
            for j in 0..vocab {
                want_full[row * vocab + j] = dg[i * vocab + j] * scale;
            }
        }
        let want_dev = up(&g, &want_full);
        // Each output form from fresh logits (the in-place one overwrites them).
        let back = |prec| {
            let out = glsm::ScoredOut::alloc(&g, prec, total, vocab).unwrap();
            let logits = up(&g, &z);
            glsm::token_logprobs_backward_at(
                &g,
                Act::F32(logits),
                (total, vocab),
                &at,
                &d,
                scale,
                out,
            )
            .unwrap()
        };
        let glsm::ScoredDz::F32(got_dev) = back(None) else {
            panic!("in place: not f32")
        };
        let got = dl(&g, &got_dev, total * vocab);
        let bad: Vec<_> = (0..got.len())
            .filter(|&i| got[i].to_bits() != want_full[i].to_bits())
            .map(|i| (i / vocab, i % vocab, got[i], want_full[i]))
            .take(4)
            .collect();
        if !bad.is_empty() {
            println!("  in place {shape}: (row, col, got, want) {bad:?}");
        }
        report_exact(
            "token logprobs bwd in place",
            &shape,
            bits_differ(&got, &want_full),
        );
        // As the LM head's FP8 operands: quantize_dual's bits of that gradient.
        let glsm::ScoredDz::Fp8(q) = back(Some(GemmPrecision::Fp8)) else {
            panic!("FP8 operands asked for")
        };
        report_exact(
            "token logprobs bwd FP8 operands == quantize_dual of it",
            &shape,
            dual_differ(&g, &q, &want_dev, (total, vocab)),
        );
        // As the BF16 operand: to_bf16_padded's bits of it, zero padding included.
        let glsm::ScoredDz::Bf16(b) = back(Some(GemmPrecision::Bf16)) else {
            panic!("BF16 operand asked for")
        };
        let cp = cuda::pad16(vocab);
        let want_b = gq::to_bf16_padded(&g, &want_dev, total, vocab, total, cp).unwrap();
        let (gb, wb) = (g.download(&b).unwrap(), g.download(&want_b).unwrap());
        let differ = gb.iter().zip(&wb).filter(|(x, y)| x != y).count();
        report_exact(
            "token logprobs bwd BF16 operand == to_bf16_padded of it",
            &shape,
            differ,
        );
    }
    let dz = up(&g, &rnd(4 * 10, 66, 1.0));
    for (at, why) in [(vec![1usize, 1], "repeated"), (vec![4], "outside")] {
        let tg = vec![0u32; at.len()];
        let err = glsm::token_logprobs_forward_at(&g, &dz, 4, 10, &at, &tg);
        let msg = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains(why), "scored rows {at:?}: {msg:?}");
    }
    done();
}

/// Codes and scales of an operand pair that differ from `quantize_dual` of `f [rows, cols]`.
fn dual_differ(
    g: &cuda::Gpu,
    got: &gq::DualFp8,
    f: &cudarc::driver::CudaSlice<f32>,
    (rows, cols): (usize, usize),
) -> usize {
    let (row, col) = gq::quantize_dual(g, f, rows, cols).unwrap();
    let mut differ = 0;
    for (a, b) in [(&got.row, &row), (&got.col, &col)] {
        let (ac, bc) = (g.download(&a.codes).unwrap(), g.download(&b.codes).unwrap());
        assert_eq!((ac.len(), a.scales.len()), (bc.len(), b.scales.len()));
        let n = b.scales.len();
        differ += ac.iter().zip(&bc).filter(|(x, y)| x != y).count();
        differ += bits_differ(&dl(g, &a.scales, n), &dl(g, &b.scales, n));
    }
    differ
}

/// Values whose bits differ; any two NaNs count as equal (the GPU writes its own
/// canonical NaN, x86 keeps the operand's payload).
fn bits_differ(a: &[f32], b: &[f32]) -> usize {
    assert_eq!(a.len(), b.len(), "lengths");
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan()))
        .count()
}

/// The row maps of a shared prompt's rows (`row_map.rs`): gathers are copies (f32
/// and BF16 rows, zero rows where asked), sums add each row's sources in the order
/// given, one f32 addition at a time (rounded to BF16 values when asked), as the
/// CPU loops below do.
#[test]
fn row_maps_copy_and_sum_rows() {
    let Some(g) = gpu() else { return };
    let (rows, cols) = (300, 136);
    let src = rnd(rows * cols, 91, 3.0);
    let ds = up(&g, &src);
    let map: Vec<Option<usize>> = (0..211)
        .map(|j| (j % 5 != 3).then_some((j * 131 + 7) % rows))
        .collect();
    let m = grm::RowMap::new(&g, &map, rows).unwrap();
    let got = m.gather(&g, &ds, cols).unwrap();
    let want: Vec<f32> = map
        .iter()
        .flat_map(|r| match r {
            Some(r) => src[r * cols..(r + 1) * cols].to_vec(),
            None => vec![0.0; cols],
        })
        .collect();
    let shape = format!("211 of [{rows}, {cols}], every fifth zero");
    report_exact(
        "row map gather (f32)",
        &shape,
        bits_differ(&dl(&g, &got, want.len()), &want),
    );
    let src16: Vec<u16> = src.iter().map(|&x| (x.to_bits() >> 16) as u16).collect();
    let ds16 = g.upload(&src16).unwrap();
    let got16 = m.gather(&g, &ds16, cols).unwrap();
    let want16: Vec<u16> = map
        .iter()
        .flat_map(|r| match r {
            Some(r) => src16[r * cols..(r + 1) * cols].to_vec(),
            None => vec![0; cols],
        })
        .collect();
    let got16 = g.download_n(&got16, want16.len()).unwrap();
    let differ = got16.iter().zip(&want16).filter(|(a, b)| a != b).count();
    report_exact("row map gather (BF16)", &shape, differ);
    assert!(grm::RowMap::new(&g, &[Some(rows)], rows).is_err());
    assert!(
        m.gather(&g, &ds16, 3).is_err(),
        "3 BF16 values are not whole words"
    );

    // Groups of 1 to 9 rows, with repeats, summed in the order given.
    let groups: Vec<Vec<usize>> = (0..97)
        .map(|j| (0..1 + j % 9).map(|t| (j * 37 + t * 101) % rows).collect())
        .collect();
    let sums = grm::RowSums::new(&g, &groups, rows).unwrap();
    for round in [false, true] {
        let got = sums.sum(&g, &ds, cols, round).unwrap();
        let mut want = Vec::with_capacity(groups.len() * cols);
        for gr in &groups {
            for c in 0..cols {
                let mut s = src[gr[0] * cols + c];
                for &r in &gr[1..] {
                    s += src[r * cols + c];
                }
                want.push(if round { bf16::round(s) } else { s });
            }
        }
        report_exact(
            &format!("row sums (round {round})"),
            &format!("97 groups of 1-9 of [{rows}, {cols}]"),
            bits_differ(&dl(&g, &got, want.len()), &want),
        );
    }
    assert!(grm::RowSums::new(&g, &[vec![]], rows).is_err());
    assert!(grm::RowSums::new(&g, &[vec![rows]], rows).is_err());
}

/// Element-wise ops, gather/scatter: bit-exact with the Rust expressions; the f64
/// sum of squares within 1e-12 of a compensated f64 sum and the same bits twice.
#[test]
fn tensor_ops_match_cpu() {
    let Some(g) = gpu() else { return };
    let n = 1_000_003;
    let sh = format!("[{n}]");
    let mut x = nasty(1, n, 70);
    x[17] = f32::NAN;
    x[18] = f32::INFINITY;
    x[19] = 1e-40; // subnormal
    let y = rnd(n, 71, 3.0);
    let mut d = up(&g, &x);
    gten::add_into(&g, &mut d, &up(&g, &y), n).unwrap();
    let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    report_exact("tensor add_into", &sh, bits_differ(&dl(&g, &d, n), &want));
    for s in [3.0f32, 0.1, 7.3e-5] {
        let mut d = up(&g, &x);
        gten::div_scalar(&g, &mut d, n, s).unwrap();
        let want: Vec<f32> = x.iter().map(|a| a / s).collect();
        report_exact(
            &format!("tensor div_scalar {s}"),
            &sh,
            bits_differ(&dl(&g, &d, n), &want),
        );
    }
    let mut d = up(&g, &x);
    gten::round_bf16(&g, &mut d, n).unwrap();
    let mut want = x.clone();
    bf16::round_slice(&mut want);
    report_exact("tensor round_bf16", &sh, bits_differ(&dl(&g, &d, n), &want));
    // Only the first n - 3 values: the tail must stay untouched.
    let mut d = up(&g, &x);
    gten::fill(&g, &mut d, n - 3, -2.5).unwrap();
    let mut want = vec![-2.5f32; n - 3];
    want.extend_from_slice(&x[n - 3..]);
    report_exact(
        "tensor fill (n - 3)",
        &sh,
        bits_differ(&dl(&g, &d, n), &want),
    );

    let (rows, cols) = (300, 136);
    let src = rnd(rows * cols, 72, 1.0);
    let idx: Vec<usize> = (0..97).map(|j| (j * 131 + 7) % rows).collect();
    let ds = up(&g, &src);
    let got = gten::gather_rows(&g, &ds, cols, &idx).unwrap();
    let want: Vec<f32> = idx
        .iter()
        .flat_map(|&r| src[r * cols..(r + 1) * cols].iter().copied())
        .collect();
    let shape = format!("97 of [{rows}, {cols}]");
    report_exact(
        "tensor gather_rows",
        &shape,
        bits_differ(&dl(&g, &got, want.len()), &want),
    );
    let mut dst = vec![0.5f32; rows * cols];
    let mut dd = up(&g, &dst);
    gten::scatter_rows(&g, &mut dd, cols, &idx, &got).unwrap();
    for (j, &r) in idx.iter().enumerate() {
        dst[r * cols..(r + 1) * cols].copy_from_slice(&want[j * cols..(j + 1) * cols]);
    }
    report_exact(
        "tensor scatter_rows",
        &shape,
        bits_differ(&dl(&g, &dd, rows * cols), &dst),
    );
    assert!(gten::gather_rows(&g, &ds, cols, &[rows]).is_err());
    assert!(gten::scatter_rows(&g, &mut dd, cols, &[1, 1], &got).is_err());

    for n in [1, 1000, 1_000_003, 5_000_000] {
        let x = rnd(n, 73 + n as u64, 2.0);
        // A compensated (Neumaier) f64 sum: the sequential f64 sum is itself off by
        // up to ~1e-11 relative at these lengths (printed below for reference).
        let (mut want, mut comp, mut seq) = (0f64, 0f64, 0f64);
        for &v in &x {
            let t = v as f64 * v as f64;
            let s = want + t;
            comp += if want.abs() >= t {
                (want - s) + t
            } else {
                (t - s) + want
            };
            want = s;
            seq += t;
        }
        want += comp;
        let dx = up(&g, &x);
        let mut acc = g.upload(&[1.0f64, 0.0, 0.0]).unwrap();
        gten::sum_squares_into(&g, &dx, n, &mut acc, 1).unwrap();
        gten::sum_squares_into(&g, &dx, n, &mut acc, 2).unwrap();
        gten::sum_squares_into(&g, &dx, n, &mut acc, 2).unwrap();
        let a = g.download(&acc).unwrap();
        let sh = format!("[{n}]");
        report(
            "tensor sum_squares vs Kahan f64",
            &sh,
            (a[1] - want).abs() / want,
            1e-12,
        );
        println!(
            "         (sequential f64 sum vs compensated: {:.2e})",
            (seq - want).abs() / want
        );
        report_exact(
            "tensor sum_squares_into twice",
            &sh,
            (a[0] != 1.0) as usize + (a[2].to_bits() != (a[1] + a[1]).to_bits()) as usize,
        );
    }
    done();
}

/// AdamW on the device against `adamw_reference`, every bit of p, m and v.
#[test]
fn adamw_is_bit_exact() {
    let Some(g) = gpu() else { return };
    let n = 1_000_003;
    let (b1, b2) = (0.9f32, 0.95f32);
    for (t, decay, grad_scale) in [(1, true, 0.37f32), (10, false, 0.37), (10, true, 1.0)] {
        let s = gadam::AdamStep {
            lr: 3e-4,
            beta1: b1,
            beta2: b2,
            eps: 1e-8,
            bc1: 1.0 - (b1 as f64).powi(t),
            bc2: 1.0 - (b2 as f64).powi(t),
            wd_factor: 1.0 - 3e-4 * 0.1,
            decay,
            grad_scale,
        };
        let mut p = nasty(1, n, 80 + t as u64);
        let gr = nasty(1, n, 81);
        let mut m = rnd(n, 82, 1e-2);
        let mut v: Vec<f32> = rnd(n, 83, 1e-2).iter().map(|x| x * x).collect();
        if t == 1 {
            m.iter_mut().for_each(|x| *x = 0.0);
            v.iter_mut().for_each(|x| *x = 0.0);
        }
        let (mut dp, dg, mut dm, mut dv) = (up(&g, &p), up(&g, &gr), up(&g, &m), up(&g, &v));
        gadam::adamw_step(&g, &mut dp, &dg, &mut dm, &mut dv, n, &s).unwrap();
        gadam::adamw_reference(&mut p, &gr, &mut m, &mut v, &s);
        let sh = format!("[{n}] t={t} decay={decay} gs={grad_scale}");
        report_exact("adamw p", &sh, bits_differ(&dl(&g, &dp, n), &p));
        report_exact("adamw m", &sh, bits_differ(&dl(&g, &dm, n), &m));
        report_exact("adamw v", &sh, bits_differ(&dl(&g, &dv, n), &v));
    }
    done();
}

/// AdamW's third step (betas 0.9 / 0.95, lr 3e-4, weight decay 0.1) with the
/// gradient scaled by `grad_scale`: the multi-tensor tests' scalars.
fn third_step(grad_scale: f32) -> gadam::AdamStep {
    let (b1, b2) = (0.9f32, 0.95f32);
    gadam::AdamStep {
        lr: 3e-4,
        beta1: b1,
        beta2: b2,
        eps: 1e-8,
        bc1: 1.0 - (b1 as f64).powi(3),
        bc2: 1.0 - (b2 as f64).powi(3),
        wd_factor: 1.0 - 3e-4 * 0.1,
        decay: true,
        grad_scale,
    }
}

/// A gradient with a chunk mask (the untied embedding's) gives the bits of a plain
/// one over steps whose scatters touch different rows (each clear zeroes only what
/// the last step marked), through a dense writer in between (which marks every
/// chunk), and in what the gradient norm and AdamW read. The table's rows (96
/// values) straddle the 1024-value chunks; its length is not a multiple of one.
#[test]
fn masked_gradient_matches_a_plain_one() {
    use cuda::grad::GradAcc;
    let Some(g) = gpu() else { return };
    let (vocab, dim) = (1013, 96);
    let n = vocab * dim;
    let (mut plain, mut masked) = (
        GradAcc::new(&g, n).unwrap(),
        GradAcc::new_masked(&g, n).unwrap(),
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    let mut differ = 0;
    for step in 0..4 {
        plain.clear();
        masked.clear();
        if step == 2 {
            // A dense writer (as the tied LM head's gradient would be).
            let x = up(&g, &rnd(n, 300, 1.0));
            gten::add_into(&g, plain.f32_mut(&g).unwrap(), &x, n).unwrap();
            gten::add_into(&g, masked.f32_mut(&g).unwrap(), &x, n).unwrap();
        }
        // Rows from a narrow band that moves each step, some repeated.
        let tokens: Vec<u32> = (0..200)
            .map(|_| (step as u32 * 250 + rng.random_range(0..300u32)) % vocab as u32)
            .collect();
        let dy = up(&g, &rnd(tokens.len() * dim, 400 + step as u64, 1.0));
        gops::embedding_backward(&g, plain.f32_mut(&g).unwrap(), vocab, dim, &tokens, &dy).unwrap();
        gops::embedding_backward_marked(
            &g,
            masked.f32_marked_mut(&g).unwrap(),
            vocab,
            dim,
            &tokens,
            &dy,
        )
        .unwrap();
        // The norm's sums of squares and an AdamW step from the same state.
        let mut sums = g.zeros::<f64>(2).unwrap();
        let both = [plain.src().unwrap(), masked.src().unwrap()];
        gten::sum_squares_multi(&g, &both, &mut sums).unwrap();
        let s2 = g.download(&sums).unwrap();
        differ += usize::from(s2[0].to_bits() != s2[1].to_bits());
        let (p0, m0, v0) = (rnd(n, 500, 1.0), rnd(n, 501, 0.1), rnd(n, 502, 0.01));
        let v0: Vec<f32> = v0.iter().map(|x| x.abs()).collect();
        let mut out = Vec::new();
        for src in both {
            let (mut p, mut m, mut v) = (up(&g, &p0), up(&g, &m0), up(&g, &v0));
            let mut ts = [gadam::AdamTensor {
                p: &mut p,
                g: src,
                m: &mut m,
                v: &mut v,
                decay: true,
                p_bf16: None,
                blocks: None,
            }];
            gadam::adamw_multi(&g, &mut ts, &third_step(0.5)).unwrap();
            out.push([dl(&g, &p, n), dl(&g, &m, n), dl(&g, &v, n)]);
        }
        for (a, b) in out[0].iter().zip(&out[1]) {
            differ += bits_differ(a, b);
        }
    }
    let (a, b) = (
        dl(&g, plain.f32_mut(&g).unwrap(), n),
        dl(&g, masked.f32_mut(&g).unwrap(), n),
    );
    differ += bits_differ(&a, &b);
    report_exact(
        "masked gradient == plain (4 steps: norm, AdamW, values)",
        &format!("[{vocab}, {dim}]"),
        differ,
    );
    done();
}

/// A scatter into a gradient that holds BF16 addends (the tied embedding's, which
/// holds the LM head's WGrad outputs) takes them in the rows it writes and leaves
/// the rest held (`GradAcc::f32_scatter_mut`, `embedding_backward_into`) where it
/// holds one at a time, and settles them all first where it holds more: over three
/// steps of three micro-batches, holds of one to three, with +-0 among the addends
/// and rows repeated, the norm's sums and the values equal those of a plain
/// gradient that settles every addend before each scatter.
#[test]
fn scatter_settles_only_the_rows_it_writes() {
    use cuda::grad::{settle_multi, GradAcc, GradSrc, Settle};
    let Some(g) = gpu() else { return };
    let (vocab, dim) = (1013, 96);
    let n = vocab * dim;
    let bf = |seed: u64| bf16_with_zeros(&rnd(n, seed, 1.0), 89);
    let mut rng = rand::rngs::StdRng::seed_from_u64(43);
    let (mut differ, mut kept) = (0, 0);
    for hold in [1, 2, 3] {
        let (mut plain, mut fast) = (
            GradAcc::new(&g, n).unwrap(),
            GradAcc::new_masked(&g, n).unwrap(),
        );
        plain.set_hold(hold);
        fast.set_hold(hold);
        for step in 0..3u64 {
            plain.clear();
            fast.clear();
            for micro in 0..3u64 {
                let seed = 700 + 10 * step + micro;
                for a in [&mut plain, &mut fast] {
                    settle_multi(&g, std::slice::from_mut(a), Settle::Full).unwrap();
                    a.add_bf16(&g, g.upload(&bf(seed)).unwrap()).unwrap();
                }
                let tokens: Vec<u32> = (0..150)
                    .map(|_| (micro as u32 * 200 + rng.random_range(0..400u32)) % vocab as u32)
                    .collect();
                let dy = up(&g, &rnd(tokens.len() * dim, seed + 5, 1.0));
                let dest = plain.f32_marked_mut(&g).unwrap();
                gops::embedding_backward_marked(&g, dest, vocab, dim, &tokens, &dy).unwrap();
                let dest = fast.f32_scatter_mut(&g).unwrap();
                gops::embedding_backward_into(&g, dest, vocab, dim, &tokens, &dy).unwrap();
                kept += fast.held();
                if hold > 1 {
                    assert_eq!(fast.held(), 0, "hold {hold}: the scatter settles all first");
                }
            }
            for a in [&mut plain, &mut fast] {
                settle_multi(&g, std::slice::from_mut(a), Settle::AllButLast).unwrap();
            }
            let mut sums = g.zeros::<f64>(2).unwrap();
            let both: [GradSrc; 2] = [plain.src().unwrap(), fast.src().unwrap()];
            gten::sum_squares_multi(&g, &both, &mut sums).unwrap();
            let s2 = g.download(&sums).unwrap();
            differ += usize::from(s2[0].to_bits() != s2[1].to_bits());
            let (a, b) = (
                dl(&g, plain.f32_mut(&g).unwrap(), n),
                dl(&g, fast.f32_mut(&g).unwrap(), n),
            );
            differ += bits_differ(&a, &b);
        }
    }
    // At hold 1 the scatter left its addend held (the row path ran) each time.
    assert_eq!(
        kept, 9,
        "the scatter settled its gradient whole ({kept} held)"
    );
    report_exact(
        "scatter settling its rows == settling all first (holds 1-3, 3 steps)",
        &format!("[{vocab}, {dim}]"),
        differ,
    );
    done();
}

/// The multi-tensor AdamW and sum of squares give each tensor the bits of its
/// own launches (tensors of odd sizes, decay on every other one).
#[test]
fn multi_tensor_adamw_and_norm_match_per_tensor_launches() {
    let Some(g) = gpu() else { return };
    let sizes = [1_000_003usize, 5, 256, 257, 70_001];
    let s = third_step(0.37);
    let host: Vec<[Vec<f32>; 4]> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let k = 100 + 4 * i as u64;
            let v: Vec<f32> = rnd(n, k + 3, 1e-2).iter().map(|x| x * x).collect();
            [nasty(1, n, k), nasty(1, n, k + 1), rnd(n, k + 2, 1e-2), v]
        })
        .collect();
    let dev = || -> Vec<[cudarc::driver::CudaSlice<f32>; 4]> {
        host.iter()
            .map(|t| [up(&g, &t[0]), up(&g, &t[1]), up(&g, &t[2]), up(&g, &t[3])])
            .collect()
    };
    let (mut one, mut multi) = (dev(), dev());
    for (i, t) in one.iter_mut().enumerate() {
        let [p, gr, m, v] = t;
        let st = gadam::AdamStep {
            decay: i % 2 == 0,
            ..s
        };
        gadam::adamw_step(&g, p, gr, m, v, sizes[i], &st).unwrap();
    }
    // Every other tensor's BF16 copy rewritten by the step (odd sizes: the scalar
    // path too).
    let mut copies: Vec<Option<cudarc::driver::CudaSlice<u16>>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (i % 2 == 1).then(|| g.zeros::<u16>(n).unwrap()))
        .collect();
    let mut ts: Vec<gadam::AdamTensor> = multi
        .iter_mut()
        .zip(copies.iter_mut())
        .enumerate()
        .map(|(i, ([p, gr, m, v], pb))| gadam::AdamTensor {
            p,
            g: cuda::grad::GradSrc::f32(gr),
            m,
            v,
            decay: i % 2 == 0,
            p_bf16: pb.as_ref().map(Into::into),
            blocks: None,
        })
        .collect();
    gadam::adamw_multi(&g, &mut ts, &s).unwrap();
    let mut diff = 0;
    for (i, (a, b)) in one.iter().zip(&multi).enumerate() {
        for j in [0, 2, 3] {
            diff += bits_differ(&dl(&g, &a[j], sizes[i]), &dl(&g, &b[j], sizes[i]));
        }
    }
    report_exact(
        "adamw multi-tensor vs per tensor (p, m, v)",
        "5 tensors",
        diff,
    );
    // The copies: to_bf16_padded's bits of the new values.
    let mut cdiff = 0;
    for (i, c) in copies.iter().enumerate() {
        let Some(c) = c else { continue };
        let n = sizes[i];
        let want = g
            .download(&gq::to_bf16_padded(&g, &one[i][0], 1, n, 1, n).unwrap())
            .unwrap();
        let got = g.download(c).unwrap();
        cdiff += want[..n]
            .iter()
            .zip(&got[..n])
            .filter(|(x, y)| x != y)
            .count();
    }
    report_exact(
        "adamw BF16 copies vs to_bf16_padded of the new values",
        "2 tensors",
        cdiff,
    );
    let xs: Vec<_> = one.iter().map(|t| &t[0]).collect();
    let mut acc1 = g.zeros::<f64>(xs.len()).unwrap();
    for (i, x) in xs.iter().enumerate() {
        gten::sum_squares_into(&g, x, sizes[i], &mut acc1, i).unwrap();
    }
    let mut acc2 = g.zeros::<f64>(xs.len()).unwrap();
    let srcs: Vec<_> = xs.iter().map(|x| cuda::grad::GradSrc::f32(x)).collect();
    gten::sum_squares_multi(&g, &srcs, &mut acc2).unwrap();
    let (a1, a2) = (g.download(&acc1).unwrap(), g.download(&acc2).unwrap());
    let sdiff = a1
        .iter()
        .zip(&a2)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    report_exact(
        "sum of squares multi-tensor vs per tensor",
        "5 tensors",
        sdiff,
    );
    done();
}

/// AdamW with the FP8 weight blocks rewritten in the same launch
/// (`adamw_block128_multi`) gives the bits of `adamw_multi` then
/// `quantize_block128` of the new values: p, m, v, the codes and scales (their
/// padding included) of W and W^T, and the BF16 copy; over partial blocks, rows of
/// an odd width (the scalar path), a held BF16 gradient addend and the clip's scale
/// read on the device.
#[test]
fn adamw_with_fp8_blocks_matches_adamw_then_quantize() {
    let Some(g) = gpu() else { return };
    // (rows, cols, transposed, BF16 copy, held addend)
    let shapes = [
        (200, 144, true, true, false),
        (130, 257, false, false, true),
        (256, 128, true, false, true),
        (1, 64, false, true, false),
        (300, 1000, true, false, false),
    ];
    let s = third_step(1.0);
    let acc = g.upload(&[4.0e5f64, 1.0]).unwrap();
    let (_, scale) = gten::clip_scale(&g, &acc, 2, 300.0).unwrap();
    let host: Vec<[Vec<f32>; 4]> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(r, c, ..))| {
            let (n, k) = (r * c, 700 + 5 * i as u64);
            let v: Vec<f32> = rnd(n, k + 3, 1e-2).iter().map(|x| x * x).collect();
            [nasty(r, c, k), nasty(r, c, k + 1), rnd(n, k + 2, 1e-2), v]
        })
        .collect();
    let held: Vec<Option<Vec<u16>>> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(r, c, _, _, h))| {
            h.then(|| {
                rnd(r * c, 800 + i as u64, 1e-1)
                    .iter()
                    .map(|&x| half::bf16::from_f32(x).to_bits())
                    .collect()
            })
        })
        .collect();
    let dev = || -> Vec<[cudarc::driver::CudaSlice<f32>; 4]> {
        host.iter().map(|t| t.clone().map(|x| up(&g, &x))).collect()
    };
    let (mut plain, mut fused) = (dev(), dev());
    let pends: Vec<Option<cudarc::driver::CudaSlice<u16>>> = held
        .iter()
        .map(|h| h.as_ref().map(|b| g.upload(b).unwrap()))
        .collect();
    fn src<'a>(
        gr: &'a cudarc::driver::CudaSlice<f32>,
        pend: Option<&'a cudarc::driver::CudaSlice<u16>>,
    ) -> cuda::grad::GradSrc<'a> {
        cuda::grad::GradSrc {
            acc: Some(gr),
            pend: pend.map(|p| (p, 0)),
            len: gr.len(),
            mask: None,
        }
    }
    // adamw_multi, then each new weight quantized (and copied to BF16) alone.
    let mut ts: Vec<gadam::AdamTensor> = plain
        .iter_mut()
        .enumerate()
        .map(|(i, [p, gr, m, v])| gadam::AdamTensor {
            p,
            g: src(gr, pends[i].as_ref()),
            m,
            v,
            decay: i % 2 == 0,
            p_bf16: None,
            blocks: None,
        })
        .collect();
    gadam::adamw_multi_scaled(&g, &mut ts, &s, Some(&scale)).unwrap();
    drop(ts);
    let want: Vec<_> = plain
        .iter()
        .zip(&shapes)
        .map(|(t, &(r, c, tr, ..))| gq::quantize_block128(&g, &t[0], r, c, tr).unwrap())
        .collect();
    // The fused step rewrites blocks made from the old weights (and a stale BF16 copy).
    let mut old: Vec<_> = fused
        .iter()
        .zip(&shapes)
        .map(|(t, &(r, c, tr, ..))| gq::quantize_block128(&g, &t[0], r, c, tr).unwrap())
        .collect();
    let mut copies: Vec<Option<cudarc::driver::CudaSlice<u16>>> = shapes
        .iter()
        .map(|&(r, c, _, b, _)| b.then(|| g.zeros::<u16>(r * c).unwrap()))
        .collect();
    let mut ts: Vec<gadam::AdamTensor> = fused
        .iter_mut()
        .zip(old.iter_mut().zip(copies.iter_mut()))
        .enumerate()
        .map(|(i, ([p, gr, m, v], ((w, wt), pb)))| gadam::AdamTensor {
            p,
            g: src(gr, pends[i].as_ref()),
            m,
            v,
            decay: i % 2 == 0,
            p_bf16: pb.as_ref().map(Into::into),
            blocks: Some(gadam::BlockTargets {
                w,
                t: wt.as_mut().map(gadam::TTarget::Own),
            }),
        })
        .collect();
    gadam::adamw_multi_scaled(&g, &mut ts, &s, Some(&scale)).unwrap();
    drop(ts);
    let mut state = 0;
    for (i, (a, b)) in plain.iter().zip(&fused).enumerate() {
        let n = shapes[i].0 * shapes[i].1;
        for j in [0, 2, 3] {
            state += bits_differ(&dl(&g, &a[j], n), &dl(&g, &b[j], n));
        }
    }
    report_exact(
        "adamw with FP8 blocks vs adamw_multi (p, m, v)",
        "5 weights",
        state,
    );
    let mut blocks = 0;
    for ((w, wt), (o, ot)) in want.iter().zip(&old) {
        let mut pairs = vec![(w, o)];
        if let (Some(a), Some(b)) = (wt, ot) {
            pairs.push((a, b));
        }
        for (a, b) in pairs {
            let (ac, bc) = (g.download(&a.codes).unwrap(), g.download(&b.codes).unwrap());
            blocks += ac.iter().zip(&bc).filter(|(x, y)| x != y).count();
            let n = a.scales.len();
            blocks += bits_differ(&dl(&g, &a.scales, n), &dl(&g, &b.scales, n));
        }
    }
    report_exact(
        "adamw with FP8 blocks vs quantize_block128 of the new values (W, W^T)",
        "5 weights",
        blocks,
    );
    let mut cdiff = 0;
    for (i, c) in copies.iter().enumerate() {
        let Some(c) = c else { continue };
        let (r, k) = (shapes[i].0, shapes[i].1);
        let want = g
            .download(&gq::to_bf16_padded(&g, &plain[i][0], r, k, r, k).unwrap())
            .unwrap();
        cdiff += want
            .iter()
            .zip(&g.download(c).unwrap())
            .filter(|(x, y)| x != y)
            .count();
    }
    report_exact(
        "adamw with FP8 blocks: BF16 copies vs to_bf16_padded of the new values",
        "2 weights",
        cdiff,
    );
    done();
}

/// The gradient clip on the device: `clip_scale`'s norm and scale have the bits of
/// the host optimizer's arithmetic on the same per-tensor sums (clip off, not
/// reached, reached, and a NaN sum), and AdamW reading that scale on the device
/// (`adamw_multi_scaled`) gives the bits of AdamW given it as a number.
#[test]
fn clip_scale_matches_the_host_optimizer() {
    let Some(g) = gpu() else { return };
    // rl::optim::AdamW::step: norm = sqrt(in-order sum), scale as f32.
    let host = |sums: &[f64], clip: f64| {
        let norm = sums.iter().sum::<f64>().sqrt();
        let scale = if clip > 0.0 && norm > clip {
            clip / norm
        } else {
            1.0
        };
        (norm, scale as f32)
    };
    let sums = vec![3.25e3, 0.0, 1.5e-7, 42.123456789, 7.0e5 / 3.0, 1e-300];
    let mut nan = sums.clone();
    nan[2] = f64::NAN;
    let mut differ = 0;
    for (s, clip) in [
        (&sums, 0.0),
        (&sums, 1e9),
        (&sums, 1.0),
        (&sums, 850.3),
        (&nan, 1.0),
    ] {
        let acc = g.upload(s).unwrap();
        let (dn, ds) = gten::clip_scale(&g, &acc, s.len(), clip).unwrap();
        let (n, sc) = (g.download(&dn).unwrap()[0], g.download(&ds).unwrap()[0]);
        let (hn, hs) = host(s, clip);
        differ += usize::from(n.to_bits() != hn.to_bits() && !(n.is_nan() && hn.is_nan()));
        differ += usize::from(sc.to_bits() != hs.to_bits());
    }
    report_exact("clip_scale norm and scale vs the host's", "5 cases", differ);
    // AdamW with the scale read on the device vs given as a number.
    let n = 70_001;
    let (_, hs) = host(&sums, 850.3);
    let s = third_step(hs);
    let v: Vec<f32> = rnd(n, 203, 1e-2).iter().map(|x| x * x).collect();
    let host_t = [nasty(1, n, 200), nasty(1, n, 201), rnd(n, 202, 1e-2), v];
    let dev = || -> [cudarc::driver::CudaSlice<f32>; 4] { host_t.clone().map(|x| up(&g, &x)) };
    let (mut a, mut b) = (dev(), dev());
    let acc = g.upload(&sums).unwrap();
    let (_, scale) = gten::clip_scale(&g, &acc, sums.len(), 850.3).unwrap();
    for (t, dev_scale) in [(&mut a, None), (&mut b, Some(&scale))] {
        let [p, gr, m, v] = t;
        let mut ts = [gadam::AdamTensor {
            p,
            g: cuda::grad::GradSrc::f32(gr),
            m,
            v,
            decay: true,
            p_bf16: None,
            blocks: None,
        }];
        let st = gadam::AdamStep {
            grad_scale: if dev_scale.is_some() { 1.0 } else { hs },
            ..s
        };
        gadam::adamw_multi_scaled(&g, &mut ts, &st, dev_scale).unwrap();
    }
    let diff: usize = [0, 2, 3]
        .iter()
        .map(|&j| bits_differ(&dl(&g, &a[j], n), &dl(&g, &b[j], n)))
        .sum();
    report_exact(
        "adamw with the scale on the device vs given (p, m, v)",
        "[70001]",
        diff,
    );
    done();
}

/// A gradient whose last WGrad output is held in BF16 (`GradAcc`) reads, in the
/// gradient norm and AdamW, as the f32 gradient its epilogue would have written:
/// accumulators never written (+0, signed zeros among the addends), written, and
/// with two addends (the first added when the second arrives), with five held
/// three or eight at a time (settled together: the same adds in the same order);
/// settling it gives those values too.
#[test]
fn held_bf16_gradients_read_as_the_epilogue_wrote_them() {
    use cuda::grad::{GradAcc, GradSrc, Settle};
    let Some(g) = gpu() else { return };
    let sizes = [1_000_003usize, 5, 4096, 70_001];
    // BF16 codes of random values, with +-0 and a few large ones among them.
    let bf = |n: usize, seed: u64| bf16_with_zeros(&nasty(1, n, seed), 97);
    let f = |b: &[u16]| -> Vec<f32> {
        b.iter()
            .map(|&h| half::bf16::from_bits(h).to_f32())
            .collect()
    };
    let s = gadam::AdamStep {
        lr: 3e-4,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        bc1: 1.0 - 0.9f64.powi(2),
        bc2: 1.0 - 0.95f64.powi(2),
        wd_factor: 1.0 - 3e-4 * 0.1,
        decay: true,
        grad_scale: 0.37,
    };
    // case 0: never written + one addend; 1: written + one addend; 2: never
    // written + two addends; 3: written, no addend; 4: never written + five
    // addends held three at a time (`set_hold`: settled three together, then all
    // but the last before the reads); 5: written + five addends held eight at a
    // time (four settled together before the reads).
    for case in 0..6 {
        let (mut accs, mut multi): (Vec<GradAcc>, Vec<GradAcc>) = (Vec::new(), Vec::new());
        let mut want: Vec<Vec<f32>> = Vec::new();
        for (t, &n) in sizes.iter().enumerate() {
            let seed = 300 + 10 * t as u64 + case;
            let base = nasty(1, n, seed);
            let bs: Vec<Vec<u16>> = (1..=5).map(|i| bf(n, seed + i)).collect();
            let written = matches!(case, 1 | 3 | 5);
            let mut a = match written {
                true => GradAcc::from_f32(up(&g, &base)),
                false => GradAcc::new(&g, n).unwrap(),
            };
            a.set_hold(match case {
                4 => 3,
                5 => 8,
                _ => 1,
            });
            // The epilogue's values: a zeroed (or written) f32, each dW added.
            let mut w: Vec<f32> = match written {
                true => base.clone(),
                false => vec![0.0; n],
            };
            let adds: &[Vec<u16>] = match case {
                0 | 1 => &bs[..1],
                2 => &bs[..2],
                4 | 5 => &bs[..],
                _ => &[],
            };
            // The same gradient for settle_multi (masked where never written and
            // two addends come, settled together between them).
            let mut a2 = match case {
                1 | 3 | 5 => GradAcc::from_f32(up(&g, &base)),
                2 => GradAcc::new_masked(&g, n).unwrap(),
                _ => GradAcc::new(&g, n).unwrap(),
            };
            let all = Settle::All;
            for (i, b) in adds.iter().enumerate() {
                // A backward pass's start, then its WGrad output held.
                cuda::grad::settle_multi(&g, std::slice::from_mut(&mut a), Settle::Full).unwrap();
                a.add_bf16(&g, g.upload(b).unwrap()).unwrap();
                if i > 0 {
                    cuda::grad::settle_multi(&g, std::slice::from_mut(&mut a2), all).unwrap();
                }
                a2.add_bf16(&g, g.upload(b).unwrap()).unwrap();
                w.iter_mut().zip(f(b)).for_each(|(x, y)| *x += y);
            }
            if case >= 4 {
                assert!(a.src().is_err(), "a gradient holding addends was read");
                let last = Settle::AllButLast;
                cuda::grad::settle_multi(&g, std::slice::from_mut(&mut a), last).unwrap();
                assert_eq!(a.held(), 1, "all but the last addend settled");
            }
            accs.push(a);
            multi.push(a2);
            want.push(w);
        }
        let sh = format!("case {case}, {} tensors", sizes.len());
        // Gradient norm.
        let srcs: Vec<GradSrc> = accs.iter().map(|a| a.src().unwrap()).collect();
        let (mut s1, mut s2) = (g.zeros::<f64>(4).unwrap(), g.zeros::<f64>(4).unwrap());
        gten::sum_squares_multi(&g, &srcs, &mut s1).unwrap();
        let ups: Vec<_> = want.iter().map(|w| up(&g, w)).collect();
        let plain: Vec<GradSrc> = ups.iter().map(GradSrc::f32).collect();
        gten::sum_squares_multi(&g, &plain, &mut s2).unwrap();
        let (a1, a2) = (g.download(&s1).unwrap(), g.download(&s2).unwrap());
        let nd = a1
            .iter()
            .zip(&a2)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        report_exact("sum of squares, held BF16 gradient vs f32", &sh, nd);
        // AdamW.
        let state = |t: usize| {
            let n = sizes[t];
            let v: Vec<f32> = rnd(n, 500 + t as u64, 1e-2).iter().map(|x| x * x).collect();
            [nasty(1, n, 400 + t as u64), rnd(n, 450 + t as u64, 1e-2), v]
        };
        let dev = || -> Vec<[cudarc::driver::CudaSlice<f32>; 3]> {
            (0..sizes.len())
                .map(|t| state(t).map(|x| up(&g, &x)))
                .collect()
        };
        let (mut held, mut flat) = (dev(), dev());
        for (ps, srcs) in [(&mut held, &srcs), (&mut flat, &plain)] {
            let mut ts: Vec<gadam::AdamTensor> = ps
                .iter_mut()
                .zip(srcs.iter())
                .map(|([p, m, v], gs)| gadam::AdamTensor {
                    p,
                    g: *gs,
                    m,
                    v,
                    decay: true,
                    p_bf16: None,
                    blocks: None,
                })
                .collect();
            gadam::adamw_multi(&g, &mut ts, &s).unwrap();
        }
        let mut diff = 0;
        for (t, (a, b)) in held.iter().zip(&flat).enumerate() {
            for j in 0..3 {
                diff += bits_differ(&dl(&g, &a[j], sizes[t]), &dl(&g, &b[j], sizes[t]));
            }
        }
        report_exact("adamw, held BF16 gradient vs f32 (p, m, v)", &sh, diff);
        // Settled into f32.
        drop(srcs);
        let mut diff = 0;
        for (t, a) in accs.iter_mut().enumerate() {
            diff += bits_differ(&dl(&g, a.f32_mut(&g).unwrap(), sizes[t]), &want[t]);
        }
        report_exact("held BF16 gradient settled into f32", &sh, diff);
        // Settled all together in one launch.
        cuda::grad::settle_multi(&g, &mut multi, Settle::All).unwrap();
        let mut diff = 0;
        for (t, a) in multi.iter_mut().enumerate() {
            assert!(
                a.src().unwrap().pend.is_none(),
                "settle_multi left tensor {t} an addend"
            );
            diff += bits_differ(&dl(&g, a.f32_mut(&g).unwrap(), sizes[t]), &want[t]);
        }
        report_exact(
            "held BF16 gradients settled in one launch (settle_multi)",
            &sh,
            diff,
        );
    }
    done();
}

/// The memory pool keeps freed memory for the next step, and gives it back when
/// an allocation would otherwise run out: 60% of the free memory allocated and
/// freed, then 70% allocated, succeeds.
#[test]
fn pool_memory_is_given_back_when_the_device_runs_out() {
    let Some(g) = gpu() else { return };
    g.sync().unwrap();
    let (free, _) = cudarc::driver::result::mem_get_info().unwrap();
    let a = g.zeros::<u8>(free / 10 * 6).unwrap();
    drop(a);
    g.sync().unwrap();
    let (held, _) = cudarc::driver::result::mem_get_info().unwrap();
    println!(
        "POOL | free {:.1} GiB; after 60% freed: {:.1} GiB free (kept by the pool)",
        free as f64 / (1u64 << 30) as f64,
        held as f64 / (1u64 << 30) as f64
    );
    let b = g.zeros::<u8>(free / 10 * 7);
    report_exact(
        "pool: 70% after 60% freed allocates",
        "",
        b.is_err() as usize,
    );
    drop(b);
    done();
}

/// Gumbel-max with the competitors packed around the winner: rows whose logp is the
/// row's own noise negated plus jitter of 0 to 1e-2 (so thousands of entries score
/// within the skip bound's margin of the best), rows whose logp is the first bound
/// negated (`(L + 1) ln 2` from the hash's leading ones) plus the same jitters (so
/// every entry sits at that bound's edge), and a row of equal logp (the noise
/// alone). The kernels skip the f64 noise of entries whose f32 upper bounds already
/// fall short of the best so far in their warp; they must still pick the
/// reference's tokens.
#[test]
fn sample_rows_skips_only_losers() {
    let Some(g) = gpu() else { return };
    let vocab = 151_936;
    let jitters = [0.0f32, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2];
    let rows = 2 * jitters.len() + 1;
    let seeds: Vec<u64> = (0..rows as u64).map(|r| 0x5eed ^ (r << 24)).collect();
    let noise = rnd(rows * vocab, 91, 1.0);
    let mut lp = vec![-11.9f32; rows * vocab];
    for (i, jit) in jitters.iter().enumerate() {
        let (r, e) = (1 + i, 1 + jitters.len() + i);
        for j in 0..vocab {
            let v = -gsam::gumbel_noise(seeds[r], j) - 12.0;
            lp[r * vocab + j] = v as f32 + jit * noise[r * vocab + j];
            let l = gsam::gumbel_leading_ones(seeds[e], j) as f32;
            let v = -((l + 1.0) * std::f32::consts::LN_2) - 12.0;
            lp[e * vocab + j] = v + jit * noise[e * vocab + j];
        }
    }
    let got = gsam::sample_rows(&g, &up(&g, &lp), rows, vocab, false, &seeds).unwrap();
    let got = got.download(&g).unwrap();
    let want = gsam::sample_reference(&lp, vocab, false, &seeds);
    let bad = (0..rows).filter(|&r| got[r].0 != want[r].0).count();
    report_exact(
        "sample_rows gumbel, packed competitors",
        &format!("[{rows}, {vocab}]"),
        bad,
    );
    done();
}

/// How many rows of two draws differ in token or in logp bits.
fn draws_differ(a: &[(u32, f32)], b: &[(u32, f32)]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.0 != y.0 || x.1.to_bits() != y.1.to_bits())
        .count()
}

/// `sample_rows` of the logp rows `lp` (on the device as `dlp`) against
/// `sample_reference`, tokens and logp bits, reported as `what`; the device's draws.
fn rows_vs_reference(
    g: &cuda::Gpu,
    (dlp, lp): (&cudarc::driver::CudaSlice<f32>, &[f32]),
    (rows, vocab): (usize, usize),
    greedy: bool,
    seeds: &[u64],
    what: &str,
) -> Vec<(u32, f32)> {
    let got = gsam::sample_rows(g, dlp, rows, vocab, greedy, seeds).unwrap();
    let got = got.download(g).unwrap();
    let want = gsam::sample_reference(lp, vocab, greedy, seeds);
    report_exact(
        what,
        &format!("[{rows}, {vocab}]"),
        draws_differ(&got, &want),
    );
    got
}

/// Special values: NaN and -inf never win (a row of nothing else draws token 0), +inf
/// entries tie and the lowest index wins, a row mixing NaN, -inf and +inf with finite
/// values, greedy ties at a low and a high index, and signed zeros as the maxima. The
/// device's tokens are the
/// reference's (with logp bits), drawn from logp rows; greedy from logits through their
/// row stats (the same tokens as from those rows' log-softmax); sampled from logits,
/// the inverse-CDF draw's reference (NaN and -inf never drawn, +inf entries sharing
/// the mass).
#[test]
fn sample_rows_special_values() {
    let Some(g) = gpu() else { return };
    let vocab = 151_936;
    let (nan, ninf, inf) = (f32::NAN, f32::NEG_INFINITY, f32::INFINITY);
    let base = rnd(vocab, 93, 4.0);
    let mut rows: Vec<Vec<f32>> = vec![vec![ninf; vocab], vec![nan; vocab]];
    let mut r = base.clone();
    for j in [70_000, 5_000, 150_000] {
        r[j] = inf;
    }
    rows.push(r);
    let mut r = base.clone();
    for j in (0..vocab).step_by(3) {
        r[j] = if j % 2 == 0 { nan } else { ninf };
    }
    r[99_999] = inf;
    rows.push(r);
    let mut r = base.clone();
    for j in (0..vocab).step_by(2) {
        r[j] = nan;
    }
    rows.push(r);
    let mut r = base.clone();
    r[100_000] = 9.0;
    r[3] = 9.0;
    rows.push(r);
    // Signed zeros as the row's (and chunks') max, beside negative entries.
    let mut r: Vec<f32> = base.iter().map(|v| -1.0 - v.abs()).collect();
    for j in (7..vocab).step_by(9_000) {
        r[j] = if j % 2 == 0 { 0.0 } else { -0.0 };
    }
    rows.push(r);
    let n = rows.len();
    let lp: Vec<f32> = rows.concat();
    let seeds: Vec<u64> = (0..n as u64).map(|r| 0xfeed ^ (r << 16)).collect();
    let dlp = up(&g, &lp);
    for greedy in [true, false] {
        let what = if greedy { "greedy" } else { "gumbel" };
        let what_rows = format!("sample_rows {what}, special values");
        rows_vs_reference(&g, (&dlp, &lp), (n, vocab), greedy, &seeds, &what_rows);
    }
    // From logits: greedy, the tokens of sample_rows over their log-softmax rows.
    let rows_lp = glsm::log_softmax_rows(&g, &dlp, n, vocab).unwrap();
    let from_rows = gsam::sample_rows(&g, &rows_lp, n, vocab, true, &[]).unwrap();
    let from_rows = from_rows.download(&g).unwrap();
    let fused = gsam::sample_logits(&g, &dlp, n, vocab, true, &seeds).unwrap();
    let fused = fused.download(&g).unwrap();
    let bad = (0..n).filter(|&i| fused[i].0 != from_rows[i].0).count();
    report_exact(
        "sample_logits greedy, special values",
        &format!("[{n}, {vocab}]"),
        bad,
    );
    // Sampling from logits: the inverse-CDF draw's reference.
    logits_draw_vs_reference(&g, (&dlp, &lp), (n, vocab), &seeds, "special values");
    done();
}

/// `sample_logits` with seeds (the inverse-CDF draw, `draw_logits`) of tempered
/// logits `z` (on the device as `dz`) against `draw_reference`'s tokens, each with
/// the log-softmax entry of its token (`log_softmax_rows`, bit for bit).
fn logits_draw_vs_reference(
    g: &cuda::Gpu,
    (dz, z): (&cudarc::driver::CudaSlice<f32>, &[f32]),
    (rows, vocab): (usize, usize),
    seeds: &[u64],
    what: &str,
) {
    let got = gsam::sample_logits(g, dz, rows, vocab, false, seeds).unwrap();
    let got = got.download(g).unwrap();
    let want = gdraw::draw_reference(z, vocab, seeds);
    let lp = glsm::log_softmax_rows(g, dz, rows, vocab).unwrap();
    let lp = dl(g, &lp, rows * vocab);
    let bad = (0..rows)
        .filter(|&r| {
            let t = want[r] as usize;
            got[r].0 != want[r] || got[r].1.to_bits() != lp[r * vocab + t].to_bits()
        })
        .count();
    report_exact(
        &format!("sample_logits draw, {what} (token+logp)"),
        &format!("[{rows}, {vocab}]"),
        bad,
    );
}

/// The inverse-CDF draw on the device picks `draw_reference`'s tokens, with the
/// row's log-softmax entry as its logprob: random logits at three scales (at 40 most
/// entries of a chunk weigh nothing), BF16-rounded logits (equal masses), a peaked
/// row, rows of -inf but for a few entries in different chunks, a row whose chunks
/// all but one are -inf, a vocabulary of 17, one just past three chunks, one of 8,212
/// and one past 32 chunks (the chunk search in two groups of lanes).
#[test]
fn draw_logits_matches_reference() {
    let Some(g) = gpu() else { return };
    // 33 chunks and a few entries: the chunk search's second group of 32 lanes.
    for (rows, vocab) in [
        (37, 151_936),
        (300, 17),
        (9, 3 * 8192 + 5),
        (5, 8192 + 20), // a multiple of 4 whose last span is partial: the scalar path
        (7, 33 * 8192 + 3),
    ] {
        let mut z = rnd(rows * vocab, 97 + vocab as u64, 6.0);
        for r in 0..rows {
            let row = &mut z[r * vocab..(r + 1) * vocab];
            match r % 6 {
                1 => row.iter_mut().for_each(|v| *v = bf16::round(*v)),
                2 => row[(7 * r) % vocab] += 30.0,
                3 => row.iter_mut().for_each(|v| *v *= 40.0 / 6.0),
                4 => {
                    let keep = [r % vocab, (vocab / 2 + r) % vocab, vocab - 1];
                    for (j, v) in row.iter_mut().enumerate() {
                        if !keep.contains(&j) {
                            *v = f32::NEG_INFINITY;
                        }
                    }
                }
                5 => row[..vocab - vocab.min(40)]
                    .iter_mut()
                    .for_each(|v| *v = f32::NEG_INFINITY),
                _ => {}
            }
        }
        let dz = up(&g, &z);
        let seeds: Vec<u64> = (0..rows as u64).map(|r| 0xd4a3 ^ (r << 21)).collect();
        logits_draw_vs_reference(&g, (&dz, &z), (rows, vocab), &seeds, "random rows");
        // Another seed a row: other tokens, still the reference's.
        let seeds: Vec<u64> = seeds.iter().map(|s| s.wrapping_mul(31) + 5).collect();
        logits_draw_vs_reference(&g, (&dz, &z), (rows, vocab), &seeds, "other seeds");
    }
    done();
}

/// Sampling on the device picks the reference's tokens and returns the stored logp;
/// greedy draws straight from the logits pick the same, and sampling from the logits
/// picks the inverse-CDF draw's reference tokens.
#[test]
fn sample_rows_matches_reference() {
    let Some(g) = gpu() else { return };
    for (rows, vocab) in [(37, 151_936), (300, 17)] {
        let z = rnd(rows * vocab, 90 + vocab as u64, 6.0);
        let dz = up(&g, &z);
        let dlp = glsm::log_softmax_rows(&g, &dz, rows, vocab).unwrap();
        let lp = dl(&g, &dlp, rows * vocab);
        let seeds: Vec<u64> = (0..rows as u64).map(|r| 0xdead_beef ^ (r << 20)).collect();
        for greedy in [true, false] {
            let what = if greedy { "greedy" } else { "gumbel" };
            let what_rows = format!("sample_rows {what} (token+logp)");
            let got = rows_vs_reference(&g, (&dlp, &lp), (rows, vocab), greedy, &seeds, &what_rows);
            if !greedy {
                logits_draw_vs_reference(&g, (&dz, &z), (rows, vocab), &seeds, "random logits");
                continue;
            }
            // Greedy from the logits, chunked over blocks: the same tokens and logp bits.
            let fused = gsam::sample_logits(&g, &dz, rows, vocab, greedy, &seeds).unwrap();
            let fused = fused.download(&g).unwrap();
            report_exact(
                "sample_logits greedy == sample_rows",
                &format!("[{rows}, {vocab}]"),
                draws_differ(&fused, &got),
            );
        }
    }
    done();
}

/// Top-k / top-p draws on the device equal `sample_top_reference`'s (tokens and logp
/// bits) over log-softmax rows of random logits, of BF16-rounded logits (ties at
/// every boundary), of a peaked row, of a small vocabulary and of rows with NaN and
/// -inf entries, for top-k alone, top-p alone, both, and neither (the whole row,
/// where the tokens are `sample_rows`' too).
#[test]
fn sample_top_matches_reference() {
    let Some(g) = gpu() else { return };
    for (rows, vocab) in [(24, 151_936), (64, 17)] {
        let mut z = rnd(rows * vocab, 95 + vocab as u64, 6.0);
        for r in 0..rows {
            let row = &mut z[r * vocab..(r + 1) * vocab];
            match r % 4 {
                1 => row.iter_mut().for_each(|v| *v = bf16::round(*v)),
                2 => row[r % vocab] += 30.0,
                _ => {}
            }
        }
        let dz = up(&g, &z);
        let dlp = glsm::log_softmax_rows(&g, &dz, rows, vocab).unwrap();
        let mut lp = dl(&g, &dlp, rows * vocab);
        // NaN and -inf entries in every fourth row's log-probabilities.
        for r in (3..rows).step_by(4) {
            for j in (0..vocab).step_by(5) {
                lp[r * vocab + j] = if j % 2 == 0 {
                    f32::NAN
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
        let dlp = up(&g, &lp);
        let seeds: Vec<u64> = (0..rows as u64).map(|r| 0x70b ^ (r << 18)).collect();
        for (top_k, top_p) in [
            (1, 1.0),
            (20, 1.0),
            (0, 0.9),
            (0, 0.5),
            (50, 0.95),
            (3, 0.999),
            (0, 1.0),
        ] {
            let got = gtop::sample_top(&g, &dlp, rows, vocab, &seeds, top_k, top_p).unwrap();
            let got = got.download(&g).unwrap();
            let want = gtop::sample_top_reference(&lp, vocab, &seeds, top_k, top_p);
            report_exact(
                &format!("sample_top top_k {top_k} top_p {top_p} (token+logp)"),
                &format!("[{rows}, {vocab}]"),
                draws_differ(&got, &want),
            );
            if top_k == 0 && top_p == 1.0 {
                let rows_draw = gsam::sample_reference(&lp, vocab, false, &seeds);
                let bad = (0..rows).filter(|&r| got[r].0 != rows_draw[r].0).count();
                report_exact(
                    "sample_top, nothing cut == sample_rows",
                    &format!("[{rows}, {vocab}]"),
                    bad,
                );
            }
        }
    }
    done();
}

/// The check that needs only NVRTC (no device): every kernel source compiles.
#[test]
fn kernel_sources_compile() {
    match cuda::compile_all_sources("sm_90a") {
        Ok(mods) => println!("compiled for sm_90a: {mods:?}"),
        Err(cuda::CudaError::Unavailable(e)) => println!("skipping: {e}"),
        Err(e) => panic!("{e}"),
    }
}

/// The BF16 operand copies (both builds of the conversion kernel: 4 columns a
/// thread, and one where a row is not a multiple of 4) round like `bf16::round`,
/// with zero padding.
#[test]
fn bf16_padded_copies_are_bit_exact() {
    let Some(g) = gpu() else { return };
    for (rows, cols, rp, cp) in [(130, 896, 144, 896), (7, 300, 16, 304), (5, 13, 16, 16)] {
        let x = nasty(rows, cols, 77);
        let y = g
            .download(&gq::to_bf16_padded(&g, &up(&g, &x), rows, cols, rp, cp).unwrap())
            .unwrap();
        let mut want = vec![0u16; rp * cp];
        for r in 0..rows {
            for c in 0..cols {
                want[r * cp + c] = half::bf16::from_f32(x[r * cols + c]).to_bits();
            }
        }
        let differ = y[..rp * cp]
            .iter()
            .zip(&want)
            .filter(|(a, b)| a != b)
            .count();
        report_exact(
            "BF16 padded copy",
            &format!("[{rows}, {cols}] -> [{rp}, {cp}]"),
            differ,
        );
    }
    done();
}

/// A GEMM whose cuBLASLt algorithm was chosen by timing (`gemm_tune`, on unless
/// `JET_GEMM_TUNE=0`): the choice is recorded, kept for later calls (the same bits
/// again), and its values are the CPU's within f32 accuracy. A shape no other test
/// uses; its size class (`gemm.rs` `bucket`) may still have been met first by
/// another test, and then it takes that algorithm with no timing of its own (no
/// record), so at most one record.
#[test]
fn gemm_algorithm_chosen_by_timing_is_kept() {
    let Some(g) = gpu() else { return };
    let (m, k, n) = (200, 336, 264);
    let (a, b) = (rnd(m * k, 41, 1.0), rnd(k * n, 42, 1.0));
    let (da, db) = (up(&g, &a), up(&g, &b));
    let dense = |s: &cudarc::driver::CudaSlice<f32>, rows, cols| gemm::Dense {
        ptr: s.device_ptr(g.stream()).0,
        ty: gemm::LtType::F32,
        rows,
        cols,
        ld: cols,
    };
    let run = || {
        let y = g.zeros::<f32>(m * n).unwrap();
        let yp = y.device_ptr(g.stream()).0;
        gemm::dense_gemm(&g, dense(&da, m, k), false, dense(&db, k, n), false, yp, n).unwrap();
        dl(&g, &y, m * n)
    };
    let first = run();
    let again = run();
    report_exact(
        "GEMM with its chosen algorithm, called twice",
        "200x336x264",
        bits_differ(&first, &again),
    );
    let cpu: Vec<f32> = (0..m * n)
        .map(|i| {
            let (r, c) = (i / n, i % n);
            (0..k)
                .map(|j| a[r * k + j] as f64 * b[j * n + c] as f64)
                .sum::<f64>() as f32
        })
        .collect();
    report(
        "GEMM with its chosen algorithm",
        "200x336x264",
        rel(&first, &cpu),
        1e-5,
    );
    if std::env::var("JET_GEMM_TUNE").as_deref() != Ok("0") {
        // cuBLASLt's column-major call is (n, m, k): at most one record, made at
        // the first call.
        let mine: Vec<_> = gemm::tuned(&g)
            .into_iter()
            .filter(|t| t.what.contains(&format!("mnk: ({n}, {m}, {k})")))
            .collect();
        println!("TUNED {mine:?}");
        assert!(
            mine.len() <= 1,
            "one timing a problem, found {}",
            mine.len()
        );
        if let Some(t) = mine.first() {
            assert!(t.chosen < t.candidates && t.chosen_us <= t.first_us);
        }
    }
    done();
}
