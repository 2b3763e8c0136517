//! Activations kept as their BF16 values (`cuda::act`): the rows GEMMs' BF16 output
//! holds the bits of their rounded f32 output, and the ops that read gate and up
//! (SwiGLU forward and backward) give the same bits from either form. Without CUDA
//! every test prints "skipping: no CUDA device: ..." and passes. Run on a GPU
//! machine with `--test-threads=1 --nocapture`.

use cudarc::driver::CudaSlice;
use jet_kernels::cuda::{self, act::Act, gemv, linear as glin, ops as gops, quantize as gq};
use jet_kernels::{Flow, GemmPrecision};

mod common;
use common::*;

/// An activation's values as f32 (BF16 widened exactly).
fn values(g: &cuda::Gpu, x: &Act, n: usize) -> Vec<f32> {
    match x {
        Act::F32(v) => dl(g, v, n),
        Act::Bf16(b) => {
            let b = g.download_n(b, n).unwrap();
            b.iter()
                .map(|&h| f32::from_bits((h as u32) << 16))
                .collect()
        }
    }
}

/// `n` random values rounded to BF16: (f32 on the device, BF16 bits on the device).
fn bf16_valued(g: &cuda::Gpu, n: usize, seed: u64, amp: f32) -> (CudaSlice<f32>, CudaSlice<u16>) {
    let v: Vec<f32> = rnd(n, seed, amp)
        .iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect();
    let bits: Vec<u16> = v.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
    (up(g, &v), g.upload(&bits).unwrap())
}

/// A fused operand's codes, scales and BF16 values, for comparing two of them.
fn operand_bits(g: &cuda::Gpu, op: &gq::FusedOperand) -> (Vec<u8>, Vec<u32>, Vec<u16>) {
    match op {
        gq::FusedOperand::Fp8(q) => (
            g.download(&q.codes).unwrap(),
            g.download(&q.scales)
                .unwrap()
                .iter()
                .map(|s: &f32| s.to_bits())
                .collect(),
            Vec::new(),
        ),
        gq::FusedOperand::Bf16(b) => (Vec::new(), Vec::new(), g.download(b).unwrap()),
    }
}

/// FP8 dual operands' codes and scale bits.
fn dual_bits(g: &cuda::Gpu, q: &gq::DualFp8) -> (Vec<u8>, Vec<u32>) {
    let mut codes = g.download(&q.row.codes).unwrap();
    codes.extend(g.download(&q.col.codes).unwrap());
    let mut scales = g.download(&q.row.scales).unwrap();
    scales.extend(g.download(&q.col.scales).unwrap());
    (codes, scales.iter().map(|s| s.to_bits()).collect())
}

fn count_differ<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    assert_eq!(a.len(), b.len(), "lengths");
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

/// The rows GEMM's BF16 output (bias or not, BF16 and FP8 weights) is the f32
/// output's bits; the split-K sizes stay f32. 1024 x 1024 x 3072 is a 0.6B gate
/// projection of 1,024 tokens (the rows kernel); 300 x 896 x 200 has partial tiles,
/// 1030 x 256 x 1003 rows of y not 16-byte aligned (the staged tile's scalar stores).
#[test]
fn rows_gemm_bf16_output_is_its_rounded_f32() {
    let Some(g) = gpu() else { return };
    let shapes = [
        (1024, 1024, 3072),
        (300, 896, 200),
        (1030, 256, 1003),
        (5, 256, 136),
        // A GRPO micro-batch's k and v (split-K at 256 rows): its epilogue's BF16.
        (256, 1024, 1024),
    ];
    let kept = bf16_output_against_f32(&g, &shapes, |_, _| {});
    done();
    assert!(kept >= 4, "no rows GEMM output kept as BF16 ({kept} of 20)");
}

/// The same with NaN and infinite inputs in a few rows (their outputs NaN or
/// infinite): the rows kernels' stage passes pack a warp's tile by the hardware
/// conversion only where none of its values is NaN (gemm_wg.cu's warp_tile_tma),
/// so these tiles take pack2_bf16 and the rest the instruction, both the f32
/// output's rounded bits.
#[test]
fn rows_gemm_bf16_output_with_nan_and_inf_rows_is_its_rounded_f32() {
    let Some(g) = gpu() else { return };
    let kept = bf16_output_against_f32(&g, &[(300, 256, 200), (1024, 1024, 3072)], |x, k| {
        x[3 * k + 5] = f32::NAN;
        x[7 * k] = f32::INFINITY;
        x[200 * k + 130] = f32::NEG_INFINITY;
        x[260 * k + 1] = -f32::NAN;
    });
    done();
    assert!(kept >= 4, "no rows GEMM output kept as BF16 ({kept} of 8)");
}

