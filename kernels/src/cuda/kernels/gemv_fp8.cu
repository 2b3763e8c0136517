// Decode-sized FP8 GEMM (M <= 64 tokens), reading the E4M3 weight bytes directly:
//
//   d[m, n] = sum_g (xs[g][m] * ws[n/128][g]) * sum_{k in group g} x[m, k] * w[n, k]
//
// the definition of fp8::fp8_gemm. Layouts are the ones the quantizer writes for
// cuBLASLt: w [N_pad][K_pad] codes with BLK128x128 scales ws [ceil(N/128)][lds];
// x [M_pad][K_pad] codes with VEC128 scales xs [L][ldxs]; d row-major with stride ldd.
//
// Tensor cores through mma.sync m16n8k32 e4m3 (sm_89+): A = 16 weight rows, B = 8
// tokens, f32 accumulators. The k order inside a group does not change the sum, so
// thread (gid, tig) loads 16 contiguous bytes of its weight rows and of its token
// at k = g*128 + h*64 + tig*16 and feeds them as the k-slots it owns in A and B:
// bytes 0-3 / 4-7 are slots tig*4.. / 16+tig*4.. of the first k32 step, bytes
// 8-15 the same slots of the second. A and B use the same permutation of k.
//
// A block of WK warps owns MT*16 weight rows (MT m16 tiles); its warps take the K
// groups round-robin, so each weight byte is read once, and their partial sums are
// added in warp order at the end (deterministic). TT = token tiles of 8.

__device__ __forceinline__ void mma_e4m3(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 ld_stream(const u8* p) {
    return __ldcs(reinterpret_cast<const uint4*>(p));
}

template <int TT, int WK, int MT>
__device__ void gemv_fp8(const u8* __restrict__ w, const float* __restrict__ ws, int lds,
                         const u8* __restrict__ x, const float* __restrict__ xs, int ldxs,
                         float* __restrict__ d, long ldd, int M, int N, int N_pad, int K_pad) {
    __shared__ float red[WK][MT * TT * 4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int n0 = blockIdx.x * (MT * 16);
    const int L = (K_pad + 127) / 128;

    const u8* wr[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
            wr[mt][hh] = w + (long)min(n0 + mt * 16 + hh * 8 + gid, N_pad - 1) * K_pad;
    const u8* xr[TT];
    bool xin[TT];
#pragma unroll
    for (int tt = 0; tt < TT; tt++) {
        int tok = tt * 8 + gid;
        xin[tt] = tok < M;
        xr[tt] = x + (long)(xin[tt] ? tok : 0) * K_pad;
    }
    const float* wsr = ws + (long)(n0 / 128) * lds;

    float acc[MT][TT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][tt][i] = 0.0f;

    // Weight bytes of one group (both 64-byte halves): the HBM stream. With few
    // tokens (PF) the next group's bytes are requested before this group's mma,
    // so two groups per warp are in flight; with 8 token tiles the registers are
    // needed for accumulators.
    constexpr bool PF = TT <= 4;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    auto load_w = [&](int g, uint4 (&a)[2][MT][2]) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int k = g * 128 + h * 64 + tig * 16;
            bool in = g < L && k < K_pad;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) a[h][mt][hh] = in ? ld_stream(wr[mt][hh] + k) : zero;
        }
    };
    uint4 a[2][MT][2];
    if (PF) load_w(warp, a);
    for (int g = warp; g < L; g += WK) {
        uint4 an[2][MT][2];
        if (PF) load_w(g + WK, an);
        else load_w(g, a);
        // Scales of this group, requested before the mma too.
        float sw = wsr[g];
        float sx[TT][2];
#pragma unroll
        for (int tt = 0; tt < TT; tt++) {
            int t0 = tt * 8 + tig * 2;
            sx[tt][0] = t0 < M ? xs[(long)g * ldxs + t0] : 0.0f;
            sx[tt][1] = t0 + 1 < M ? xs[(long)g * ldxs + t0 + 1] : 0.0f;
        }
        float part[MT][TT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
#pragma unroll
                for (int i = 0; i < 4; i++) part[mt][tt][i] = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int k = g * 128 + h * 64 + tig * 16;
            uint4 b[TT];
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                b[tt] = (k < K_pad && xin[tt]) ? *reinterpret_cast<const uint4*>(xr[tt] + k) : zero;
#pragma unroll
            for (int s = 0; s < 2; s++)
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    u32 a0 = s ? a[h][mt][0].z : a[h][mt][0].x;
                    u32 a2 = s ? a[h][mt][0].w : a[h][mt][0].y;
                    u32 a1 = s ? a[h][mt][1].z : a[h][mt][1].x;
                    u32 a3 = s ? a[h][mt][1].w : a[h][mt][1].y;
#pragma unroll
                    for (int tt = 0; tt < TT; tt++) {
                        u32 b0 = s ? b[tt].z : b[tt].x;
                        u32 b1 = s ? b[tt].w : b[tt].y;
                        mma_e4m3(part[mt][tt], a0, a1, a2, a3, b0, b1);
                    }
                }
        }
        // Accumulator i holds row gid (+8 for i >= 2) and token tig*2 + (i & 1):
        // y += (x scale * w scale) * group sum, as fp8_gemm.
#pragma unroll
        for (int tt = 0; tt < TT; tt++) {
            float s0 = sx[tt][0] * sw, s1 = sx[tt][1] * sw;
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                acc[mt][tt][0] += s0 * part[mt][tt][0];
                acc[mt][tt][1] += s1 * part[mt][tt][1];
                acc[mt][tt][2] += s0 * part[mt][tt][2];
                acc[mt][tt][3] += s1 * part[mt][tt][3];
            }
        }
        if (PF) {
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) a[h][mt][hh] = an[h][mt][hh];
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp][(mt * TT + tt) * 4 + i][lane] = acc[mt][tt][i];
    __syncthreads();
    for (int idx = threadIdx.x; idx < MT * TT * 4 * 32; idx += WK * 32) {
        int slot = idx >> 5, ln = idx & 31;
        float v = red[0][slot][ln];
        for (int ww = 1; ww < WK; ww++) v += red[ww][slot][ln];
        int mt = slot / (TT * 4), tt = (slot >> 2) % TT, i = slot & 3;
        int row = n0 + mt * 16 + (ln >> 2) + (i >= 2 ? 8 : 0);
        int tok = tt * 8 + (ln & 3) * 2 + (i & 1);
        if (row < N && tok < M) d[(long)tok * ldd + row] = v;
    }
}

