//! One FP8 WGrad for the projections that read one input (q, k, v; gate, up): the
//! dual quantizers writing each dy's 128x1 operand as a column slice of one stacked
//! operand, the stacked GEMM, and the gradients holding row blocks of its output.
//! Without CUDA every test prints "skipping: no CUDA device: ..." and passes. Run on
//! a GPU machine with `--test-threads=1 --nocapture`.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::{adamw as gadam, gemm, grad, linear as glin, ops as gops, quantize as gq};
use jet_kernels::fp8::{Fp8Matrix, Grouping};

mod common;
use common::*;

/// Codes and scale bits of two host matrices that differ.
fn differ(a: &Fp8Matrix, b: &Fp8Matrix) -> usize {
    assert_eq!(
        (a.rows, a.cols, a.scales.len()),
        (b.rows, b.cols, b.scales.len())
    );
    a.codes.iter().zip(&b.codes).filter(|(x, y)| x != y).count() + bits_differ(&a.scales, &b.scales)
}

/// `[rows, sum of cols]`: the matrices side by side, in order.
fn concat(parts: &[(&[f32], usize)], rows: usize) -> Vec<f32> {
    let mut out = Vec::new();
    for r in 0..rows {
        for &(x, c) in parts {
            out.extend_from_slice(&x[r * c..(r + 1) * c]);
        }
    }
    out
}

/// Values whose magnitude changes by column block and row, so that neighbouring
/// 128x1 groups take different scales.
fn ramp(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let v = rnd(rows * cols, seed, 1.0);
    (0..rows * cols)
        .map(|i| v[i] * 2f32.powi(((i % cols) / 48) as i32 % 7 - 3 + (i / cols % 5) as i32))
        .collect()
}

/// BF16 operands as the BF16 gradients' producers store them (rounded values).
fn bf16_bits(x: &[f32]) -> Vec<u16> {
    x.iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect()
}

#[test]
fn stacked_dual_quantizers_write_each_operand() {
    let Some(g) = gpu() else { return };
    // q, k, v widths with a partial last row tile (rows not a multiple of 128), and
    // a two-matrix case of widths not multiples of 128.
    for (rows, widths) in [(300usize, vec![256usize, 128, 128]), (130, vec![144, 208])] {
        let host: Vec<Vec<f32>> = widths
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                ramp(rows, c, 7 + i as u64)
                    .into_iter()
                    .map(jet_kernels::bf16::round)
                    .collect()
            })
            .collect();
        // The first matrix as BF16 values (a producer's rounded output), the rest f32.
        let b16 = g.upload(&bf16_bits(&host[0])).unwrap();
        let devs: Vec<CudaSlice<f32>> = host.iter().map(|x| up(&g, x)).collect();
        let xs: Vec<(gq::DualIn, usize)> = widths
            .iter()
            .enumerate()
            .map(|(i, &c)| match i {
                0 => ((&b16).into(), c),
                _ => ((&devs[i]).into(), c),
            })
            .collect();
        let total: usize = widths.iter().sum();
        let parts: Vec<(&[f32], usize)> = host
            .iter()
            .zip(&widths)
            .map(|(x, &c)| (x.as_slice(), c))
            .collect();
        let cat = concat(&parts, rows);
        let want_col = Fp8Matrix::quantize(&cat, rows, total, Grouping::Col128x1);
        // The 1x128 operands one a matrix, and (widths of whole groups) stacked too.
        let whole = widths.iter().all(|c| c % 128 == 0);
        for stack_rows in [false, true] {
            let got = gq::quantize_dual_stacked(&g, &xs, rows, stack_rows);
            if stack_rows && !whole {
                let e = got.err().map(|e| e.to_string()).unwrap_or_default();
                assert!(e.contains("whole groups"), "{e}");
                continue;
            }
            let (rows_q, col) = got.unwrap();
            let mut n = differ(&col.to_host(&g).unwrap(), &want_col);
            match rows_q {
                gq::DualRows::Each(v) => {
                    for (q, (x, &c)) in v.iter().zip(host.iter().zip(&widths)) {
                        let want = Fp8Matrix::quantize(x, rows, c, Grouping::Row1x128);
                        n += differ(&q.to_host(&g).unwrap(), &want);
                    }
                }
                gq::DualRows::Stacked(q) => {
                    let want = Fp8Matrix::quantize(&cat, rows, total, Grouping::Row1x128);
                    n += differ(&q.to_host(&g).unwrap(), &want);
                }
            }
            report_exact(
                "stacked dual quantize == CPU's",
                &format!("[{rows}, {widths:?}] rows stacked {stack_rows}"),
                n,
            );
        }
    }
    done();
}

