//! Batch invariance of the FP8 and BF16 forward GEMMs on the GPU: a row's output
//! has the same bits whichever kernel (split-K decode kernel or `gemm_*_rows`),
//! whichever batch and whichever position in the batch computed it. This is what
//! makes rollout (decode, a few rows) and training (thousands of rows) logprobs
//! equal in the `fp8` and `bf16` flows. Shapes cover one K split (gps = all groups), several
//! splits of several groups, a short last split, and N not a multiple of 128.
//! Skips without CUDA; run with `--nocapture` on a GPU machine.

use jet_kernels::bf16;
use jet_kernels::cuda::gemv_bf16::{self as gb, Bf16Rows};
use jet_kernels::cuda::{self, flash, gemv, linear as glin, ops as gops, quantize as gq};
use jet_kernels::fp8::{fp8_gemm, Fp8Matrix, Fp8Operand, Grouping};
use jet_kernels::ops::attention::AttnShape;
use jet_kernels::{Flow, GemmPrecision};

mod common;
use common::*;

// On 132 SMs (H100/H200 SXM), splits of at least four groups (gemv::splits): 256x136
// one split of 2 groups; 2688x136 five of 5, the last of 1; 1024x3072 and 1024x4096
// two of 4; 3072x1024 six of 4; 4096x256 eight of 4; 2944x1024 five of 5, the last
// of 3 (the fold at the end of a short slice); 1000x100 (BF16 only): K and N not
// multiples of 16 or 128.
const SHAPES: [(usize, usize); 7] = [
    (256, 136),
    (2688, 136),
    (1024, 3072),
    (3072, 1024),
    (4096, 256),
    (1024, 4096),
    (2944, 1024),
];
/// (first row, rows) of the sub-batches checked against the whole batch's rows.
const SUBS: [(usize, usize); 6] = [(0, 1), (7, 1), (299, 1), (3, 5), (100, 64), (40, 130)];

