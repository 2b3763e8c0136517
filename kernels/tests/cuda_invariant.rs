//! Batch invariance of the FP8 forward GEMM on the GPU: a row's output has the same
//! bits whichever kernel (split-K decode kernel or `gemm_fp8_rows`), whichever batch
//! and whichever position in the batch computed it. This is what makes rollout
//! (decode, a few rows) and training (thousands of rows) logprobs equal in the
//! `fp8` flow. Shapes cover one K split (gps = all groups), several splits of
//! several groups, a short last split, and N not a multiple of 128.
//! Skips without CUDA; run with `--nocapture` on a GPU machine.

use jet_kernels::cuda::{gemv, linear as glin, quantize as gq};
use jet_kernels::fp8::{fp8_gemm, Fp8Matrix, Fp8Operand, Grouping};
use jet_kernels::{Flow, GemmPrecision};

mod common;
use common::*;

#[test]
fn fp8_forward_rows_do_not_depend_on_the_batch() {
    let Some(g) = gpu() else { return };
    let m = 300;
    // On 132 SMs (H100/H200 SXM): 896x136 one split of 7 groups; 1024x3072 and
    // 1024x4096 two of 4; 3072x1024 six of 4; 4096x256 eight of 4; 2944x1024 five
    // splits of 5 groups, the last of 3 (the fold at the end of a short slice).
    for (k, n) in [
        (896, 136),
        (1024, 3072),
        (3072, 1024),
        (4096, 256),
        (1024, 4096),
        (2944, 1024),
    ] {
        let shape = format!("{m}x{k}x{n}");
        let (x, w) = (rnd(m * k, 11, 2.0), rnd(n * k, 12, 0.05));
        let (dx, dw) = (up(&g, &x), up(&g, &w));
        let (qw, _) = gq::quantize_block128(&g, &dw, n, k, false).unwrap();
        let qx = gq::quantize_row1x128(&g, &dx, m, k).unwrap();
        // the whole batch through both kernels
        let rows_all = g.zeros::<f32>(m * n).unwrap();
        gemv::gemm_fp8_rows(&g, &qx, &qw, &rows_all, n).unwrap();
        let rows_all = dl(&g, &rows_all, m * n);
        let mut sk_all = g.zeros::<f32>(m * n).unwrap();
        gemv::gemv_fp8_into(&g, &qx, &qw, &mut sk_all, n).unwrap();
        let sk_all = dl(&g, &sk_all, m * n);
        report_exact(
            "FP8 rows kernel vs split-K, batch",
            &shape,
            bits_differ(&rows_all, &sk_all),
        );
        let cqx = Fp8Matrix::quantize(&x, m, k, Grouping::Row1x128);
        let cqw = Fp8Matrix::quantize(&w, n, k, Grouping::Block128);
        let want = fp8_gemm(Fp8Operand::plain(&cqx), Fp8Operand::plain(&cqw));
        report(
            "FP8 rows kernel vs CPU fp8_gemm",
            &shape,
            rel(&rows_all, &want),
            1e-5,
        );
        // sub-batches at other positions, quantized on their own as decode does
        let mut diff = 0;
        for (r0, len) in [(0, 1), (7, 1), (299, 1), (3, 5), (100, 64), (40, 130)] {
            let xs = up(&g, &x[r0 * k..(r0 + len) * k]);
            let q = gq::quantize_row1x128(&g, &xs, len, k).unwrap();
            let want = &rows_all[r0 * n..(r0 + len) * n];
            let mut y = g.zeros::<f32>(len * n).unwrap();
            gemv::gemv_fp8_into(&g, &q, &qw, &mut y, n).unwrap();
            diff += bits_differ(&dl(&g, &y, len * n), want);
            for tile in [gemv::RowsTile::T64, gemv::RowsTile::T32] {
                let y = g.zeros::<f32>(len * n).unwrap();
                gemv::gemm_fp8_rows_with(&g, &q, &qw, &y, n, tile).unwrap();
                diff += bits_differ(&dl(&g, &y, len * n), want);
            }
        }
        report_exact("FP8 rows of sub-batches vs batch", &shape, diff);
        // the linear layer (bias, BF16 rounding, the path chosen by batch size)
        let bias = up(&g, &rnd(n, 13, 0.5));
        let mut lw = glin::GpuWeight::prepare(&g, &dw, n, k, Flow::Fp8).unwrap();
        let fwd = |lw: &glin::GpuWeight, xs: &[f32], rows: usize| {
            let y =
                glin::linear_forward(&g, &up(&g, xs), rows, lw, Some(&bias), GemmPrecision::Fp8)
                    .unwrap();
            dl(&g, &y, rows * n)
        };
        let full = fwd(&lw, &x, m);
        let mut diff = 0;
        for r in [0, 1, 64, 255, 299] {
            diff += bits_differ(
                &fwd(&lw, &x[r * k..(r + 1) * k], 1),
                &full[r * n..(r + 1) * n],
            );
        }
        diff += bits_differ(&fwd(&lw, &x[..64 * k], 64), &full[..64 * n]);
        report_exact("FP8 linear, 1 or 64 rows vs 300", &shape, diff);
        // For the record: cuBLASLt's GEMM (batch_invariant off) against decode rows.
        lw.batch_invariant = false;
        let lt = fwd(&lw, &x, m);
        println!(
            "INVARIANT | {shape:<16} | cuBLASLt rows vs decode rows: {} of {} values differ",
            bits_differ(&lt, &full),
            m * n
        );
    }
    done();
}
