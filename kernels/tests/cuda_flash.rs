//! The tensor-core attention (`cuda::flash`) against the CPU reference
//! (`ops::attention`), decode against the training forward bit for bit, and run-to-run
//! determinism. Without CUDA every test prints "skipping: ..." and passes. Run on a
//! GPU machine with `--test-threads=1 --nocapture`.
//!
//! Bounds: the kernels round q, k, v, dout and the probabilities to BF16 at the
//! tensor-core products (f32 accumulation); the reference is all f32. BF16 has a
//! relative step of 2^-8, so errors of a few 1e-3 norm-wise are expected.

use jet_kernels::cuda::flash::{self, Dout, FlashPlan};
use jet_kernels::cuda::quantize as gq;
use jet_kernels::ops::attention::{self, AttnShape};

mod common;
use common::*;

struct Case {
    shape: AttnShape,
    seqs: &'static [usize],
}

// The last: 16 query heads a KV head (Qwen3-235B's grouping), the decode tile's
// rows 8-15 in use.
const CASES: [Case; 4] = [
    Case {
        shape: AttnShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 64,
        },
        seqs: &[5, 70, 130],
    },
    Case {
        shape: AttnShape {
            n_heads: 16,
            n_kv_heads: 8,
            head_dim: 128,
        },
        seqs: &[200, 64, 1],
    },
    Case {
        shape: AttnShape {
            n_heads: 8,
            n_kv_heads: 2,
            head_dim: 128,
        },
        seqs: &[129, 33],
    },
    Case {
        shape: AttnShape {
            n_heads: 16,
            n_kv_heads: 1,
            head_dim: 128,
        },
        seqs: &[40, 3],
    },
];

fn label(c: &Case) -> String {
    let s: Vec<String> = c.seqs.iter().map(|x| x.to_string()).collect();
    format!(
        "{}q/{}kv x {}, seqs {}",
        c.shape.n_heads,
        c.shape.n_kv_heads,
        c.shape.head_dim,
        s.join("+")
    )
}