#[test]
fn fp8_forward_rows_do_not_depend_on_the_batch() {
    let Some(g) = gpu() else { return };
    let m = 300;
    for (k, n) in SHAPES {
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
        // mma.sync sums a group's products exactly in f32; wgmma's E4M3 steps keep
        // fewer bits (as cuBLASLt's: LT_FP8_BOUND in cuda_parity.rs).
        report(
            if g.wgmma() {
                "FP8 rows kernel (wgmma) vs CPU fp8_gemm"
            } else {
                "FP8 rows kernel (mma) vs CPU fp8_gemm"
            },
            &shape,
            rel(&rows_all, &want),
            if g.wgmma() { 3e-4 } else { 1e-5 },
        );
        // sub-batches at other positions, quantized on their own as decode does
        let mut diff = 0;
        for (r0, len) in SUBS {
            let xs = up(&g, &x[r0 * k..(r0 + len) * k]);
            let q = gq::quantize_row1x128(&g, &xs, len, k).unwrap();
            let want = &rows_all[r0 * n..(r0 + len) * n];
            let mut y = g.zeros::<f32>(len * n).unwrap();
            gemv::gemv_fp8_into(&g, &q, &qw, &mut y, n).unwrap();
            diff += bits_differ(&dl(&g, &y, len * n), want);
            let y = g.zeros::<f32>(len * n).unwrap();
            gemv::gemm_fp8_rows(&g, &q, &qw, &y, n).unwrap();
            diff += bits_differ(&dl(&g, &y, len * n), want);
        }
        report_exact("FP8 rows of sub-batches vs batch", &shape, diff);
        // the linear layer (bias, BF16 rounding, the path chosen by batch size)
        let bias_h = rnd(n, 13, 0.5);
        let bias = up(&g, &bias_h);
        let mut lw = glin::GpuWeight::prepare(&g, &dw, n, k, Flow::Fp8).unwrap();
        let fwd = |lw: &glin::GpuWeight, xs: &[f32], rows: usize| {
            linear_out(&g, lw, xs, rows, &bias, GemmPrecision::Fp8)
        };
        let full = fwd(&lw, &x, m);
        report_exact(
            "FP8 linear (fused epilogue) vs rows + bias, rounded",
            &shape,
            bits_differ(&full, &epilogue_host(&rows_all, &bias_h)),
        );
        report_exact(
            "FP8 linear, 1 or 64 rows vs 300",
            &shape,
            linear_rows_differ(&g, &lw, &x, &full, &bias),
        );
        report_exact(
            "FP8 linear + residual, 1 or 64 rows vs 300",
            &shape,
            residual_rows_differ(&g, &lw, &x, &rnd(m * n, 14, 1.0)),
        );
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

/// Wide N (an LM head's): on 132 SMs one K split of all 7 or 8 groups, and 133
/// weight tiles, so the persistent rows kernel's blocks take several tiles each;
/// 4096 x 4096 (an 8B projection's): 32 groups in slices of 7, the last of 4.
/// Rows kernel = split-K kernel bit for bit, and a row's bits do not depend on its
/// batch.
#[test]
fn fp8_wide_rows_match_split_k() {
    let Some(g) = gpu() else { return };
    let m = 200;
    for (k, n) in [(896, 17_000), (1024, 17_000), (4096, 4096)] {
        let shape = format!("{m}x{k}x{n}");
        let (x, w) = (rnd(m * k, 21, 2.0), rnd(n * k, 22, 0.05));
        let (qw, _) = gq::quantize_block128(&g, &up(&g, &w), n, k, false).unwrap();
        let qx = gq::quantize_row1x128(&g, &up(&g, &x), m, k).unwrap();
        let rows_all = g.zeros::<f32>(m * n).unwrap();
        gemv::gemm_fp8_rows(&g, &qx, &qw, &rows_all, n).unwrap();
        let rows_all = dl(&g, &rows_all, m * n);
        let mut sk_all = g.zeros::<f32>(m * n).unwrap();
        gemv::gemv_fp8_into(&g, &qx, &qw, &mut sk_all, n).unwrap();
        let diff = bits_differ(&rows_all, &dl(&g, &sk_all, m * n));
        report_exact("FP8 wide rows kernel vs split-K", &shape, diff);
        let mut diff = 0;
        for (r0, len) in [(0, 1), (130, 70)] {
            let q = gq::quantize_row1x128(&g, &up(&g, &x[r0 * k..(r0 + len) * k]), len, k).unwrap();
            let y = g.zeros::<f32>(len * n).unwrap();
            gemv::gemm_fp8_rows(&g, &q, &qw, &y, n).unwrap();
            diff += bits_differ(&dl(&g, &y, len * n), &rows_all[r0 * n..(r0 + len) * n]);
        }
        report_exact("FP8 wide rows of sub-batches vs batch", &shape, diff);
    }
    done();
}

#[test]
fn bf16_forward_rows_do_not_depend_on_the_batch() {
    let Some(g) = gpu() else { return };
    let m = 300;
    for (k, n) in SHAPES.into_iter().chain([(1000, 100)]) {
        let shape = format!("{m}x{k}x{n}");
        let (kp, np) = (cuda::pad16(k), cuda::pad16(n));
        let (x, w) = (rnd(m * k, 21, 2.0), rnd(n * k, 22, 0.05));
        let dw = up(&g, &w);
        let pw = gq::to_bf16_padded(&g, &dw, n, k, np, kp).unwrap();
        let wr = Bf16Rows {
            v: (&pw).into(),
            rows: n,
            cols: k,
            rows_pad: np,
            cols_pad: kp,
        };
        let rows_of = |xs: &[f32], rows: usize| {
            gq::to_bf16_padded(&g, &up(&g, xs), rows, k, rows, kp).unwrap()
        };
        let px = rows_of(&x, m);
        let rows_all = g.zeros::<f32>(m * n).unwrap();
        gb::gemm_bf16_rows(&g, rows_of_bf16(&px, m, k, kp), wr, &rows_all, n).unwrap();
        let rows_all = dl(&g, &rows_all, m * n);
        let mut sk_all = g.zeros::<f32>(m * n).unwrap();
        gb::gemv_bf16_into(&g, rows_of_bf16(&px, m, k, kp), wr, &mut sk_all, n).unwrap();
        report_exact(
            "BF16 rows kernel vs split-K, batch",
            &shape,
            bits_differ(&rows_all, &dl(&g, &sk_all, m * n)),
        );
        let want = jet_kernels::gemm::matmul_nt(&bf16::rounded(&x), &bf16::rounded(&w), m, k, n);
        report(
            "BF16 rows kernel vs CPU f32 sums of BF16 values",
            &shape,
            rel(&rows_all, &want),
            1e-5,
        );
        let mut diff = 0;
        for (r0, len) in SUBS {
            let p = rows_of(&x[r0 * k..(r0 + len) * k], len);
            let want = &rows_all[r0 * n..(r0 + len) * n];
            let mut y = g.zeros::<f32>(len * n).unwrap();
            gb::gemv_bf16_into(&g, rows_of_bf16(&p, len, k, kp), wr, &mut y, n).unwrap();
            diff += bits_differ(&dl(&g, &y, len * n), want);
            let y = g.zeros::<f32>(len * n).unwrap();
            gb::gemm_bf16_rows(&g, rows_of_bf16(&p, len, k, kp), wr, &y, n).unwrap();
            diff += bits_differ(&dl(&g, &y, len * n), want);
        }
        report_exact("BF16 rows of sub-batches vs batch", &shape, diff);
        let bias_h = rnd(n, 23, 0.5);
        let bias = up(&g, &bias_h);
        let mut lw = glin::GpuWeight::prepare(&g, &dw, n, k, Flow::Bf16).unwrap();
        let fwd = |lw: &glin::GpuWeight, xs: &[f32], rows: usize| {
            linear_out(&g, lw, xs, rows, &bias, GemmPrecision::Bf16)
        };
        let full = fwd(&lw, &x, m);
        report_exact(
            "BF16 linear (fused epilogue) vs rows + bias, rounded",
            &shape,
            bits_differ(&full, &epilogue_host(&rows_all, &bias_h)),
        );
        report_exact(
            "BF16 linear, 1 or 64 rows vs 300",
            &shape,
            linear_rows_differ(&g, &lw, &x, &full, &bias),
        );
        report_exact(
            "BF16 linear + residual, 1 or 64 rows vs 300",
            &shape,
            residual_rows_differ(&g, &lw, &x, &rnd(m * n, 24, 1.0)),
        );
        // For the record: cuBLASLt's BF16 GEMM against its own decode-sized rows.
        lw.batch_invariant = false;
        let lt = fwd(&lw, &x, m);
        let mut lt_diff = 0;
        for r0 in (0..m).step_by(64) {
            let len = 64.min(m - r0);
            lt_diff += bits_differ(
                &fwd(&lw, &x[r0 * k..(r0 + len) * k], len),
                &lt[r0 * n..(r0 + len) * n],
            );
        }
        println!(
            "INVARIANT | {shape:<16} | cuBLASLt BF16, 64-row batches vs 300: {lt_diff} of {} values differ",
            m * n
        );
    }
    done();
}

/// The grouped launches of a decode step's q, k, v and gate, up projections
/// (`linear_forward_group`: one split-K GEMM and one epilogue for all) give each
/// output the bits of its own `linear_forward_shared`, for row counts that take the
/// grouped path (1 to 64, and more where split-K pays) and those that do not.
#[test]
fn grouped_projections_equal_their_own_launches() {
    let Some(g) = gpu() else { return };
    // (k, the layers' n): Qwen3-0.6B's q, k, v and gate, up; splits that differ
    // between members (896 x 136 / 256 / 3072).
    let groups: [(usize, &[usize]); 3] = [
        (1024, &[2048, 1024, 1024]),
        (1024, &[3072, 3072]),
        (896, &[136, 256, 3072]),
    ];
    for flow in [Flow::Bf16, Flow::Fp8] {
        let prec = if flow == Flow::Fp8 {
            GemmPrecision::Fp8
        } else {
            GemmPrecision::Bf16
        };
        for (gi, &(k, ns)) in groups.iter().enumerate() {
            let seed = 40 + 10 * gi as u64;
            let ws: Vec<_> = ns
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let w = up(&g, &rnd(n * k, seed + i as u64, 0.05));
                    glin::GpuWeight::prepare(&g, &w, n, k, flow).unwrap()
                })
                .collect();
            // A bias on the first layer only (q's in Qwen2), none on the others.
            let bias = up(&g, &rnd(ns[0], seed + 9, 0.5));
            let layers: Vec<_> = ws
                .iter()
                .enumerate()
                .map(|(i, w)| (w, (i == 0).then_some(&bias)))
                .collect();
            let mut diff = 0;
            for m in [1, 7, 64, 200, 300] {
                let x = up(&g, &rnd(m * k, seed + 5, 2.0));
                let mut xo = glin::XOperand::default();
                let got = glin::linear_forward_group(&g, &x, &mut xo, m, &layers, prec).unwrap();
                for (y, &(w, b)) in got.iter().zip(&layers) {
                    let mut own = glin::XOperand::default();
                    let want =
                        glin::linear_forward_shared(&g, &x, &mut own, m, w, b, prec).unwrap();
                    diff += bits_differ(&dl(&g, y, m * w.n), &dl(&g, &want, m * w.n));
                }
            }
            report_exact(
                "grouped projections vs their own launches",
                &format!("{flow:?} k {k}, n {ns:?}, rows 1..300"),
                diff,
            );
        }
    }
    done();
}