#[test]
fn stacked_swiglu_backward_writes_each_operand() {
    let Some(g) = gpu() else { return };
    for (rows, cols) in [(130usize, 4864usize), (257, 208)] {
        let n = rows * cols;
        let (gate, upv, dh) = (rnd(n, 40, 8.0), rnd(n, 41, 2.0), rnd(n, 42, 1.0));
        let (dg, du, ddh) = (up(&g, &gate), up(&g, &upv), up(&g, &dh));
        let f = || gops::SwigluDh::F32(&ddh);
        let (qg, qu) = gq::swiglu_backward_fp8(&g, f(), &dg, &du, (rows, cols)).unwrap();
        let stack_rows = cols % 128 == 0;
        let (rq, col) =
            gq::swiglu_backward_fp8_stacked(&g, f(), &dg, &du, (rows, cols), stack_rows).unwrap();
        // The 1x128 operands are the unstacked ones (side by side where stacked); the
        // stacked 128x1 one is the unstacked pair side by side.
        let host = |q: &gq::Fp8Quantized| q.to_host(&g).unwrap();
        let mut d = match rq {
            gq::DualRows::Each(v) => {
                differ(&host(&v[0]), &host(&qg.row)) + differ(&host(&v[1]), &host(&qu.row))
            }
            gq::DualRows::Stacked(q) => {
                let (st, a, b) = (host(&q), host(&qg.row), host(&qu.row));
                // Fp8Matrix's Row1x128 layout: codes [rows][cols], scales [rows][groups].
                let (gc, cb) = (cols / 128, 2 * cols / 128);
                let mut n = 0;
                for r in 0..rows {
                    let row = &st.codes[r * 2 * cols..][..2 * cols];
                    let (ra, rb) = (&a.codes[r * cols..][..cols], &b.codes[r * cols..][..cols]);
                    n += row[..cols].iter().zip(ra).filter(|(x, y)| x != y).count();
                    n += row[cols..].iter().zip(rb).filter(|(x, y)| x != y).count();
                    let sc = &st.scales[r * cb..][..cb];
                    n += bits_differ(&sc[..gc], &a.scales[r * gc..][..gc]);
                    n += bits_differ(&sc[gc..], &b.scales[r * gc..][..gc]);
                }
                n
            }
        };
        let (hg, hu) = (host(&qg.col), host(&qu.col));
        let st = host(&col);
        assert_eq!((st.rows, st.cols), (rows, 2 * cols));
        // Fp8Matrix's Col128x1 layout: codes [rows][cols], scales [ceil(rows/128)][cols].
        for r in 0..rows {
            for (half, src) in [(0, &hg), (1, &hu)] {
                let (a, b) = (
                    &st.codes[r * 2 * cols + half * cols..][..cols],
                    &src.codes[r * cols..][..cols],
                );
                d += a.iter().zip(b).filter(|(x, y)| x != y).count();
            }
        }
        for rg in 0..rows.div_ceil(128) {
            for (half, src) in [(0, &hg), (1, &hu)] {
                let a = &st.scales[rg * 2 * cols + half * cols..][..cols];
                d += bits_differ(a, &src.scales[rg * cols..][..cols]);
            }
        }
        report_exact(
            "stacked swiglu bwd FP8 == unstacked",
            &format!("[{rows}, {cols}]"),
            d,
        );
    }
    done();
}

