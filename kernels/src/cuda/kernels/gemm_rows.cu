// The batch-invariant forward GEMM for any number of tokens (training forward,
// prefill, large decode batches): d [M][N] = x [M, K] w [N, K]^T with the per-output
// arithmetic of the split-K decode kernel (`gemm_sk`, gemv_fp8.cu): the same mma
// steps a group (fp8_half_mma / bf16_quarter_mma in common.cuh), the group sums of
// a split slice chained from zero (FP8: scaled, acc = fma(xs*ws, part, acc)), and
// the slices added in order, the first taken as is. A row's bits are then the same
// whichever kernel and batch computed it (rollout == training).
//
// Block: 256 threads = 8 warps, 128 weight rows x 128 tokens; grid (ceil(M/128),
// ceil(N/128)). Warp w: rows 32 (w & 3) .. +32 (two m16 tiles) x tokens 64 (w >> 2)
// .. +64 (eight n8 tiles), so each fragment read from shared memory feeds two or
// eight mma (shared-memory bandwidth is what bounds a mma.sync GEMM here: NOTES.md).
// Each block walks all K groups: acc restarts every gps groups and tot = slice0,
// tot += slice1, ... is the split-K launch's in-order sum of its partials.
//
// Operands stream through S shared-memory stages by cp.async (a group's W tile
// 128 x GB bytes, X tile 128 x GB bytes, and the FP8 token scales), S - 1 groups in
// flight. W and X rows are GB bytes apart with their 16-byte units swizzled (unit u
// of row r at u ^ 4(r & 1)), so a quarter warp's 16-byte reads (rows gid = 0, 1,
// units tig = 0..3) hit distinct banks.
//
// FP8: sm_90 has no e4m3 mma.sync (ptxas converts both operands to f16 around each
// mma, 16 conversions a clock an SM: that bound the first rows kernel, every warp
// converting the whole token tile). Here the block converts each group's token tile
// to f16 once (xh, double-buffered, rows XHS bytes apart), and a warp converts only
// its own weight rows.

// Bytes between f16 token rows of xh: 256 + 16, so the 16-byte reads of a quarter
// warp (tokens gid = 0, 1 at 32-byte steps) fall in distinct banks.
#define XHS 272

// E4M3 codes, 128x128 weight blocks and 1x128 token scales; 4 stages.
struct Fp8R {
    static constexpr int GB = 128, S = 4;  // bytes of a row's group; stages
    static constexpr bool FP8 = true;
};
// BF16 values, no scales; 3 stages.
struct Bf16R {
    static constexpr int GB = 256, S = 3;
    static constexpr bool FP8 = false;
};

// Shared memory: S stages of [W tile | X tile | 128 token scales], then (FP8) two
// f16 token tiles. gemv.rs `RowsKernel::smem_bytes` repeats BYTES.
template <class C>
struct RowsSmem {
    static constexpr int W = 128 * C::GB, X = 128 * C::GB, STAGE = W + X + 128 * 4;
    static constexpr int XH = C::FP8 ? 128 * XHS : 0;
    static constexpr int BYTES = C::S * STAGE + 2 * XH;
};

__device__ __forceinline__ uint4 lds128(u32 a) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}

// The byte offset of 16-byte unit u of row r in a swizzled tile of GB-byte rows.
template <int GB>
__device__ __forceinline__ int swz(int r, int u) {
    return r * GB + ((u ^ ((r & 1) << 2)) << 4);
}