/// A decode step's fused epilogues (`linear::fused`) give the bits of the
/// separate launches: the o projection plus residual then the post-attention
/// norm and its operand (`linear_residual_norm` against `linear_forward_residual`
/// then `rmsnorm_with_operand`), gate, up then SwiGLU and its operand
/// (`gate_up_swiglu` against `linear_forward_group` then `swiglu_with_operand`),
/// and q, k, v with Qwen3's q/k norms and RoPE (`qkv_partials` then its `norm_rope` against
/// `linear_forward_group` then `ops::qk_norm_rope`). The operands are compared
/// through the GEMM that reads them. Widths (hidden, q, inter): Qwen3-0.6B's;
/// hidden 5120 (a norm row of 40 groups: two a warp); inter 3070 (not a multiple
/// of 4: the epilogue's scalar loads). Rows 1 to 300, the fused paths taken at
/// least up to 64; FP8's gate/up + SwiGLU once through the split-K kernel and
/// `swiglu_sk_operand`, once through `wg_fp8_gate_up_swiglu` (one launch).
#[test]
fn fused_epilogues_equal_the_separate_launches() {
    let Some(g) = gpu() else { return };
    // FP8's gate/up + SwiGLU both ways: the split-K kernel and swiglu_sk_operand
    // (what these widths get by default), and the one-launch kernel, forced.
    for (flow, gu_fused) in [
        (Flow::Bf16, None),
        (Flow::Fp8, Some(false)),
        (Flow::Fp8, Some(true)),
    ] {
        glin::set_gate_up_fused(gu_fused);
        for (i, widths) in [(1024, 2048, 3072), (5120, 2048, 3072), (1024, 2048, 3070)]
            .into_iter()
            .enumerate()
        {
            let (diff, fused) = fused_vs_separate(&g, flow, widths, 60 + 20 * i as u64);
            println!("  {flow:?} (gate/up in one launch: {gu_fused:?}) {widths:?}: fused for rows {fused:?}");
            for kind in ["o+norm", "gate/up+swiglu", "qkv+norm+rope"] {
                assert!(
                    !g.wgmma() || [1, 7, 64].iter().all(|&m| fused.contains(&(kind, m))),
                    "{kind} was not fused for a decode batch: {fused:?}"
                );
            }
            report_exact(
                "fused decode epilogues vs separate launches",
                &format!("{flow:?} {gu_fused:?} (hidden, q, inter) {widths:?}, rows 1..300"),
                diff,
            );
        }
    }
    glin::set_gate_up_fused(None);
    done();
}