#[test]
fn flash_matches_cpu_reference() {
    let Some(g) = gpu() else { return };
    for (ci, c) in CASES.iter().enumerate() {
        let sh = c.shape;
        let rows: usize = c.seqs.iter().sum();
        let (qw, kvw) = (sh.n_heads * sh.head_dim, sh.n_kv_heads * sh.head_dim);
        let seed = 100 + 10 * ci as u64;
        let (q, k, v, dout) = (
            rnd(rows * qw, seed, 1.5),
            rnd(rows * kvw, seed + 1, 1.5),
            rnd(rows * kvw, seed + 2, 1.5),
            rnd(rows * qw, seed + 3, 1.0),
        );
        let plan = FlashPlan::new(&g, c.seqs).unwrap();
        let (gq, gk, gv) = (up(&g, &q), up(&g, &k), up(&g, &v));
        let (out, saved) = flash::flash_forward(&g, &plan, &gq, &gk, &gv, sh).unwrap();
        // Every build of the backward this GPU has (mma.sync, and wgmma on sm_90).
        let mut builds = vec![flash::BwdKernel::MmaSync];
        if g.wgmma() {
            builds.push(flash::BwdKernel::Wgmma);
        }
        let gdout = up(&g, &dout);
        let grads: Vec<_> = builds
            .iter()
            .map(|&b| {
                let r = flash::flash_backward_with(&g, &plan, &gdout, &out, &saved, sh, b);
                (b, r.unwrap())
            })
            .collect();
        // dv rounded by the kernel (the low-precision flows) == dv rounded after it;
        // dq and dk unchanged.
        let (rq, rk, rv) =
            flash::flash_backward(&g, &plan, Dout::F32(&gdout), &out, &saved, sh, true).unwrap();
        let (pq, pk, pv) =
            flash::flash_backward(&g, &plan, Dout::F32(&gdout), &out, &saved, sh, false).unwrap();
        let want_v: Vec<f32> = dl(&g, &pv, rows * kvw)
            .iter()
            .map(|&x| jet_kernels::bf16::round(x))
            .collect();
        report_exact(
            "flash bwd, dv rounded in the kernel == rounded after",
            &label(c),
            bits_differ(&dl(&g, &rv, rows * kvw), &want_v)
                + bits_differ(&dl(&g, &rq, rows * qw), &dl(&g, &pq, rows * qw))
                + bits_differ(&dl(&g, &rk, rows * kvw), &dl(&g, &pk, rows * kvw)),
        );
        // dv's BF16 operand from the same kernel, in place of f32 dv: the copy of
        // the rounded dv, bit for bit, and dq, dk those of the rounded backward.
        let (oq, ok, o16) = flash::flash_backward_operand(
            &g,
            &plan,
            (Dout::F32(&gdout), (&out).into()),
            &saved,
            sh,
            true,
        )
        .unwrap();
        let copy = gq::to_bf16_padded(&g, &rv, rows, kvw, rows, kvw).unwrap();
        let (a, b) = (g.download(&o16).unwrap(), g.download(&copy).unwrap());
        report_exact(
            "flash bwd, dv's BF16 operand == the copy of dv",
            &label(c),
            a.iter().zip(&b).filter(|(x, y)| x != y).count()
                + bits_differ(&dl(&g, &oq, rows * qw), &dl(&g, &rq, rows * qw))
                + bits_differ(&dl(&g, &ok, rows * kvw), &dl(&g, &rk, rows * kvw)),
        );
        // dv's BF16 operand as its columns of q/k/v's stacked dy (`[rows][qw + 2 kvw]`,
        // v's the last): the same bits, q's and k's columns untouched.
        let ld = qw + 2 * kvw;
        let st = g.zeros::<u16>(rows * ld).unwrap();
        let (sq, sk) = flash::flash_backward_operand_at(
            &g,
            &plan,
            (Dout::F32(&gdout), (&out).into()),
            &saved,
            sh,
            true,
            (&st, qw + kvw, ld),
        )
        .unwrap();
        let s16 = g.download(&st).unwrap();
        let mut stacked = 0;
        for r in 0..rows {
            let row = &s16[r * ld..(r + 1) * ld];
            stacked += row[qw + kvw..]
                .iter()
                .zip(&a[r * kvw..(r + 1) * kvw])
                .filter(|(x, y)| x != y)
                .count();
            stacked += row[..qw + kvw].iter().filter(|&&v| v != 0).count();
        }
        report_exact(
            "flash bwd, dv's BF16 operand at a stacked dy's columns == its own",
            &label(c),
            stacked
                + bits_differ(&dl(&g, &sq, rows * qw), &dl(&g, &oq, rows * qw))
                + bits_differ(&dl(&g, &sk, rows * kvw), &dl(&g, &ok, rows * kvw)),
        );
        // dO given as BF16 values (the o projection's DGrad output, read in place of
        // its f32 epilogue): the bits of the backward of those values in f32.
        let d16 = gq::to_bf16_padded(&g, &gdout, rows, qw, rows, qw).unwrap();
        let dr: Vec<f32> = dout.iter().map(|&x| jet_kernels::bf16::round(x)).collect();
        let gdr = up(&g, &dr);
        let (fq, fk, f16) = flash::flash_backward_operand(
            &g,
            &plan,
            (Dout::F32(&gdr), (&out).into()),
            &saved,
            sh,
            true,
        )
        .unwrap();
        let (bq, bk, b16) = flash::flash_backward_operand(
            &g,
            &plan,
            (Dout::Bf16(&d16), (&out).into()),
            &saved,
            sh,
            true,
        )
        .unwrap();
        let (a, b) = (g.download(&f16).unwrap(), g.download(&b16).unwrap());
        report_exact(
            "flash bwd, dO in BF16 == dO's BF16 values in f32",
            &label(c),
            a.iter().zip(&b).filter(|(x, y)| x != y).count()
                + bits_differ(&dl(&g, &bq, rows * qw), &dl(&g, &fq, rows * qw))
                + bits_differ(&dl(&g, &bk, rows * kvw), &dl(&g, &fk, rows * kvw)),
        );
        // The output's BF16 operand from the forward kernel: the copy of the output.
        let (fo, _, f16) = flash::flash_forward_operand(&g, &plan, (&gq, &gk, &gv), sh).unwrap();
        let copy = gq::to_bf16_padded(&g, &out, rows, qw, rows, qw).unwrap();
        let (a, b) = (g.download(&f16).unwrap(), g.download(&copy).unwrap());
        report_exact(
            "flash fwd, the output's BF16 operand == the copy of the output",
            &label(c),
            a.iter().zip(&b).filter(|(x, y)| x != y).count()
                + bits_differ(&dl(&g, &fo, rows * qw), &dl(&g, &out, rows * qw)),
        );
        // From BF16 copies made elsewhere (the training forward's q, k and v leave
        // their producers so): the same output, log-sum-exp and operand.
        let copies = [(&gq, qw), (&gk, kvw), (&gv, kvw)]
            .map(|(x, w)| flash::attention_operand_bf16(&g, x, rows * w).unwrap());
        let (bo, bsaved, b16) =
            flash::flash_forward_operand_bf16(&g, &plan, copies, sh, flash::FwdOut::F32Bf16)
                .unwrap();
        let bo = bo.unwrap();
        let (_, fsaved, _) = flash::flash_forward_operand(&g, &plan, (&gq, &gk, &gv), sh).unwrap();
        let (a, b) = (
            g.download(&b16.unwrap()).unwrap(),
            g.download(&f16).unwrap(),
        );
        report_exact(
            "flash fwd from BF16 q, k, v == from f32",
            &label(c),
            a.iter().zip(&b).filter(|(x, y)| x != y).count()
                + bits_differ(&dl(&g, &bo, rows * qw), &dl(&g, &fo, rows * qw))
                + bits_differ(
                    &dl(&g, &bsaved.lse, rows * sh.n_heads),
                    &dl(&g, &fsaved.lse, rows * sh.n_heads),
                ),
        );
        // The output's BF16 values alone (a BF16 flow's training): the same operand
        // and log-sum-exp, no f32 output; a backward whose delta reads those BF16
        // values equals one given them widened to f32, bit for bit.
        let copies = [(&gq, qw), (&gk, kvw), (&gv, kvw)]
            .map(|(x, w)| flash::attention_operand_bf16(&g, x, rows * w).unwrap());
        let (none, osaved, only16) =
            flash::flash_forward_operand_bf16(&g, &plan, copies, sh, flash::FwdOut::Bf16).unwrap();
        let only16 = only16.unwrap();
        let h16 = g.download(&only16).unwrap();
        let wide: Vec<f32> = h16
            .iter()
            .map(|&x| half::bf16::from_bits(x).to_f32())
            .collect();
        let gwide = up(&g, &wide);
        let (aq, ak, av) =
            flash::flash_backward(&g, &plan, Dout::F32(&gdout), &only16, &osaved, sh, true)
                .unwrap();
        let (wq, wk, wv) =
            flash::flash_backward(&g, &plan, Dout::F32(&gdout), &gwide, &osaved, sh, true).unwrap();
        report_exact(
            "flash fwd, BF16 output alone == the operand; bwd from it == from its f32 values",
            &label(c),
            usize::from(none.is_some())
                + h16.iter().zip(&a).filter(|(x, y)| x != y).count()
                + bits_differ(
                    &dl(&g, &osaved.lse, rows * sh.n_heads),
                    &dl(&g, &fsaved.lse, rows * sh.n_heads),
                )
                + bits_differ(&dl(&g, &aq, rows * qw), &dl(&g, &wq, rows * qw))
                + bits_differ(&dl(&g, &ak, rows * kvw), &dl(&g, &wk, rows * kvw))
                + bits_differ(&dl(&g, &av, rows * kvw), &dl(&g, &wv, rows * kvw)),
        );
        // The capped-register build of the forward computes the same bits.
        let (out3, _) =
            flash::flash_forward_with(&g, &plan, &gq, &gk, &gv, sh, flash::FwdKernel::Occupancy3)
                .unwrap();
        report_exact(
            "flash fwd, 3-CTA build == default",
            &label(c),
            bits_differ(&dl(&g, &out3, rows * qw), &dl(&g, &out, rows * qw)),
        );
        let (mut co, mut cdq, mut cdk, mut cdv) = (vec![], vec![], vec![], vec![]);
        let mut r0 = 0;
        for &s in c.seqs {
            let (qs, ks, vs, ds) = (
                &q[r0 * qw..(r0 + s) * qw],
                &k[r0 * kvw..(r0 + s) * kvw],
                &v[r0 * kvw..(r0 + s) * kvw],
                &dout[r0 * qw..(r0 + s) * qw],
            );
            let (o, p) = attention::attention_forward(qs, ks, vs, s, sh);
            let (a, b, d) = attention::attention_backward(ds, qs, ks, vs, &p, s, sh);
            co.extend(o);
            cdq.extend(a);
            cdk.extend(b);
            cdv.extend(d);
            r0 += s;
        }
        let l = label(c);
        report(
            "flash fwd out",
            &l,
            rel(&dl(&g, &out, rows * qw), &co),
            1e-2,
        );
        for (b, (dq, dk, dv)) in &grads {
            let l = format!("{l}, {b:?}");
            report("flash bwd dq", &l, rel(&dl(&g, dq, rows * qw), &cdq), 2e-2);
            report("flash bwd dk", &l, rel(&dl(&g, dk, rows * kvw), &cdk), 2e-2);
            report("flash bwd dv", &l, rel(&dl(&g, dv, rows * kvw), &cdv), 2e-2);
        }
    }
    done();
}