// w [N_pad][K_pad] and x [M][K_pad] values (row strides K_pad bytes for FP8, 2 K_pad
// for BF16); ws [ceil(N/128)][lds], xs [L][ldxs] the FP8 scales (unused for BF16).
// Output: the fused linear epilogue when y != null (fuses linear_epilogue: the total,
// then the bias, then the BF16 rounding when `round`, then + res [M][ldy] when not
// null) into y [M][ldy], else the totals into d [M][ldd].
template <class C>
__device__ void gemm_rows(const u8* __restrict__ w, const float* __restrict__ ws, int lds,
                          const u8* __restrict__ x, const float* __restrict__ xs, int ldxs,
                          float* __restrict__ d, long ldd, int M, int N, int N_pad, int K_pad, int gps,
                          float* __restrict__ y, long ldy, const float* __restrict__ bias, int round,
                          const float* __restrict__ res) {
    using SM = RowsSmem<C>;
    constexpr int GB = C::GB, S = C::S, UPR = GB / 16;
    extern __shared__ __align__(128) u8 smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int n0 = blockIdx.y * 128, t0 = blockIdx.x * 128;
    const int L = (K_pad + 127) / 128;
    const long RB = (long)K_pad * (GB / 128);  // bytes of a row
    x += (long)t0 * RB;
    if (C::FP8) xs += t0;
    M = min(M - t0, 128);

    // Start copying group g into stage g % S (all threads; one commit group). A
    // thread copies unit cu of rows cr + i * RSTEP (RSTEP even: one swizzle for all);
    // W rows past N_pad and X rows past M are zero-filled (a copy of size 0 reads
    // nothing at its source address).
    constexpr int RSTEP = 256 / UPR;
    const int cu = threadIdx.x % UPR, cr = threadIdx.x / UPR;
    const u8* wsrc = w + (long)(n0 + cr) * RB + cu * 16;
    const u8* xsrc = x + (long)cr * RB + cu * 16;
    const int sdst = swz<GB>(cr, cu);
    auto load = [&](int g) {
        if (g < L) {
            u8* st = smem + (g % S) * SM::STAGE + sdst;
            const long off = (long)g * GB;
            const bool kin = off + cu * 16 < RB;
#pragma unroll
            for (int i = 0; i < 128 / RSTEP; i++) {
                bool ok = kin && n0 + cr + i * RSTEP < N_pad;
                cp16(st + i * RSTEP * GB, wsrc + i * RSTEP * RB + off, ok);
            }
#pragma unroll
            for (int i = 0; i < 128 / RSTEP; i++) {
                bool ok = kin && cr + i * RSTEP < M;
                cp16(st + SM::W + i * RSTEP * GB, xsrc + i * RSTEP * RB + off, ok);
            }
            if (C::FP8 && threadIdx.x < 128) {
                bool ok = threadIdx.x < M;
                cp4(smem + (g % S) * SM::STAGE + SM::W + SM::X + threadIdx.x * 4,
                    xs + (ok ? (long)g * ldxs + threadIdx.x : 0), ok);
            }
        }
        cp_commit();
    };
    // FP8: the token tile of group g (stage g % S) as f16 into xh[g & 1]; each
    // thread four 16-byte units -> 32 bytes each. The f16 words of a unit are stored in
    // the order 0 2 1 3 4 6 5 7, so the two B words of each mma step (s*4 + j,
    // s*4 + 2 + j: fp8_half_mma) come as an adjacent register pair.
    auto convert = [&](int g) {
        if (C::FP8 && g < L) {
            const u8* xt = smem + (g % S) * SM::STAGE + SM::W;
            u8* xh = smem + S * SM::STAGE + (g & 1) * SM::XH;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int c = threadIdx.x + i * 256, r = c >> 3, u = c & 7;
                uint4 v = *reinterpret_cast<const uint4*>(xt + swz<GB>(r, u));
                uint4 lo = make_uint4(e4m3x2_f16x2(v.x, 0), e4m3x2_f16x2(v.y, 0), e4m3x2_f16x2(v.x, 1),
                                      e4m3x2_f16x2(v.y, 1));
                uint4 hi = make_uint4(e4m3x2_f16x2(v.z, 0), e4m3x2_f16x2(v.w, 0), e4m3x2_f16x2(v.z, 1),
                                      e4m3x2_f16x2(v.w, 1));
                *reinterpret_cast<uint4*>(xh + r * XHS + u * 32) = lo;
                *reinterpret_cast<uint4*>(xh + r * XHS + u * 32 + 16) = hi;
            }
        }
    };

    float acc[2][8][4], tot[2][8][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int tt = 0; tt < 8; tt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][tt][i] = tot[mt][tt][i] = 0.0f;
    // This thread's weight rows r0 + 16 mt (+ 8) and tokens tk + 8 tt: all of
    // swizzle parity par, so unit h*4 + tig of a row sits at ((h ^ par)*4 + tig)*16.
    const int r0 = (warp & 3) * 32 + gid, tk = (warp >> 2) * 64 + gid, par = gid & 1;
    const u32 sbase = smem_addr(smem), wa = r0 * GB + tig * 16;
    const float* wsr = ws + (C::FP8 ? (long)(n0 / 128) * lds : 0);