/// The decode attention that runs the q, k, v projections' epilogue itself
/// (`flash_qkv_append_decode_operand_dev`: `fa_dec2_qkv`, each block its own q
/// heads and new k, v row) gives the bits of that epilogue's own launch
/// (`QkvPartials::norm_rope`) then the attention of its outputs
/// (`flash_append_decode_operand_dev`): the output, its operand and both caches.
/// Both flows, both operands; heads of 128 in groups of 2 (Qwen3-0.6B), 4
/// (Qwen3-8B) and 16, and of 64 (the BF16 operand only: FP8's needs whole 1x128
/// groups a head); rows 1, 7 and 64, each at its own cache length.
#[test]
fn decode_attention_with_the_qkv_epilogue_equals_the_separate_launches() {
    let Some(g) = gpu() else { return };
    if !g.wgmma() {
        println!("skipping: the grouped split-K projections need wgmma (sm_90)");
        return;
    }
    let h = 1024;
    for flow in [Flow::Bf16, Flow::Fp8] {
        let prec = match flow {
            Flow::Fp8 => GemmPrecision::Fp8,
            _ => GemmPrecision::Bf16,
        };
        for (si, (nh, nkv, hd)) in [(16, 8, 128), (32, 8, 128), (16, 1, 128), (8, 2, 64)]
            .into_iter()
            .enumerate()
        {
            let seed = 700 + 20 * si as u64;
            let weight = |n: usize, s: u64| {
                let w = up(&g, &rnd(n * h, seed + s, 0.05));
                glin::GpuWeight::prepare(&g, &w, n, h, flow).unwrap()
            };
            let (wq, wk, wv) = (weight(nh * hd, 1), weight(nkv * hd, 2), weight(nkv * hd, 3));
            let (qn, kn) = (
                up(&g, &rnd(hd, seed + 4, 1.0)),
                up(&g, &rnd(hd, seed + 5, 1.0)),
            );
            let table = jet_kernels::ops::rope::RopeTable::new(hd, 4096, 1_000_000.0, None);
            let rope = gops::GpuRope::new(&g, &table).unwrap();
            let sh = AttnShape {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
            };
            let (kvw, cap) = (nkv * hd, 160);
            let (mut diff, mut ran) = (0, vec![]);
            for m in [1, 7, 64] {
                let x = up(&g, &rnd(m * h, seed + 6 + m as u64, 2.0));
                let positions: Vec<usize> = (0..m).map(|r| (r * 37 + 5) % 4096).collect();
                let pos = gops::upload_positions(&g, &positions, &rope).unwrap();
                let mut xo = glin::XOperand::default();
                let ws = (&wq, &wk, &wv);
                let Some(p) = glin::qkv_partials(
                    &g,
                    &x,
                    &mut xo,
                    m,
                    ws,
                    (&qn, &kn, 1e-6),
                    (&pos, &rope),
                    prec,
                )
                .unwrap() else {
                    continue;
                };
                // Row r: cache slot r, length (29 r) % 150 + 1 after the step.
                let kv0: Vec<i32> = (0..m).map(|r| (r * cap) as i32).collect();
                let len: Vec<i32> = (0..m).map(|r| ((29 * r) % 150 + 1) as i32).collect();
                let (kv0, len) = (g.upload(&kv0).unwrap(), g.upload(&len).unwrap());
                let cache = |s: u64| -> Vec<u16> {
                    let v = rnd(m * cap * kvw, s, 2.0);
                    v.iter()
                        .map(|&x| (bf16::round(x).to_bits() >> 16) as u16)
                        .collect()
                };
                let (k0, v0) = (cache(seed + 90), cache(seed + 91));
                for fp8 in [false, true] {
                    if !flash::decode_operand_fits(sh, fp8) {
                        continue;
                    }
                    let (mut ka, mut va) = (g.upload(&k0).unwrap(), g.upload(&v0).unwrap());
                    let (mut kb, mut vb) = (g.upload(&k0).unwrap(), g.upload(&v0).unwrap());
                    let [q, k, v] = p.norm_rope(&g).unwrap();
                    let lens = (&kv0, &len);
                    let (oa, opa) = flash::flash_append_decode_operand_dev(
                        &g,
                        &q,
                        (&k, &v),
                        (&mut ka, &mut va),
                        lens,
                        m,
                        sh,
                        fp8,
                    )
                    .unwrap();
                    let (ob, opb) = flash::flash_qkv_append_decode_operand_dev(
                        &g,
                        &p,
                        (&mut kb, &mut vb),
                        lens,
                        m,
                        sh,
                        fp8,
                    )
                    .unwrap();
                    diff += bits_differ(&dl(&g, &oa, m * nh * hd), &dl(&g, &ob, m * nh * hd));
                    let u16s = |a: &cudarc::driver::CudaSlice<u16>,
                                b: &cudarc::driver::CudaSlice<u16>| {
                        let (a, b) = (g.download(a).unwrap(), g.download(b).unwrap());
                        a.iter().zip(&b).filter(|(x, y)| x != y).count()
                    };
                    diff += u16s(&ka, &kb) + u16s(&va, &vb);
                    diff += match (opa, opb) {
                        (gq::FusedOperand::Fp8(a), gq::FusedOperand::Fp8(b)) => {
                            let (ca, cb) =
                                (g.download(&a.codes).unwrap(), g.download(&b.codes).unwrap());
                            let n = a.scales.len();
                            ca.iter().zip(&cb).filter(|(x, y)| x != y).count()
                                + bits_differ(&dl(&g, &a.scales, n), &dl(&g, &b.scales, n))
                        }
                        (gq::FusedOperand::Bf16(a), gq::FusedOperand::Bf16(b)) => u16s(&a, &b),
                        _ => panic!("the two launches made operands of different kinds"),
                    };
                    ran.push((m, fp8));
                }
            }
            assert!(
                !ran.is_empty(),
                "{flow:?} {nh}/{nkv} x {hd}: no grouped split-K partials"
            );
            report_exact(
                "decode attention with the q, k, v epilogue vs separate launches",
                &format!("{flow:?} {nh}q/{nkv}kv x {hd}, (rows, fp8 operand) {ran:?}"),
                diff,
            );
        }
    }
    done();
}