/// For each shape, flow and bias: the rows GEMM's kept output (BF16 where it
/// keeps BF16) against its f32 output, bit for bit (report_exact); x [m, k] as
/// `poke` leaves it. Returns how many outputs were kept as BF16.
fn bf16_output_against_f32(
    g: &cuda::Gpu,
    shapes: &[(usize, usize, usize)],
    poke: impl Fn(&mut [f32], usize),
) -> usize {
    let mut kept = 0;
    for &(m, k, n) in shapes {
        let shape = format!("{m}x{k}x{n}");
        let (mut x, w, b) = (rnd(m * k, 51, 1.0), rnd(n * k, 52, 0.05), rnd(n, 53, 0.1));
        poke(&mut x, k);
        let (dx, db) = (up(g, &x), up(g, &b));
        for (flow, prec) in [
            (Flow::Bf16, GemmPrecision::Bf16),
            (Flow::Fp8, GemmPrecision::Fp8),
        ] {
            let gw = glin::GpuWeight::from_host(g, &w, n, k, flow).unwrap();
            for bias in [None, Some(&db)] {
                let layer = [(&gw, bias)];
                let xo = &mut glin::XOperand::default();
                let want = glin::linear_forward_group(g, &dx, xo, m, &layer, prec).unwrap();
                let xo = &mut glin::XOperand::default();
                let got = glin::linear_forward_group_act(g, &dx, xo, m, &layer, prec).unwrap();
                let form = match &got[0] {
                    Act::Bf16(_) => "BF16",
                    Act::F32(_) => "f32",
                };
                kept += usize::from(form == "BF16");
                report_exact(
                    &format!(
                        "linear {flow} kept {form} (bias {}) == f32 output",
                        bias.is_some()
                    ),
                    &shape,
                    bits_differ(&values(g, &got[0], m * n), &dl(g, &want[0], m * n)),
                );
            }
        }
    }
    kept
}

/// The FP8 rows GEMM's BF16 output into a wider buffer (row stride ldy > n, as a
/// column slice of stacked outputs): the n columns of each row hold the ldy = n
/// output's bits and the columns past n keep what was there. ldy n + 56 takes the
/// copy engine's stores (gemm_wg.cu's warp_tile_tma: boxes clipped at n, partial
/// tiles at 300 x 200), n + 4 (rows not 16-byte aligned) the warps' stores.
#[test]
fn rows_gemm_bf16_output_keeps_a_wider_buffers_padding() {
    let Some(g) = gpu() else { return };
    let (m, k, n) = (300, 256, 200);
    let (x, w) = (rnd(m * k, 61, 1.0), rnd(n * k, 62, 0.05));
    let (dx, dw) = (up(&g, &x), up(&g, &w));
    let (qw, _) = gq::quantize_block128(&g, &dw, n, k, false).unwrap();
    let qx = gq::quantize_row1x128(&g, &dx, m, k).unwrap();
    let want = g.zeros::<u16>(m * n).unwrap();
    gemv::gemm_fp8_rows_bf16(&g, &qx, &qw, &want, n).unwrap();
    let want = g.download(&want).unwrap();
    const SENTINEL: u16 = 0x7fc1; // a BF16 NaN no GEMM writes
    for ldy in [n + 56, n + 4] {
        let y = g.upload(&vec![SENTINEL; m * ldy]).unwrap();
        gemv::gemm_fp8_rows_bf16(&g, &qx, &qw, &y, ldy).unwrap();
        let got = g.download(&y).unwrap();
        let mut values = 0;
        let mut padding = 0;
        for r in 0..m {
            let row = &got[r * ldy..(r + 1) * ldy];
            values += (0..n).filter(|&c| row[c] != want[r * n + c]).count();
            padding += row[n..].iter().filter(|&&b| b != SENTINEL).count();
        }
        let shape = format!("{m}x{k}x{n}, ldy {ldy}");
        report_exact("rows BF16 output, values == ldy n's", &shape, values);
        report_exact("rows BF16 output, padding untouched", &shape, padding);
    }
    done();
}