#define GEMV(TT, WK, MT)                                                                          \
    extern "C" __global__ void __launch_bounds__(WK * 32)                                         \
        gemv_fp8_t##TT##_w##WK##_m##MT(const u8* w, const float* ws, int lds, const u8* x,        \
                                       const float* xs, int ldxs, float* d, long ldd, int M,      \
                                       int N, int N_pad, int K_pad) {                             \
        pdl_entry();                                                                              \
        gemv_fp8<TT, WK, MT>(w, ws, lds, x, xs, ldxs, d, ldd, M, N, N_pad, K_pad);                \
    }
GEMV(1, 8, 2)
GEMV(2, 8, 2)
GEMV(4, 8, 2)
GEMV(8, 4, 2)
GEMV(8, 8, 1)

// ---- split-K version with the token tile in shared memory ------------------------
// One template for the FP8 and the BF16 forward GEMM (E = Fp8E or Bf16E): the two
// precisions share the split design, so in both a row's products are added in one
// order whichever kernel and batch computed it.
//
// Block = 4 warps = 64 weight rows (warp w: rows n0 + 16w .. +16, one m16 tile);
// grid (ceil(N/64), KS, token chunks): block (bx, ks, c) takes the K groups
// [ks*gps, (ks+1)*gps) and writes its partial sums to p[ks][token][n] (stride ldp,
// slices sstride apart); the slices are added in ks order afterwards (splitk_sum or
// the linear epilogue), so the result is deterministic and a token's row never
// depends on the others. The token values of a group (TT*8 rows x E::GB bytes) are
// staged in shared memory once per block (rows GB + 64 bytes apart: the 16-byte
// reads of a quarter warp hit distinct banks), double-buffered; the weight bytes
// stream from HBM with the next group's requested before this group's mma.
// (Holding a whole chunk of groups in flight instead measured slower: NOTES.md.)
//
// A group is 128 values of k: 128 E4M3 bytes (two 64-byte halves of four k16 f16
// mma steps each, fp8_half_mma, chained from zero over the group, then scaled:
// y = fma(xs * ws, group sum, y), the terms of fp8_gemm) or 256 BF16 bytes (four
// 64-byte quarters of two k16 steps, bf16_quarter_mma, chained straight into the
// f32 accumulator, no scales). Thread (gid, tig) loads 16 bytes at offset tig*16
// of each 64-byte part of its weight rows and token. The rows kernels
// (gemm_rows.cu) repeat this arithmetic and the split order for any number of
// tokens, so a row's bits do not depend on which kernel computed it.