/// The stacked WGrad's row blocks against one FP8 WGrad a projection (cuBLASLt's
/// BF16 outputs; its algorithm may differ with N, so within BF16 rounding), and
/// the gradients that hold the blocks read them at their offsets (`grad_settle`
/// and `grad_settle_multi`).
#[test]
fn stacked_wgrad_equals_one_gemm_each() {
    let Some(g) = gpu() else { return };
    let (m, k) = (520usize, 256usize);
    let widths = [256usize, 128, 128];
    let x = up(&g, &rnd(m * k, 3, 2.0));
    let dys: Vec<Vec<f32>> = widths
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            ramp(m, n, 20 + i as u64)
                .into_iter()
                .map(jet_kernels::bf16::round)
                .collect()
        })
        .collect();
    let ddys: Vec<CudaSlice<f32>> = dys.iter().map(|d| up(&g, d)).collect();
    let xs: Vec<(gq::DualIn, usize)> = ddys
        .iter()
        .zip(widths)
        .map(|(d, n)| (d.into(), n))
        .collect();
    let (_, col) = gq::quantize_dual_stacked(&g, &xs, m, false).unwrap();
    let mut xin = glin::XOperand::default();
    let dw = glin::wgrad_fp8_stacked(&g, &col, ((&x).into(), m, k), &mut xin).unwrap();
    let total: usize = widths.iter().sum();
    assert_eq!(dw.len(), total * k);
    let qx = gq::quantize_col128x1(&g, &x, m, k).unwrap();
    let widen = |v: &[u16]| -> Vec<f32> {
        v.iter()
            .map(|&b| half::bf16::from_bits(b).to_f32())
            .collect()
    };
    let got = widen(&g.download(&*dw).unwrap());
    let mut off = 0;
    let mut accs = Vec::new();
    for (d, &n) in ddys.iter().zip(&widths) {
        let (_, c) = gq::quantize_dual(&g, d, m, n).unwrap();
        let (one, ld) = gemm::fp8_gemm_nt_bf16(&g, &c, &qx).unwrap();
        assert_eq!(ld, k);
        let want = widen(&g.download(&one).unwrap());
        let part = &got[off..off + n * k];
        let same = part
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        println!(
            "stacked WGrad block of {n} rows: {same} of {} values bit-identical",
            n * k
        );
        report(
            "stacked WGrad block == its own GEMM",
            &format!("[{n}, {k}]"),
            rel(part, &want),
            4e-3,
        );
        // The gradient holding this block reads its values (plus an earlier addend).
        let mut acc = grad::GradAcc::new(&g, n * k).unwrap();
        let first = bf16_bits(&rnd(n * k, 90 + n as u64, 1.0));
        acc.add_bf16(&g, g.upload(&first).unwrap()).unwrap();
        acc.add_bf16_part(&g, &dw, off).unwrap();
        accs.push((acc, widen(&first), part.to_vec()));
        off += n * k;
    }
    // Two settled one by one (grad_settle via f32_mut), the last with the others'
    // table launch (grad_settle_multi after its own first addend settled).
    let mut d = 0;
    let last = accs.len() - 1;
    let mut multi: Vec<grad::GradAcc> = Vec::new();
    let mut expect = Vec::new();
    for (i, (mut acc, first, part)) in accs.into_iter().enumerate() {
        let want: Vec<f32> = first.iter().zip(&part).map(|(a, b)| a + b).collect();
        if i == last {
            multi.push(acc);
            expect.push(want);
            continue;
        }
        let n = acc.len();
        let v = dl(&g, acc.f32_mut(&g).unwrap(), n);
        d += bits_differ(&v, &want);
    }
    grad::settle_multi(&g, &mut multi, grad::Settle::All).unwrap();
    for (acc, want) in multi.iter_mut().zip(&expect) {
        let n = acc.len();
        d += bits_differ(&dl(&g, acc.f32_mut(&g).unwrap(), n), want);
    }
    drop(dw);
    report_exact(
        "gradients holding stacked WGrad blocks",
        &format!("{widths:?} x {k}"),
        d,
    );
    done();
}