#pragma unroll
    for (int s = 0; s < S - 1; s++) load(s);
    if (C::FP8) {
        cp_wait<S - 2>();  // group 0 has landed
        __syncthreads();
        convert(0);
    }
    int fold_at = gps;
    for (int g = 0; g < L; g++) {
        // Group g (FP8: and g + 1, for its conversion) has landed, and every thread
        // is done with group g - 1's stage (and FP8: with xh[(g + 1) & 1]).
        if (C::FP8)
            cp_wait<S - 3>();
        else
            cp_wait<S - 2>();
        __syncthreads();
        load(g + S - 1);  // into the stage of group g - 1
        convert(g + 1);
        const u32 st = sbase + (g % S) * SM::STAGE;
        if constexpr (C::FP8) {
            // The weight words of the whole group (both m16 tiles, both halves),
            // then token tile by token tile: each tile's group sums from zero, then
            // acc += (x scale * w scale) * sum.
            u32 aw[2][2][16];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const u32 wp = st + wa + mt * 16 * GB + ((h ^ par) << 6);
                    fp8_a_words(aw[mt][h], lds128(wp), lds128(wp + 8 * GB));
                }
            const u32 xh = sbase + S * SM::STAGE + (g & 1) * SM::XH + tk * XHS + tig * 32;
            const float* sx = reinterpret_cast<const float*>(smem + (g % S) * SM::STAGE + SM::W + SM::X);
            const float sw = wsr[g];
#pragma unroll
            for (int tt = 0; tt < 8; tt++) {
                float part[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) part[mt][i] = 0.0f;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const u32 xp = xh + tt * 8 * XHS + h * 128;
                    uint4 lo = lds128(xp), hi = lds128(xp + 16);
                    const u32 xw[8] = {lo.x, lo.z, lo.y, lo.w, hi.x, hi.z, hi.y, hi.w};
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) fp8_half_mma(part[mt], aw[mt][h], xw);
                }
                const int tok = tk - gid + tt * 8 + tig * 2;
                float s0 = sx[tok] * sw, s1 = sx[tok + 1] * sw;
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    acc[mt][tt][0] = __fmaf_rn(s0, part[mt][0], acc[mt][tt][0]);
                    acc[mt][tt][1] = __fmaf_rn(s1, part[mt][1], acc[mt][tt][1]);
                    acc[mt][tt][2] = __fmaf_rn(s0, part[mt][2], acc[mt][tt][2]);
                    acc[mt][tt][3] = __fmaf_rn(s1, part[mt][3], acc[mt][tt][3]);
                }
            }
        } else {
#pragma unroll
            for (int h = 0; h < 4; h++) {
                uint4 wv[2][2];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const u32 wp = st + wa + mt * 16 * GB + ((h ^ par) << 6);
                    wv[mt][0] = lds128(wp);
                    wv[mt][1] = lds128(wp + 8 * GB);
                }
                const u32 xp = st + SM::W + tk * GB + tig * 16 + ((h ^ par) << 6);
#pragma unroll
                for (int tt = 0; tt < 8; tt++) {
                    uint4 xb = lds128(xp + tt * 8 * GB);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) bf16_quarter_mma(acc[mt][tt], wv[mt][0], wv[mt][1], xb);
                }
            }
        }
        if (g + 1 == fold_at || g + 1 == L) {
            fold_slice<64>(&tot[0][0][0], &acc[0][0][0], g < gps);
            fold_at += gps;
        }
    }
    cp_wait<0>();  // no copy in flight at exit (the last loads were empty groups)

#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int tt = 0; tt < 8; tt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int row = n0 + r0 + mt * 16 + (i >= 2 ? 8 : 0);
                int tok = tk - gid + tt * 8 + tig * 2 + (i & 1);
                if (row < N && tok < M) rows_out(tot[mt][tt][i], row, t0 + tok, d, ldd, y, ldy, bias, round, res);
            }
}

#define GEMM_ROWS(NAME, C) ROWS_KERNEL(NAME, gemm_rows<C>)
GEMM_ROWS(gemm_fp8_rows, Fp8R)
GEMM_ROWS(gemm_bf16_rows, Bf16R)