/// Differing values between the fused and separate paths, and the (kind, rows)
/// that took the fused one.
fn fused_vs_separate(
    g: &cuda::Gpu,
    flow: Flow,
    (h, q, inter): (usize, usize, usize),
    seed: u64,
) -> (usize, Vec<(&'static str, usize)>) {
    let prec = if flow == Flow::Fp8 {
        GemmPrecision::Fp8
    } else {
        GemmPrecision::Bf16
    };
    let weight = |n: usize, k: usize, s: u64| {
        let w = up(g, &rnd(n * k, seed + s, 0.05));
        glin::GpuWeight::prepare(g, &w, n, k, flow).unwrap()
    };
    let (wo, wg, wu, wd) = (
        weight(h, q, 1),
        weight(inter, h, 2),
        weight(inter, h, 3),
        weight(h, inter, 4),
    );
    let norm_w = up(g, &rnd(h, seed + 5, 1.0));
    // q, k, v (q / 128 and 8 heads of 128) with Qwen3's q/k norms and RoPE.
    let hd = 128;
    let (wq, wk, wv) = (weight(q, h, 6), weight(8 * hd, h, 7), weight(8 * hd, h, 8));
    let (qn, kn) = (
        up(g, &rnd(hd, seed + 9, 1.0)),
        up(g, &rnd(hd, seed + 10, 1.0)),
    );
    let table = jet_kernels::ops::rope::RopeTable::new(hd, 4096, 1_000_000.0, None);
    let rope = gops::GpuRope::new(g, &table).unwrap();
    let same = |a: &_, b: &_, n| bits_differ(&dl(g, a, n), &dl(g, b, n));
    let (mut diff, mut fused) = (0, vec![]);
    for m in [1, 7, 64, 200, 300] {
        // o + residual + norm, its operand through the gate projection.
        let (o, res) = (
            up(g, &rnd(m * q, seed + 11, 2.0)),
            up(g, &rnd(m * h, seed + 12, 2.0)),
        );
        let mut oo = glin::XOperand::default();
        let norm = (&norm_w, 1e-6);
        let got = glin::linear_residual_norm(g, &o, &mut oo, m, &wo, prec, &res, norm).unwrap();
        if let Some((y, normed, rstd, mut op)) = got {
            let mut oo = glin::XOperand::default();
            let y0 = glin::linear_forward_residual(g, &o, &mut oo, m, &wo, prec, &res).unwrap();
            let (n0, r0, mut op0) =
                glin::rmsnorm_with_operand(g, &y0, &norm_w, (m, h), 1e-6, prec).unwrap();
            diff += same(&y, &y0, m * h) + same(&normed, &n0, m * h) + same(&rstd, &r0, m);
            let a = glin::linear_forward_shared(g, &normed, &mut op, m, &wg, None, prec).unwrap();
            let b = glin::linear_forward_shared(g, &n0, &mut op0, m, &wg, None, prec).unwrap();
            diff += same(&a, &b, m * inter);
            fused.push(("o+norm", m));
        }
        // gate, up and SwiGLU, its operand through the down projection.
        let x = up(g, &rnd(m * h, seed + 13, 2.0));
        let mut xo = glin::XOperand::default();
        let got = glin::gate_up_swiglu(g, &x, &mut xo, m, (&wg, &wu), prec).unwrap();
        if let Some((hh, mut hop)) = got {
            let mut xo = glin::XOperand::default();
            let layers = [(&wg, None), (&wu, None)];
            let gu = glin::linear_forward_group(g, &x, &mut xo, m, &layers, prec).unwrap();
            let (h0, mut hop0) =
                glin::swiglu_with_operand(g, &gu[0], &gu[1], (m, inter), prec).unwrap();
            diff += same(&hh, &h0, m * inter);
            let a = glin::linear_forward_shared(g, &hh, &mut hop, m, &wd, None, prec).unwrap();
            let b = glin::linear_forward_shared(g, &h0, &mut hop0, m, &wd, None, prec).unwrap();
            diff += same(&a, &b, m * h);
            fused.push(("gate/up+swiglu", m));
        }
        // q, k, v with the norms and RoPE at scattered positions.
        let positions: Vec<usize> = (0..m).map(|r| (r * 37 + 5) % 4096).collect();
        let pos = gops::upload_positions(g, &positions, &rope).unwrap();
        let mut xo = glin::XOperand::default();
        let ws = (&wq, &wk, &wv);
        let norms = (&qn, &kn, 1e-6);
        let got = glin::qkv_partials(g, &x, &mut xo, m, ws, norms, (&pos, &rope), prec).unwrap();
        let got = got.map(|p| p.norm_rope(g).unwrap());
        if let Some([fq, fk, fv]) = got {
            let mut xo = glin::XOperand::default();
            let layers = [(&wq, None), (&wk, None), (&wv, None)];
            let qkv = glin::linear_forward_group(g, &x, &mut xo, m, &layers, prec).unwrap();
            let heads = (m, q / hd, 8);
            let (q0, k0, _, _) =
                gops::qk_norm_rope(g, (&qkv[0], &qkv[1]), (&qn, &kn), heads, 1e-6, &pos, &rope)
                    .unwrap();
            diff += same(&fq, &q0, m * q) + same(&fk, &k0, m * 8 * hd);
            diff += same(&fv, &qkv[2], m * 8 * hd);
            fused.push(("qkv+norm+rope", m));
        }
    }
    (diff, fused)
}

/// `rows x k` BF16 values stored `[rows][k_pad]`.
fn rows_of_bf16(
    v: &cudarc::driver::CudaSlice<u16>,
    rows: usize,
    k: usize,
    k_pad: usize,
) -> Bf16Rows<'_> {
    Bf16Rows {
        v: v.into(),
        rows,
        cols: k,
        rows_pad: rows,
        cols_pad: k_pad,
    }
}

