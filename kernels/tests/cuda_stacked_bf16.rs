//! One BF16 WGrad and one BF16 DGrad for the projections that read one input (q, k,
//! v; gate, up) in the flows whose backward GEMMs are BF16: the producers writing
//! each dy as columns of one stacked operand (swiglu's backward, q's and k's norm +
//! RoPE backward; the attention's dv in `cuda_flash`), the members' BF16 weights as
//! row blocks of one stacked weight (prepared and rewritten by AdamW in place), and
//! the stacked GEMMs against one GEMM a projection. Without CUDA every test prints
//! "skipping: no CUDA device: ..." and passes. Run on a GPU machine with
//! `--test-threads=1 --nocapture`.

use cudarc::driver::{CudaSlice, DevicePtr};
use jet_kernels::cuda::gemm::{dense_gemm_to, Dense, LtType};
use jet_kernels::cuda::{adamw as gadam, grad, linear as glin, ops as gops, quantize as gq};
use jet_kernels::ops::rope;
use jet_kernels::Flow;

mod common;
use common::*;

/// BF16 bits that differ between two host copies.
fn u16_differ(a: &[u16], b: &[u16]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

/// Columns `[c0, c0 + n)` of a `[rows][ld]` host matrix.
fn cols(x: &[u16], rows: usize, ld: usize, c0: usize, n: usize) -> Vec<u16> {
    (0..rows)
        .flat_map(|r| x[r * ld + c0..r * ld + c0 + n].iter().copied())
        .collect()
}

fn widen(v: &[u16]) -> Vec<f32> {
    v.iter()
        .map(|&b| half::bf16::from_bits(b).to_f32())
        .collect()
}

/// BF16 bits of random values (a BF16 gradient operand).
fn bf16_rnd(n: usize, seed: u64, amp: f32) -> Vec<u16> {
    rnd(n, seed, amp)
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect()
}

/// The device address of a buffer (for the GEMMs built here).
fn p(g: &jet_kernels::cuda::Gpu, s: &CudaSlice<u16>) -> u64 {
    s.device_ptr(g.stream()).0
}

fn dense(g: &jet_kernels::cuda::Gpu, s: &CudaSlice<u16>, rows: usize, cols: usize) -> Dense {
    Dense {
        ptr: p(g, s),
        ty: LtType::Bf16,
        rows,
        cols,
        ld: cols,
    }
}

#[test]
fn stacked_bf16_producers_write_each_operand() {
    let Some(g) = gpu() else { return };
    // swiglu's backward: the stacked halves == the operands of their own buffers.
    for (rows, c) in [(130usize, 4864usize), (257, 208)] {
        let n = rows * c;
        let (gate, upv, dh) = (rnd(n, 40, 8.0), rnd(n, 41, 2.0), rnd(n, 42, 1.0));
        let (dg, du, ddh) = (up(&g, &gate), up(&g, &upv), up(&g, &dh));
        let f = || gops::SwigluDh::F32(&ddh);
        let (og, ou) = gops::swiglu_backward_bf16(&g, f(), &dg, &du, (rows, c)).unwrap();
        let st = gops::swiglu_backward_bf16_stacked(&g, f(), &dg, &du, (rows, c)).unwrap();
        let s = g.download(&st).unwrap();
        let (og, ou) = (g.download(&og).unwrap(), g.download(&ou).unwrap());
        let d = u16_differ(&cols(&s, rows, 2 * c, 0, c), &og[..rows * c])
            + u16_differ(&cols(&s, rows, 2 * c, c, c), &ou[..rows * c]);
        report_exact(
            "stacked swiglu bwd BF16 == unstacked",
            &format!("[{rows}, {c}]"),
            d,
        );
    }
    // A width not a multiple of 16 would put padding between the halves.
    let x = up(&g, &rnd(8 * 24, 1, 1.0));
    assert!(
        gops::swiglu_backward_bf16_stacked(&g, gops::SwigluDh::F32(&x), &x, &x, (8, 24)).is_err()
    );

    // q's and k's norm + RoPE backward into their columns of q/k/v's stacked dy
    // (room left for v's, and a stride wider than that): the bits of the pair's own
    // BF16 operands and the same dw.
    let table = rope::RopeTable::new(128, 4096, 1_000_000.0, None);
    let gt = gops::GpuRope::new(&g, &table).unwrap();
    for (tokens, nh, nkv) in [(130usize, 16usize, 8usize), (7, 8, 2)] {
        let positions: Vec<usize> = (0..tokens).map(|i| (i * 53) % 4096).collect();
        let dpos = gops::upload_positions(&g, &positions, &gt).unwrap();
        let side = |heads: usize, seed: u64| {
            let rows = tokens * heads;
            let (dy, x, w) = (
                up(&g, &rnd(rows * 128, seed, 1.0)),
                up(&g, &rnd(rows * 128, seed + 1, 2.0)),
                up(&g, &rnd(128, seed + 2, 1.0)),
            );
            let (_, rstd) = gops::rmsnorm_forward(&g, &x, &w, rows, 128, 1e-6).unwrap();
            (dy, x, w, rstd, rnd(128, seed + 3, 1.0))
        };
        let (q, k) = (side(nh, 700), side(nkv, 710));
        let (qw, kw) = (nh * 128, nkv * 128);
        let ld = qw + 2 * kw + 32;
        for round in [false, true] {
            let ins = [
                (&q.0, (&q.1).into(), &q.2, &q.3),
                (&k.0, (&k.1).into(), &k.2, &k.3),
            ];
            let (mut aq, mut ak) = (up(&g, &q.4), up(&g, &k.4));
            let [oq, ok] = gops::qk_norm_rope_backward_pair(
                &g,
                ins,
                (&dpos, &gt),
                (tokens, [nh, nkv]),
                round,
                (&mut aq, &mut ak),
                true,
            )
            .unwrap();
            let (mut bq, mut bk) = (up(&g, &q.4), up(&g, &k.4));
            let st = g.zeros::<u16>(tokens * ld).unwrap();
            gops::qk_norm_rope_backward_pair_stacked(
                &g,
                ins,
                (&dpos, &gt),
                (tokens, [nh, nkv]),
                round,
                (&mut bq, &mut bk),
                (&st, ld),
            )
            .unwrap();
            let s = g.download(&st).unwrap();
            let own = |o: gops::QkNormGrad| match o {
                gops::QkNormGrad::Bf16(b) => g.download(&b).unwrap(),
                gops::QkNormGrad::F32(_) => panic!("asked for BF16"),
            };
            let mut d = u16_differ(&cols(&s, tokens, ld, 0, qw), &own(oq))
                + u16_differ(&cols(&s, tokens, ld, qw, kw), &own(ok));
            // v's columns and the padding stay as they were.
            d += cols(&s, tokens, ld, qw + kw, ld - qw - kw)
                .iter()
                .filter(|&&v| v != 0)
                .count();
            d += bits_differ(&dl(&g, &aq, 128), &dl(&g, &bq, 128))
                + bits_differ(&dl(&g, &ak, 128), &dl(&g, &bk, 128));
            report_exact(
                &format!("stacked q/k norm + rope bwd == the pair's own (round {round})"),
                &format!("{tokens} tokens x {nh} + {nkv} heads, ld {ld}"),
                d,
            );
        }
        // A stride that does not fit q's and k's columns is refused.
        let st = g.zeros::<u16>(tokens * ld).unwrap();
        let (mut bq, mut bk) = (up(&g, &q.4), up(&g, &k.4));
        let bad = gops::qk_norm_rope_backward_pair_stacked(
            &g,
            [
                (&q.0, (&q.1).into(), &q.2, &q.3),
                (&k.0, (&k.1).into(), &k.2, &k.3),
            ],
            (&dpos, &gt),
            (tokens, [nh, nkv]),
            false,
            (&mut bq, &mut bk),
            (&st, qw + kw - 8),
        );
        assert!(bad.is_err());
    }
    done();
}

#[test]
fn stacked_bf16_weights_gemms_and_adamw() {
    let Some(g) = gpu() else { return };
    let (m, k) = (300usize, 256usize);
    let ns = [256usize, 128, 128];
    let total: usize = ns.iter().sum();
    let ws: Vec<Vec<f32>> = ns
        .iter()
        .enumerate()
        .map(|(i, &n)| rnd(n * k, 80 + i as u64, 0.05))
        .collect();
    let dws: Vec<CudaSlice<f32>> = ws.iter().map(|w| up(&g, w)).collect();
    let refs: Vec<(&CudaSlice<f32>, usize, usize)> =
        dws.iter().zip(&ns).map(|(w, &n)| (w, n, k)).collect();

    // The stacked weights: each member's rows the bits of its own BF16 copy.
    let mut own = glin::GpuWeight::prepare_many(&g, &refs, Flow::Bf16).unwrap();
    let (mut parts, stacks) =
        glin::GpuWeight::prepare_stacked(&g, &refs, Flow::Bf16, &[(0, 3)]).unwrap();
    let [Some(glin::Stacked::Bf16(st))] = &stacks[..] else {
        panic!("one stacked BF16 weight asked for")
    };
    let sw = g.download(st).unwrap();
    assert_eq!(sw.len(), total * k);
    let mut d = 0;
    let mut r0 = 0;
    for ((o, p), &n) in own.iter().zip(&parts).zip(&ns) {
        let (a, b) = (
            o.bf16_view().unwrap().to_host(&g).unwrap(),
            p.bf16_view().unwrap().to_host(&g).unwrap(),
        );
        d += u16_differ(&a[..n * k], &b) + u16_differ(&sw[r0 * k..(r0 + n) * k], &b);
        r0 += n;
    }
    report_exact(
        "stacked BF16 weights == each weight's own",
        &format!("{ns:?} x {k}"),
        d,
    );

    // dy stacked [m][sum n] and each projection's own [m][n]; x [m, k].
    let dyh = bf16_rnd(m * total, 90, 1.0);
    let dy = g.upload(&dyh).unwrap();
    let mut c0 = 0;
    let own_dy: Vec<CudaSlice<u16>> = ns
        .iter()
        .map(|&n| {
            let b = g.upload(&cols(&dyh, m, total, c0, n)).unwrap();
            c0 += n;
            b
        })
        .collect();
    let xf = up(&g, &rnd(m * k, 91, 1.0));
    let xb = gq::to_bf16_padded(&g, &xf, m, k, m, k).unwrap();

    // WGrad: the stacked output's row blocks against one GEMM a projection.
    let mut xo = glin::XOperand::default();
    let sdw = glin::wgrad_bf16_stacked(&g, (&dy, total), ((&xf).into(), m, k), &mut xo).unwrap();
    let sdw = g.download(&sdw).unwrap();
    let (mut got, mut want) = (Vec::new(), Vec::new());
    let mut same = 0;
    let mut r0 = 0;
    for (dyi, &n) in own_dy.iter().zip(&ns) {
        let o = g.zeros::<u16>(n * k).unwrap();
        let (a, b) = (dense(&g, dyi, m, n), dense(&g, &xb, m, k));
        dense_gemm_to(&g, (a, true), (b, false), (p(&g, &o), k, LtType::Bf16)).unwrap();
        let o = g.download(&o).unwrap();
        let blk = &sdw[r0 * k..(r0 + n) * k];
        same += blk.iter().zip(&o).filter(|(x, y)| x == y).count();
        got.extend(widen(blk));
        want.extend(widen(&o));
        r0 += n;
    }
    println!(
        "stacked BF16 WGrad: {same} of {} values bit-identical to one GEMM each",
        got.len()
    );
    report(
        "stacked BF16 WGrad block == its own GEMM",
        &format!("[{m}, {ns:?}] x {k}"),
        rel(&got, &want),
        1e-2,
    );

    // DGrad over the stacked weights against one a projection, summed; and one
    // projection's DGrad from its columns of the stacked dy against its own dy.
    let one = glin::linear_dgrad_bf16_stacked(&g, (&dy, total), st, (m, k)).unwrap();
    let glin::GemmOut::Bf16(one, ld) = one else {
        panic!("BF16 DGrad writes BF16")
    };
    assert_eq!(ld, k);
    let got = widen(&g.download(&one).unwrap());
    let mut want = vec![0f32; m * k];
    let mut part_err: f64 = 0.0;
    let mut c0 = 0;
    for ((dyi, w), &n) in own_dy.iter().zip(&own).zip(&ns) {
        let o = g.zeros::<u16>(m * k).unwrap();
        let wv = w.bf16_view().unwrap();
        let b = Dense {
            ptr: wv.ptr(&g),
            ty: LtType::Bf16,
            rows: n,
            cols: k,
            ld: k,
        };
        dense_gemm_to(
            &g,
            (dense(&g, dyi, m, n), false),
            (b, false),
            (p(&g, &o), k, LtType::Bf16),
        )
        .unwrap();
        let o = widen(&g.download(&o).unwrap());
        for (s, v) in want.iter_mut().zip(&o) {
            *s += v;
        }
        let p = glin::linear_dgrad_bf16_part(&g, (&dy, c0, total), w, m).unwrap();
        let glin::GemmOut::Bf16(p, _) = p else {
            panic!("BF16 DGrad writes BF16")
        };
        part_err = part_err.max(rel(&widen(&g.download(&p).unwrap()), &o));
        c0 += n;
    }
    report(
        "stacked BF16 DGrad == sum of one each",
        &format!("[{m}, {total}] x {k}"),
        rel(&got, &want),
        1e-2,
    );
    report(
        "BF16 DGrad of a stacked dy's columns == of its own dy",
        &format!("[{m}, {ns:?}] x {k}"),
        part_err,
        1e-2,
    );

    // AdamW rewriting the members' rows of the stacked weight == their own copies.
    let s = adam_step();
    let (mut a, mut b) = (adam_state(&g, &ws, &ns, k), adam_state(&g, &ws, &ns, k));
    for (st8, ws8) in [(&mut a, &mut own), (&mut b, &mut parts)] {
        let mut ts: Vec<gadam::AdamTensor> = st8
            .iter_mut()
            .zip(ws8.iter_mut())
            .map(|([p, gr, mm, v], w)| {
                let (p_bf16, _) = w.rewritable_mut().expect("a BF16 copy AdamW rewrites");
                gadam::AdamTensor {
                    p,
                    g: grad::GradSrc::f32(gr),
                    m: mm,
                    v,
                    decay: true,
                    p_bf16,
                    blocks: None,
                }
            })
            .collect();
        gadam::adamw_multi(&g, &mut ts, &s).unwrap();
    }
    let mut d = 0;
    for ((o, p), &n) in own.iter().zip(&parts).zip(&ns) {
        let (x, y) = (
            o.bf16_view().unwrap().to_host(&g).unwrap(),
            p.bf16_view().unwrap().to_host(&g).unwrap(),
        );
        d += u16_differ(&x[..n * k], &y);
    }
    for (x, y) in a.iter().zip(&b) {
        let n = x[0].len();
        d += bits_differ(&dl(&g, &x[0], n), &dl(&g, &y[0], n));
    }
    report_exact(
        "AdamW rewriting stacked BF16 weights == their own",
        &format!("{ns:?} x {k}"),
        d,
    );
    done();
}