/// Every row of every sequence, decoded against a cache that holds only the keys
/// up to that row (NaN past them), equals the training forward's row bit for bit.
#[test]
fn flash_decode_equals_forward_rows() {
    let Some(g) = gpu() else { return };
    for (ci, c) in CASES.iter().enumerate() {
        let sh = c.shape;
        let rows: usize = c.seqs.iter().sum();
        let (qw, kvw) = (sh.n_heads * sh.head_dim, sh.n_kv_heads * sh.head_dim);
        let seed = 200 + 10 * ci as u64;
        let (q, k, v) = (
            rnd(rows * qw, seed, 2.0),
            rnd(rows * kvw, seed + 1, 2.0),
            rnd(rows * kvw, seed + 2, 2.0),
        );
        let plan = FlashPlan::new(&g, c.seqs).unwrap();
        let (out, _) =
            flash::flash_forward(&g, &plan, &up(&g, &q), &up(&g, &k), &up(&g, &v), sh).unwrap();
        let out = dl(&g, &out, rows * qw);
        // One cache slot per decoded row: keys 0..=t of its sequence, NaN after.
        // The f32 caches go to the device as BF16 through flash_scatter_rows.
        let cap = c.seqs.iter().copied().max().unwrap() + 3;
        let (mut kc, mut vc) = (
            vec![f32::NAN; rows * cap * kvw],
            vec![f32::NAN; rows * cap * kvw],
        );
        let (mut slots, mut lens) = (vec![], vec![]);
        let mut r0 = 0;
        for &s in c.seqs {
            for t in 0..s {
                let slot = r0 + t;
                let dst = slot * cap * kvw;
                kc[dst..dst + (t + 1) * kvw].copy_from_slice(&k[r0 * kvw..(r0 + t + 1) * kvw]);
                vc[dst..dst + (t + 1) * kvw].copy_from_slice(&v[r0 * kvw..(r0 + t + 1) * kvw]);
                slots.push(slot);
                lens.push(t + 1);
            }
            r0 += s;
        }
        let all: Vec<usize> = (0..rows * cap).collect();
        let (mut kc16, mut vc16) = (
            g.zeros::<u16>(rows * cap * kvw).unwrap(),
            g.zeros::<u16>(rows * cap * kvw).unwrap(),
        );
        flash::flash_scatter_rows(&g, &mut kc16, kvw, &all, &up(&g, &kc)).unwrap();
        flash::flash_scatter_rows(&g, &mut vc16, kvw, &all, &up(&g, &vc)).unwrap();
        // A prefill's form: rows already BF16 (the bits of the f32 rows' rounding),
        // copied to their cache rows (here in reverse order) by one launch.
        let (k16, v16) = (g.download(&kc16).unwrap(), g.download(&vc16).unwrap());
        let rev: Vec<usize> = all.iter().rev().copied().collect();
        let reorder = |x: &[u16]| -> Vec<u16> {
            rev.iter()
                .flat_map(|&r| x[r * kvw..(r + 1) * kvw].iter().copied())
                .collect()
        };
        let crows = flash::CacheRows::new(&g, &rev, rows * cap).unwrap();
        let (mut kr, mut vr) = (
            g.zeros::<u16>(rows * cap * kvw).unwrap(),
            g.zeros::<u16>(rows * cap * kvw).unwrap(),
        );
        let src = (
            g.upload(&reorder(&k16)).unwrap(),
            g.upload(&reorder(&v16)).unwrap(),
        );
        flash::flash_scatter_kv16(&g, (&mut kr, &mut vr), kvw, &crows, (&src.0, &src.1)).unwrap();
        let (kr, vr) = (g.download(&kr).unwrap(), g.download(&vr).unwrap());
        report_exact(
            "BF16 rows scattered == f32 rows scattered",
            &label(c),
            kr.iter().zip(&k16).filter(|(a, b)| a != b).count()
                + vr.iter().zip(&v16).filter(|(a, b)| a != b).count(),
        );
        let od =
            flash::flash_decode_at(&g, &up(&g, &q), &kc16, &vc16, cap, &slots, &lens, sh).unwrap();
        report_exact(
            "flash decode == forward row",
            &label(c),
            bits_differ(&dl(&g, &od, rows * qw), &out),
        );
        // The same rows in a paged cache: each slot's pages of PAGE_ROWS rows
        // dealt out in a scrambled order after page 0 (NaN, as every row no
        // slot holds), read through the table; the f32 per-row kernel too.
        {
            let pr = flash::PAGE_ROWS;
            let stride = cap.div_ceil(pr);
            let npages = rows * stride + 1;
            let table: Vec<i32> = (0..rows * stride)
                .map(|i| 1 + ((i * 7919 + 13) % (rows * stride)) as i32)
                .collect();
            let (mut kp, mut vp) = (
                vec![f32::NAN; npages * pr * kvw],
                vec![f32::NAN; npages * pr * kvw],
            );
            for slot in 0..rows {
                for t in 0..cap {
                    let (src, page) = ((slot * cap + t) * kvw, table[slot * stride + t / pr]);
                    let dst = (page as usize * pr + t % pr) * kvw;
                    kp[dst..dst + kvw].copy_from_slice(&kc[src..src + kvw]);
                    vp[dst..dst + kvw].copy_from_slice(&vc[src..src + kvw]);
                }
            }
            let every: Vec<usize> = (0..npages * pr).collect();
            let (mut kp16, mut vp16) = (
                g.zeros::<u16>(npages * pr * kvw).unwrap(),
                g.zeros::<u16>(npages * pr * kvw).unwrap(),
            );
            flash::flash_scatter_rows(&g, &mut kp16, kvw, &every, &up(&g, &kp)).unwrap();
            flash::flash_scatter_rows(&g, &mut vp16, kvw, &every, &up(&g, &vp)).unwrap();
            let tdev = g.upload(&table).unwrap();
            let qd = up(&g, &q);
            let op = flash::flash_decode_paged(
                &g,
                &qd,
                (&kp16, &vp16),
                (&tdev, stride),
                &slots,
                &lens,
                sh,
            )
            .unwrap();
            report_exact(
                "paged flash decode == forward row",
                &label(c),
                bits_differ(&dl(&g, &op, rows * qw), &out),
            );
            let (kf, vf) = (up(&g, &kc), up(&g, &vc));
            let want = jet_kernels::cuda::attention::attention_decode_at(
                &g, &qd, &kf, &vf, cap, &slots, &lens, sh,
            )
            .unwrap();
            let got = jet_kernels::cuda::attention::attention_decode_paged(
                &g,
                &qd,
                (&up(&g, &kp), &up(&g, &vp)),
                (&tdev, stride),
                &slots,
                &lens,
                sh,
            )
            .unwrap();
            report_exact(
                "paged f32 decode == contiguous f32 decode",
                &label(c),
                bits_differ(&dl(&g, &got, rows * qw), &dl(&g, &want, rows * qw)),
            );
            // The graph's form through the table: the kernel appends each row's
            // own k, v (NaN in the paged cache until then) into its page.
            let (mut ka, mut va) = (kp.clone(), vp.clone());
            for (i, &l) in lens.iter().enumerate() {
                let t = l - 1;
                let at = (table[slots[i] * stride + t / pr] as usize * pr + t % pr) * kvw;
                ka[at..at + kvw].fill(f32::NAN);
                va[at..at + kvw].fill(f32::NAN);
            }
            let (mut ka16, mut va16) = (
                g.zeros::<u16>(npages * pr * kvw).unwrap(),
                g.zeros::<u16>(npages * pr * kvw).unwrap(),
            );
            flash::flash_scatter_rows(&g, &mut ka16, kvw, &every, &up(&g, &ka)).unwrap();
            flash::flash_scatter_rows(&g, &mut va16, kvw, &every, &up(&g, &va)).unwrap();
            let kv0: Vec<i32> = slots.iter().map(|&s| (s * stride) as i32).collect();
            let len: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
            let (kv0, len) = (g.upload(&kv0).unwrap(), g.upload(&len).unwrap());
            let at = flash::KvAt {
                kv0: &kv0,
                len: &len,
                pages: Some(&tdev),
            };
            let oa = flash::flash_append_decode_dev(
                &g,
                &qd,
                (&up(&g, &k), &up(&g, &v)),
                (&mut ka16, &mut va16),
                at,
                rows,
                sh,
            )
            .unwrap();
            let cached = |a: &cudarc::driver::CudaSlice<u16>,
                          b: &cudarc::driver::CudaSlice<u16>| {
                let (a, b) = (g.download(a).unwrap(), g.download(b).unwrap());
                a.iter().zip(&b).filter(|(x, y)| x != y).count()
            };
            report_exact(
                "paged append+decode == forward row, its cache == the scattered one",
                &label(c),
                bits_differ(&dl(&g, &oa, rows * qw), &out)
                    + cached(&ka16, &kp16)
                    + cached(&va16, &vp16),
            );
        }
        // The graph's form: each row's own key and value (decoded row i is row i of
        // k, v) not yet in the caches, NaN there; the kernel writes and reads them.
        for (i, &l) in lens.iter().enumerate() {
            let at = (slots[i] * cap + l - 1) * kvw;
            kc[at..at + kvw].fill(f32::NAN);
            vc[at..at + kvw].fill(f32::NAN);
        }
        let (mut ka, mut va) = (
            g.zeros::<u16>(rows * cap * kvw).unwrap(),
            g.zeros::<u16>(rows * cap * kvw).unwrap(),
        );
        flash::flash_scatter_rows(&g, &mut ka, kvw, &all, &up(&g, &kc)).unwrap();
        flash::flash_scatter_rows(&g, &mut va, kvw, &all, &up(&g, &vc)).unwrap();
        let kv0: Vec<i32> = slots.iter().map(|&s| (s * cap) as i32).collect();
        let len: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
        let oa = flash::flash_append_decode_dev(
            &g,
            &up(&g, &q),
            (&up(&g, &k), &up(&g, &v)),
            (&mut ka, &mut va),
            (&g.upload(&kv0).unwrap(), &g.upload(&len).unwrap()),
            rows,
            sh,
        )
        .unwrap();
        report_exact(
            "flash append+decode == forward row",
            &label(c),
            bits_differ(&dl(&g, &oa, rows * qw), &out),
        );
        let n = rows * cap * kvw;
        let differ = |a: &cudarc::driver::CudaSlice<u16>, b: &cudarc::driver::CudaSlice<u16>| {
            let (a, b) = (g.download(a).unwrap(), g.download(b).unwrap());
            a[..n].iter().zip(&b[..n]).filter(|(x, y)| x != y).count()
        };
        report_exact(
            "appended cache == scattered cache",
            &label(c),
            differ(&ka, &kc16) + differ(&va, &vc16),
        );
        // The launch that also makes the o projection's operand of its output: the
        // output's bits again, and the operand's those of the quantizer (1x128
        // groups, heads of 128) or BF16 copy of that output.
        let oa_dev = up(&g, &out);
        for fp8 in [false, true] {
            if !flash::decode_operand_fits(sh, fp8) {
                continue;
            }
            poison_pool(&g, 4 * rows * qw * 4);
            let (oo, op) = flash::flash_append_decode_operand_dev(
                &g,
                &up(&g, &q),
                (&up(&g, &k), &up(&g, &v)),
                (&mut ka, &mut va),
                (&g.upload(&kv0).unwrap(), &g.upload(&len).unwrap()),
                rows,
                sh,
                fp8,
            )
            .unwrap();
            let mut diff = bits_differ(&dl(&g, &oo, rows * qw), &out);
            let bytes = |x: &cudarc::driver::CudaSlice<u8>| g.download(x).unwrap();
            match op {
                gq::FusedOperand::Fp8(got) => {
                    let want = gq::quantize_row1x128(&g, &oa_dev, rows, qw).unwrap();
                    let (a, b) = (bytes(&got.codes), bytes(&want.codes));
                    diff += a.iter().zip(&b).filter(|(x, y)| x != y).count();
                    let n = want.scales.len();
                    diff += bits_differ(&dl(&g, &got.scales, n), &dl(&g, &want.scales, n));
                    diff +=
                        usize::from((got.rows_pad, got.cols_pad) != (want.rows_pad, want.cols_pad));
                }
                gq::FusedOperand::Bf16(got) => {
                    let want =
                        gq::to_bf16_padded(&g, &oa_dev, rows, qw, rows, qw.div_ceil(16) * 16)
                            .unwrap();
                    let (a, b) = (g.download(&got).unwrap(), g.download(&want).unwrap());
                    diff += a.iter().zip(&b).filter(|(x, y)| x != y).count();
                }
            }
            report_exact(
                &format!(
                    "flash append+decode with its {} operand",
                    ["BF16", "FP8"][fp8 as usize]
                ),
                &label(c),
                diff,
            );
        }
    }
    done();
}