/// SwiGLU's forward (with either operand) and its backward (BF16 and FP8 operands,
/// from the down projection's BF16 dh) give the same bits from BF16 gate and up as
/// from their f32 values; gate and up of different forms are refused.
#[test]
fn swiglu_reads_bf16_gate_up_as_their_f32_values() {
    let Some(g) = gpu() else { return };
    for (rows, cols) in [(130, 896), (257, 200), (64, 3072)] {
        let (n, shape) = (rows * cols, format!("[{rows}, {cols}]"));
        let (gf, gb) = bf16_valued(&g, n, 61, 4.0);
        let (uf, ub) = bf16_valued(&g, n, 62, 2.0);
        for fp8 in [true, false] {
            let (h1, o1) = gq::swiglu_operand(&g, &gf, &uf, (rows, cols), fp8).unwrap();
            let (h2, o2) = gq::swiglu_operand(&g, &gb, &ub, (rows, cols), fp8).unwrap();
            let (a, b) = (operand_bits(&g, &o1), operand_bits(&g, &o2));
            report_exact(
                &format!(
                    "swiglu+{} from BF16 gate/up == from f32",
                    if fp8 { "fp8" } else { "bf16" }
                ),
                &shape,
                bits_differ(&dl(&g, &h1, n), &dl(&g, &h2, n))
                    + count_differ(&a.0, &b.0)
                    + count_differ(&a.1, &b.1)
                    + count_differ(&a.2, &b.2),
            );
        }
        // The f32 ops' view of BF16-kept values: widened exactly.
        let kept = Act::Bf16(g.download(&gb).map(|b| g.upload(&b)).unwrap().unwrap());
        let mut keep = None;
        let wide = dl(&g, kept.as_f32(&g, &mut keep).unwrap(), n);
        report_exact(
            "BF16-kept gate widened == its f32 values",
            &shape,
            bits_differ(&wide, &dl(&g, &gf, n)),
        );
        let mixed = gq::swiglu_operand(&g, &gf, &ub, (rows, cols), false);
        assert!(
            matches!(&mixed, Err(e) if e.to_string().contains("both")),
            "mixed gate/up forms accepted: {:?}",
            mixed.err()
        );
        // dh as the down projection's DGrad output in BF16 (row stride past the
        // columns).
        let ld = cuda::pad16(cols) + 8;
        let (dhf, _) = bf16_valued(&g, n, 63, 1.0);
        let dh16 = gq::to_bf16_padded(&g, &dhf, rows, cols, rows, ld).unwrap();
        let dh = gops::SwigluDh::Bf16(&dh16, ld);
        let (p1, p2) = gops::swiglu_backward_bf16(&g, dh, &gf, &uf, (rows, cols)).unwrap();
        let (q1, q2) = gops::swiglu_backward_bf16(&g, dh, &gb, &ub, (rows, cols)).unwrap();
        let [p1, p2, q1, q2] = [p1, p2, q1, q2].map(|x| g.download(&x).unwrap());
        report_exact(
            "swiglu bwd BF16 operands from BF16 gate/up == from f32",
            &shape,
            count_differ(&p1, &q1) + count_differ(&p2, &q2),
        );
        let (f1, f2) = gq::swiglu_backward_fp8(&g, dh, &gf, &uf, (rows, cols)).unwrap();
        let (b1, b2) = gq::swiglu_backward_fp8(&g, dh, &gb, &ub, (rows, cols)).unwrap();
        let differ: usize = [(&f1, &b1), (&f2, &b2)]
            .iter()
            .map(|(x, y)| {
                let (x, y) = (dual_bits(&g, x), dual_bits(&g, y));
                count_differ(&x.0, &y.0) + count_differ(&x.1, &y.1)
            })
            .sum();
        report_exact(
            "swiglu bwd FP8 operands from BF16 gate/up == from f32",
            &shape,
            differ,
        );
    }
    done();
}

/// SwiGLU with both FP8 groupings of h in one pass (the training forward's, FP8
/// WGrad) gives swiglu_operand's 1x128 operand and quantize_col128x1 of its h, bit
/// for bit, from f32 and from BF16 gate and up. Shapes: partial tiles in both
/// directions, columns not a multiple of 4 (scalar loads), several row tiles.
#[test]
fn swiglu_dual_is_the_operand_and_the_128x1_groups_of_h() {
    let Some(g) = gpu() else { return };
    for (rows, cols) in [(130, 896), (257, 203), (300, 3072)] {
        let (n, shape) = (rows * cols, format!("[{rows}, {cols}]"));
        let (gf, gb) = bf16_valued(&g, n, 71, 4.0);
        let (uf, ub) = bf16_valued(&g, n, 72, 2.0);
        let (h, op) = gq::swiglu_operand(&g, &gf, &uf, (rows, cols), true).unwrap();
        let gq::FusedOperand::Fp8(row) = op else {
            panic!("swiglu_operand: FP8 asked, another operand given")
        };
        let want = gq::DualFp8 {
            row,
            col: gq::quantize_col128x1(&g, &h, rows, cols).unwrap(),
        };
        let want = dual_bits(&g, &want);
        for (form, q) in [
            ("f32", gq::swiglu_dual(&g, &gf, &uf, (rows, cols)).unwrap()),
            ("BF16", gq::swiglu_dual(&g, &gb, &ub, (rows, cols)).unwrap()),
        ] {
            let got = dual_bits(&g, &q);
            report_exact(
                &format!("swiglu 1x128 + 128x1 from {form} gate/up == operand, 128x1 of h"),
                &shape,
                count_differ(&got.0, &want.0) + count_differ(&got.1, &want.1),
            );
        }
    }
    let (gf, _) = bf16_valued(&g, 64, 73, 1.0);
    let (_, ub) = bf16_valued(&g, 64, 74, 1.0);
    let mixed = gq::swiglu_dual(&g, &gf, &ub, (8, 8));
    assert!(
        matches!(&mixed, Err(e) if e.to_string().contains("both")),
        "mixed gate/up forms accepted: {:?}",
        mixed.err()
    );
    done();
}