/// `linear_epilogue` on the host: each value of `d [m, n]` plus its column's
/// bias, rounded to BF16 (the GEMM kernels fuse exactly this).
fn epilogue_host(d: &[f32], bias: &[f32]) -> Vec<f32> {
    let n = bias.len();
    d.iter()
        .enumerate()
        .map(|(i, &v)| jet_kernels::bf16::round(v + bias[i % n]))
        .collect()
}

/// The linear layer's output for `rows` rows of `xs` (bias, BF16 rounding, the
/// path chosen by the batch size).
fn linear_out(
    g: &jet_kernels::cuda::Gpu,
    lw: &glin::GpuWeight,
    xs: &[f32],
    rows: usize,
    bias: &cudarc::driver::CudaSlice<f32>,
    prec: GemmPrecision,
) -> Vec<f32> {
    let y = glin::linear_forward(g, &up(g, xs), rows, lw, Some(bias), prec).unwrap();
    dl(g, &y, rows * lw.n)
}

/// The precision a prepared weight runs in.
fn prec_of(lw: &glin::GpuWeight) -> GemmPrecision {
    if lw.fp8().is_some() {
        GemmPrecision::Fp8
    } else {
        GemmPrecision::Bf16
    }
}

/// Values whose bits differ between rows 0, 1, 64, 255 and 299 (and the first 64
/// rows) computed on their own by `out(first row, rows)` and the same rows of the
/// whole batch's output `full [_, n]`.
fn rows_vs_batch(n: usize, full: &[f32], out: impl Fn(usize, usize) -> Vec<f32>) -> usize {
    let mut diff = 0;
    for r in [0, 1, 64, 255, 299] {
        diff += bits_differ(&out(r, 1), &full[r * n..(r + 1) * n]);
    }
    diff + bits_differ(&out(0, 64), &full[..64 * n])
}