// E4M3 codes, 128x128 weight blocks and 1x128 token scales.
struct Fp8E {
    static constexpr int GB = 128;  // bytes of a row in a 128-value group
    static constexpr bool SCALED = true;
};
// BF16 values, no scales.
struct Bf16E {
    static constexpr int GB = 256;
    static constexpr bool SCALED = false;
};

// w [N_pad][K_pad] and x [M][K_pad] values of E (row strides K_pad * sizeof);
// ws, xs the FP8 scales (unused for BF16).
template <class E, int TT>
__device__ void gemm_sk(const u8* __restrict__ w, const float* __restrict__ ws, int lds,
                        const u8* __restrict__ x, const float* __restrict__ xs, int ldxs,
                        float* __restrict__ p, long ldp, long sstride, int M, int N, int N_pad,
                        int K_pad, int gps) {
    constexpr int WN = 4, GB = E::GB, H = GB / 64, XS = GB + 64, NT = WN * 32;
    static_assert(NT >= TT * 8, "one thread per token loads the token scales");
    __shared__ __align__(16) u8 xt[2][TT * 8 * XS];
    __shared__ float sxs[2][E::SCALED ? TT * 8 : 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int n0 = blockIdx.x * (WN * 16);
    const int L = (K_pad + 127) / 128;
    const long RB = (long)K_pad * (GB / 128);  // bytes of a row
    // This block's chunk of TT*8 tokens (grid z).
    const int t0 = blockIdx.z * (TT * 8);
    x += (long)t0 * RB;
    xs += E::SCALED ? t0 : 0;
    p += (long)t0 * ldp;
    M = min(M - t0, TT * 8);
    const int g0 = blockIdx.y * gps, g1 = min(L, g0 + gps);
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    const u8* wr0 = w + (long)min(n0 + warp * 16 + gid, N_pad - 1) * RB;
    const u8* wr1 = w + (long)min(n0 + warp * 16 + gid + 8, N_pad - 1) * RB;
    const float* wsr = ws + (E::SCALED ? (long)(n0 / 128) * lds : 0);

    constexpr int CPR = GB / 16;       // 16-byte chunks of a token's group
    constexpr int XCH = TT * 8 * CPR;  // ... of a token tile
    constexpr int XPT = (XCH + NT - 1) / NT;
    auto load_x = [&](int g, uint4 (&r)[XPT], float& sc) {
#pragma unroll
        for (int i = 0; i < XPT; i++) {
            int c = threadIdx.x + i * NT, tok = c / CPR;
            long b = (long)g * GB + (c % CPR) * 16;
            r[i] = (c < XCH && tok < M && b < RB) ? *reinterpret_cast<const uint4*>(x + tok * RB + b) : zero;
        }
        sc = E::SCALED && threadIdx.x < TT * 8 && threadIdx.x < M ? xs[(long)g * ldxs + threadIdx.x] : 0.0f;
    };
    auto store_x = [&](int b, const uint4 (&r)[XPT], float sc) {
#pragma unroll
        for (int i = 0; i < XPT; i++) {
            int c = threadIdx.x + i * NT;
            if (c < XCH) *reinterpret_cast<uint4*>(&xt[b][(c / CPR) * XS + (c % CPR) * 16]) = r[i];
        }
        if (E::SCALED && threadIdx.x < TT * 8) sxs[b][threadIdx.x] = sc;
    };
    auto load_w = [&](int g, uint4 (&a)[H][2]) {
#pragma unroll
        for (int h = 0; h < H; h++) {
            long b = (long)g * GB + h * 64 + tig * 16;
            bool in = g < g1 && b < RB;
            a[h][0] = in ? ld_stream(wr0 + b) : zero;
            a[h][1] = in ? ld_stream(wr1 + b) : zero;
        }
    };

    float acc[TT][4];
#pragma unroll
    for (int tt = 0; tt < TT; tt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[tt][i] = 0.0f;
    if (g0 < g1) {
        uint4 xr[XPT], a[H][2], an[H][2];
        float sc;
        load_x(g0, xr, sc);
        load_w(g0, a);
        store_x(0, xr, sc);
        __syncthreads();
        // Group g with its weight fragments in `cur`, the next group's requested
        // into `nxt` (the loop below runs two groups an iteration with the roles
        // swapped, so no register copies between groups).
        auto step = [&](int g, const uint4 (&cur)[H][2], uint4 (&nxt)[H][2]) {
            const int b = (g - g0) & 1;
            load_w(g + 1, nxt);
            if (g + 1 < g1) load_x(g + 1, xr, sc);
            if constexpr (E::SCALED) {
                // The group's sums from zero, then y += (x scale * w scale) * sum
                // (fp8_gemm's terms, one fma).
                float part[TT][4];
#pragma unroll
                for (int tt = 0; tt < TT; tt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) part[tt][i] = 0.0f;
#pragma unroll
                for (int h = 0; h < H; h++) {
                    u32 aw[16];
                    fp8_a_words(aw, cur[h][0], cur[h][1]);
#pragma unroll
                    for (int tt = 0; tt < TT; tt++) {
                        uint4 bb = *reinterpret_cast<const uint4*>(&xt[b][(tt * 8 + gid) * XS + h * 64 + tig * 16]);
                        const u32 xw[8] = {e4m3x2_f16x2(bb.x, 0), e4m3x2_f16x2(bb.x, 1), e4m3x2_f16x2(bb.y, 0),
                                           e4m3x2_f16x2(bb.y, 1), e4m3x2_f16x2(bb.z, 0), e4m3x2_f16x2(bb.z, 1),
                                           e4m3x2_f16x2(bb.w, 0), e4m3x2_f16x2(bb.w, 1)};
                        fp8_half_mma(part[tt], aw, xw);
                    }
                }
                float sw = wsr[g];
#pragma unroll
                for (int tt = 0; tt < TT; tt++) {
                    float s0 = sxs[b][tt * 8 + tig * 2] * sw, s1 = sxs[b][tt * 8 + tig * 2 + 1] * sw;
                    acc[tt][0] = __fmaf_rn(s0, part[tt][0], acc[tt][0]);
                    acc[tt][1] = __fmaf_rn(s1, part[tt][1], acc[tt][1]);
                    acc[tt][2] = __fmaf_rn(s0, part[tt][2], acc[tt][2]);
                    acc[tt][3] = __fmaf_rn(s1, part[tt][3], acc[tt][3]);
                }
            } else {
#pragma unroll
                for (int h = 0; h < H; h++)
#pragma unroll
                    for (int tt = 0; tt < TT; tt++) {
                        uint4 bb = *reinterpret_cast<const uint4*>(&xt[b][(tt * 8 + gid) * XS + h * 64 + tig * 16]);
                        bf16_quarter_mma(acc[tt], cur[h][0], cur[h][1], bb);
                    }
            }
            if (g + 1 < g1) store_x(b ^ 1, xr, sc);
            __syncthreads();
        };
        for (int g = g0; g < g1; g += 2) {
            step(g, a, an);
            if (g + 1 < g1) step(g + 1, an, a);
        }
    }
    float* out = p + (long)blockIdx.y * sstride;
#pragma unroll
    for (int tt = 0; tt < TT; tt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = n0 + warp * 16 + gid + (i >= 2 ? 8 : 0);
            int tok = tt * 8 + tig * 2 + (i & 1);
            if (row < N && tok < M) out[(long)tok * ldp + row] = acc[tt][i];
        }
}

// NAME(element, token tiles, min blocks per SM). Blocks of 64 weight rows (4 warps):
// at decode sizes a GEMM of a few MB has to spread over every SM to stream at HBM
// speed (128-row blocks left 16-48 blocks for 132 SMs and took ~9 us whatever the
// size: NOTES.md).
#define GEMM_SK(NAME, E, TT, MINB) SK_KERNEL(NAME, (128, MINB), gemm_sk<E, TT>)
GEMM_SK(gemv_fp8_sk_t1, Fp8E, 1, 4)
GEMM_SK(gemv_fp8_sk_t2, Fp8E, 2, 4)
GEMM_SK(gemv_fp8_sk_t4, Fp8E, 4, 2)
GEMM_SK(gemv_fp8_sk_t8, Fp8E, 8, 2)
GEMM_SK(gemv_bf16_sk_t1, Bf16E, 1, 4)
GEMM_SK(gemv_bf16_sk_t2, Bf16E, 2, 4)
GEMM_SK(gemv_bf16_sk_t4, Bf16E, 4, 2)
GEMM_SK(gemv_bf16_sk_t8, Bf16E, 8, 2)

// y [rows, cols] (stride ldy) = sum over s < splits, in order, of p[s] (stride ldp).
extern "C" __global__ void splitk_sum(const float* p, long ldp, long sstride, int splits, int rows, int cols,
                                      float* y, long ldy) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)rows * cols) return;
    int r = (int)(i / cols), c = (int)(i % cols);
    float v = p[(long)r * ldp + c];
    for (int s = 1; s < splits; s++) v += p[s * sstride + (long)r * ldp + c];
    y[(long)r * ldy + c] = v;
}