/// The LM head's logits kept as BF16 values: the scored log-probs in place and
/// their backward (as the BF16 and the FP8 operands) give the bits of the same
/// values in f32, rows and vocabularies not aligned to 4 or 16 included; the
/// in-place backward (f32 only) refuses them.
#[test]
fn token_logprobs_read_bf16_logits_as_their_f32_values() {
    use jet_kernels::cuda::logsoftmax as glsm;
    let Some(g) = gpu() else { return };
    for (total, vocab, scale) in [(9, 1000, 1.0f32), (6, 151_936, 1.0), (7, 1003, 0.5)] {
        let shape = format!("[{total}, {vocab}]");
        let at = [4usize, 1, total - 1];
        let r = at.len();
        let tg: Vec<u32> = (0..r).map(|i| ((i * 7919 + 3) % vocab) as u32).collect();
        let (dlp, dent) = (up(&g, &rnd(r, 71, 1.0)), up(&g, &rnd(r, 72, 1.0)));
        let (zf, zb) = bf16_valued(&g, total * vocab, 73, 8.0);
        let f = glsm::token_logprobs_forward_at(&g, &zf, total, vocab, &at, &tg).unwrap();
        let b = glsm::token_logprobs_forward_at(&g, &zb, total, vocab, &at, &tg).unwrap();
        let differ: usize = [
            (&f.logp, &b.logp),
            (&f.entropy, &b.entropy),
            (&f.lse, &b.lse),
        ]
        .iter()
        .map(|(x, y)| bits_differ(&dl(&g, x, r), &dl(&g, y, r)))
        .sum();
        report_exact(
            "token logprobs fwd from BF16 logits == from f32",
            &shape,
            differ,
        );
        let d = glsm::ScoredGrad {
            tgt: &tg,
            fwd: &f,
            dlogp: &dlp,
            dentropy: Some(&dent),
        };
        let back = |z: Act, prec| {
            let out = glsm::ScoredOut::alloc(&g, prec, total, vocab).unwrap();
            glsm::token_logprobs_backward_at(&g, z, (total, vocab), &at, &d, scale, out)
        };
        let copy_f = || Act::F32(up(&g, &dl(&g, &zf, total * vocab)));
        let copy_b = || Act::Bf16(g.upload(&g.download(&zb).unwrap()).unwrap());
        let bf16 = Some(GemmPrecision::Bf16);
        let (Ok(glsm::ScoredDz::Bf16(x)), Ok(glsm::ScoredDz::Bf16(y))) =
            (back(copy_f(), bf16), back(copy_b(), bf16))
        else {
            panic!("BF16 operands asked for")
        };
        let (x, y) = (g.download(&x).unwrap(), g.download(&y).unwrap());
        report_exact(
            "token logprobs bwd BF16 operand from BF16 logits == from f32",
            &shape,
            count_differ(&x, &y),
        );
        let fp8 = Some(GemmPrecision::Fp8);
        let (Ok(glsm::ScoredDz::Fp8(x)), Ok(glsm::ScoredDz::Fp8(y))) =
            (back(copy_f(), fp8), back(copy_b(), fp8))
        else {
            panic!("FP8 operands asked for")
        };
        let (x, y) = (dual_bits(&g, &x), dual_bits(&g, &y));
        report_exact(
            "token logprobs bwd FP8 operands from BF16 logits == from f32",
            &shape,
            count_differ(&x.0, &y.0) + count_differ(&x.1, &y.1),
        );
        let in_place = back(copy_b(), None);
        assert!(
            matches!(&in_place, Err(e) if e.to_string().contains("in place")),
            "BF16 logits taken for the in-place backward"
        );
    }
    done();
}