/// [`rows_vs_batch`] for the linear layer with a bias.
fn linear_rows_differ(
    g: &jet_kernels::cuda::Gpu,
    lw: &glin::GpuWeight,
    x: &[f32],
    full: &[f32],
    bias: &cudarc::driver::CudaSlice<f32>,
) -> usize {
    let (k, prec) = (lw.k, prec_of(lw));
    rows_vs_batch(lw.n, full, |r0, rows| {
        linear_out(g, lw, &x[r0 * k..(r0 + rows) * k], rows, bias, prec)
    })
}

/// [`rows_vs_batch`] for the layer with a residual `res [m, n]` (the o and down
/// projections'; added after the rounding, in the GEMM's epilogue), the whole batch
/// computed here.
fn residual_rows_differ(
    g: &jet_kernels::cuda::Gpu,
    lw: &glin::GpuWeight,
    x: &[f32],
    res: &[f32],
) -> usize {
    let (k, n, prec) = (lw.k, lw.n, prec_of(lw));
    let out = |r0: usize, rows: usize| {
        let xs = up(g, &x[r0 * k..(r0 + rows) * k]);
        let rs = up(g, &res[r0 * n..(r0 + rows) * n]);
        let mut xo = glin::XOperand::default();
        let y = glin::linear_forward_residual(g, &xs, &mut xo, rows, lw, prec, &rs).unwrap();
        dl(g, &y, rows * n)
    };
    rows_vs_batch(n, &out(0, res.len() / n), out)
}