/// `bytes` of 0xa5, freed: the memory pool's next buffers likely start with
/// them, not with zeros, so a byte a kernel fails to write differs from the
/// reference's.
fn poison_pool(g: &jet_kernels::cuda::Gpu, bytes: usize) {
    let mut b = g.zeros::<u8>(bytes).unwrap();
    g.write(&mut b, &vec![0xa5u8; bytes]).unwrap();
}

/// No atomics: the forward and backward give the same bits twice (the backward
/// of every build this GPU has).
#[test]
fn flash_is_deterministic() {
    let Some(g) = gpu() else { return };
    let c = &CASES[1];
    let sh = c.shape;
    let rows: usize = c.seqs.iter().sum();
    let (qw, kvw) = (sh.n_heads * sh.head_dim, sh.n_kv_heads * sh.head_dim);
    let (q, k, v, dout) = (
        up(&g, &rnd(rows * qw, 300, 1.5)),
        up(&g, &rnd(rows * kvw, 301, 1.5)),
        up(&g, &rnd(rows * kvw, 302, 1.5)),
        up(&g, &rnd(rows * qw, 303, 1.0)),
    );
    let plan = FlashPlan::new(&g, c.seqs).unwrap();
    let mut builds = vec![flash::BwdKernel::MmaSync];
    if g.wgmma() {
        builds.push(flash::BwdKernel::Wgmma);
    }
    for build in builds {
        let run = || {
            let (o, saved) = flash::flash_forward(&g, &plan, &q, &k, &v, sh).unwrap();
            let (a, b, d) =
                flash::flash_backward_with(&g, &plan, &dout, &o, &saved, sh, build).unwrap();
            [o, a, b, d].map(|x| g.download(&x).unwrap())
        };
        let (first, second) = (run(), run());
        let n: usize = first
            .iter()
            .zip(&second)
            .map(|(a, b)| bits_differ(a, b))
            .sum();
        report_exact(
            "flash fwd+bwd twice",
            &format!("{}, {build:?}", label(c)),
            n,
        );
    }
    done();
}

/// Shapes the kernels do not take are refused with a message, never launched.
#[test]
fn flash_refuses_other_head_dims() {
    let bad = AttnShape {
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 32,
    };
    assert!(!flash::flash_supported(bad));
    assert!(!flash::flash_supported(AttnShape {
        n_heads: 34,
        n_kv_heads: 2,
        head_dim: 128
    }));
    assert!(flash::flash_supported(CASES[1].shape));
    let Some(g) = gpu() else { return };
    let plan = FlashPlan::new(&g, &[3]).unwrap();
    let x = up(&g, &[0.0; 3 * 4 * 32]);
    let Err(e) = flash::flash_forward(&g, &plan, &x, &x, &x, bad) else {
        panic!("head_dim 32 was accepted");
    };
    assert!(e.to_string().contains("head_dim 64 or 128"), "{e}");
}