/// A stacked destination that does not fit is an error naming it, not a write out
/// of bounds.
#[test]
fn stacked_operands_reject_bad_slices() {
    let Some(g) = gpu() else { return };
    let (m, k) = (64usize, 40usize);
    let x = up(&g, &rnd(m * k, 5, 1.0));
    // 40 columns: not a multiple of 16.
    let e = gq::quantize_dual_stacked(&g, &[((&x).into(), k)], m, false).err();
    assert!(e.is_some_and(|e| e.to_string().contains("16-aligned")));
    let mut acc = grad::GradAcc::new(&g, 100).unwrap();
    let buf = Arc::new(g.upload(&vec![0u16; 150]).unwrap());
    let e = acc.add_bf16_part(&g, &buf, 60).err();
    assert!(e.is_some_and(|e| e.to_string().contains("[60, 160)")));
}

/// The stacked `W^T` of q/k/v-like weights: `quant_block128_multi` writing each
/// weight's `W^T` blocks into its columns of the stacked one gives its own blocks,
/// byte for byte, the scales' padding columns left zero; the one DGrad GEMM over the
/// stacked operands gives the sum of one DGrad a projection (to BF16 rounding); and
/// AdamW rewriting the blocks there writes what it writes into a weight's own.
#[test]
fn stacked_wt_blocks_and_dgrad() {
    let Some(g) = gpu() else { return };
    let (m, k) = (300usize, 384usize);
    let ns = [256usize, 128, 128];
    let total: usize = ns.iter().sum();
    let ws: Vec<Vec<f32>> = ns
        .iter()
        .enumerate()
        .map(|(i, &n)| ramp(n, k, 50 + i as u64))
        .collect();
    let dws: Vec<CudaSlice<f32>> = ws.iter().map(|w| up(&g, w)).collect();
    let refs: Vec<(&CudaSlice<f32>, usize, usize)> =
        dws.iter().zip(&ns).map(|(w, &n)| (w, n, k)).collect();
    let st = gq::stacked_block128_t(&g, k, total).unwrap();
    let mut n0 = 0;
    let ts: Vec<gq::TOut> = ns
        .iter()
        .map(|&n| {
            let d = gq::TDest::part(&g, &st, n0, n, k).unwrap();
            n0 += n;
            gq::TOut::Part(d)
        })
        .collect();
    // Each weight's own W^T against its columns of the stacked one; the stacked
    // scales' padding columns stay 0.
    let parts_differ = |own: &[(gq::Fp8Quantized, Option<gq::Fp8Quantized>)]| -> usize {
        let (sc, ss) = (
            g.download(&st.codes).unwrap(),
            dl(&g, &st.scales, st.scales.len()),
        );
        let (mut d, mut c0) = (0, 0);
        for (n, (_, t)) in ns.iter().zip(own) {
            let t = t.as_ref().unwrap();
            let (tc, tsc) = (
                g.download(&t.codes).unwrap(),
                dl(&g, &t.scales, t.scales.len()),
            );
            for r in 0..t.rows_pad {
                let x = &sc[r * st.cols_pad + c0..][..*n];
                d += x
                    .iter()
                    .zip(&tc[r * t.cols_pad..][..*n])
                    .filter(|(p, q)| p != q)
                    .count();
            }
            for kb in 0..k.div_ceil(128) {
                let x = &ss[kb * st.lds + c0 / 128..][..n / 128];
                d += bits_differ(x, &tsc[kb * t.lds..][..n / 128]);
            }
            c0 += n;
        }
        for kb in 0..k.div_ceil(128) {
            d += ss[kb * st.lds + total / 128..(kb + 1) * st.lds]
                .iter()
                .filter(|v| v.to_bits() != 0)
                .count();
        }
        d
    };
    let own = gq::quantize_block128_multi(&g, &refs, true).unwrap();
    let fwd = gq::quantize_block128_multi_to(&g, &refs, &ts).unwrap();
    let mut d = parts_differ(&own);
    // The forward blocks are the same too, and the stacked members have no own W^T.
    for ((a, at), (b, _)) in fwd.iter().zip(&own) {
        assert!(at.is_none());
        d += differ(&a.to_host(&g).unwrap(), &b.to_host(&g).unwrap());
    }
    report_exact(
        "stacked W^T blocks == each weight's own",
        &format!("{ns:?} x {k}"),
        d,
    );

    // One DGrad over the stacked operands against one a projection, summed.
    let dys: Vec<CudaSlice<f32>> = ns
        .iter()
        .enumerate()
        .map(|(i, &n)| up(&g, &ramp(m, n, 60 + i as u64)))
        .collect();
    let xs: Vec<(gq::DualIn, usize)> = dys.iter().zip(ns).map(|(d, n)| (d.into(), n)).collect();
    let (rows, _) = gq::quantize_dual_stacked(&g, &xs, m, true).unwrap();
    let gq::DualRows::Stacked(dy) = rows else {
        panic!("stacked rows asked for")
    };
    let one = glin::linear_dgrad_fp8_stacked(&g, &dy, &st, m).unwrap();
    let widen = |v: &[u16]| -> Vec<f32> {
        v.iter()
            .map(|&b| half::bf16::from_bits(b).to_f32())
            .collect()
    };
    let got = match &one {
        glin::GemmOut::Bf16(d, ld) => {
            assert_eq!(*ld, k);
            widen(&g.download(d).unwrap())[..m * k].to_vec()
        }
        _ => panic!("FP8 DGrad writes BF16"),
    };
    let mut want = vec![0f32; m * k];
    for (dy, (_, t)) in dys.iter().zip(&own) {
        let t = t.as_ref().unwrap();
        let (r, _) = gq::quantize_dual(&g, dy, m, t.cols).unwrap();
        let (o, ld) = gemm::fp8_gemm_nt_bf16(&g, &r, t).unwrap();
        assert_eq!(ld, k);
        for (w, v) in want.iter_mut().zip(widen(&g.download(&o).unwrap())) {
            *w += v;
        }
    }
    report(
        "stacked DGrad == sum of one each",
        &format!("[{m}, {k}]"),
        rel(&got, &want),
        1e-2,
    );

    // AdamW rewriting the members' W^T in the stacked buffer == in their own.
    let s = adam_step();
    let (mut a, mut b) = (adam_state(&g, &ws, &ns, k), adam_state(&g, &ws, &ns, k));
    let mut own = gq::quantize_block128_multi(&g, &refs, true).unwrap();
    let mut fwd = gq::quantize_block128_multi_to(&g, &refs, &ts).unwrap();
    {
        let mut tsa: Vec<gadam::AdamTensor> = a
            .iter_mut()
            .zip(own.iter_mut())
            .map(|([p, gr, mm, v], (w, wt))| gadam::AdamTensor {
                p,
                g: grad::GradSrc::f32(gr),
                m: mm,
                v,
                decay: true,
                p_bf16: None,
                blocks: Some(gadam::BlockTargets {
                    w,
                    t: wt.as_mut().map(gadam::TTarget::Own),
                }),
            })
            .collect();
        gadam::adamw_multi(&g, &mut tsa, &s).unwrap();
    }
    {
        let mut tsb: Vec<gadam::AdamTensor> = b
            .iter_mut()
            .zip(fwd.iter_mut().zip(&ts))
            .map(|([p, gr, mm, v], ((w, _), t))| {
                let gq::TOut::Part(d) = t else {
                    unreachable!("parts above")
                };
                gadam::AdamTensor {
                    p,
                    g: grad::GradSrc::f32(gr),
                    m: mm,
                    v,
                    decay: true,
                    p_bf16: None,
                    blocks: Some(gadam::BlockTargets {
                        w,
                        t: Some(gadam::TTarget::Part(*d)),
                    }),
                }
            })
            .collect();
        gadam::adamw_multi(&g, &mut tsb, &s).unwrap();
    }
    // own now holds the stepped weights' W^T: the stacked buffer must hold the same.
    let mut d = parts_differ(&own);
    for ((x, _), (y, _)) in own.iter().zip(&fwd) {
        d += differ(&x.to_host(&g).unwrap(), &y.to_host(&g).unwrap());
    }
    for (x, y) in a.iter().zip(&b) {
        let n = x[0].len();
        d += bits_differ(&dl(&g, &x[0], n), &dl(&g, &y[0], n));
    }
    report_exact(
        "AdamW rewriting stacked W^T == its own",
        &format!("{ns:?} x {k}"),
        d,
    );
    done();
}
