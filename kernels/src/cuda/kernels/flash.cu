// Causal GQA attention on tensor cores (FlashAttention-2 style), head_dim 64 or 128:
// the training forward over packed sequences, its backward, and the decode step
// against a KV cache. Reference: ops/attention.rs (attend_row, attention_backward).
//
// Numerics: q, k, v, dout arrive as f32 and are rounded to BF16 (RNE) when a tile
// is staged in shared memory; products run on mma.sync m16n8k16 (BF16 in, f32
// accumulate); the softmax runs in f32 in the log2 domain with an online max;
// P is rounded to BF16 for the P.V product. Outputs and gradients are f32.
//
// Batch invariance (why decode equals training bit for bit): a query row's result
// is a function of its own q, its position and the key/value tiles 0..pos/64 only.
// mma.sync computes each output element from its own row and column, so which
// other rows share the warp's 16-row tile does not matter; every tile of 64 keys
// is processed by the one device function fa_tile, in the same order, with keys
// past the row's position masked to p = 0 exactly. A tile that is masked whole
// for a row (the training forward runs a warp's tiles up to its last row) is an
// exact no-op: alpha = 2^0 = 1, p = 0, and the staged values are finite.
//
// Training grids are one-dimensional, block b = (tile b / heads, head b % heads),
// over the plan's tiles ordered most work first (FlashPlan): under causal masking a
// tile's work ranges from 1 to L / 64 key tiles, and the largest started last would
// set the end of the launch. Which CTA runs when does not change any result.
//
// Backward without atomics: dK, dV per 64-key tile (looping over the group's query
// heads, then query sub-tiles, in order) in one kernel; dQ per 64-row tile
// (looping over key tiles) in another. Deterministic run to run.

#define FA_BR 64     // query rows per CTA (4 warps x 16)
#define FA_BC 64     // keys per tile
#define FA_BQ 32     // query rows per step of the dK/dV kernel
#define FA_NEG_INF (-__int_as_float(0x7f800000))
#ifndef FA_O16_STAGE
#define FA_O16_STAGE 1  // fa_finish's o16 through shared memory (0: its direct 4-byte stores)
#endif

__device__ __forceinline__ void ldsm_x4(u32& r0, u32& r1, u32& r2, u32& r3, const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x4_t(u32& r0, u32& r1, u32& r2, u32& r3, const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
}

// c[16x8] += a[16x16] b[16x8]
__device__ __forceinline__ void mma_bf16(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Stage rows [0, NROWS) of a f32 matrix (row stride `ld` floats, D columns) as
// BF16 in shared memory [NROWS][D + 8]; rows >= nvalid are zero. All NT threads
// (the decode kernel's one warp): thread t takes float4 t % V4 of rows t / V4 +
// i * (NT / V4).
template <int D, int NROWS, int NT>
__device__ __forceinline__ void stage(bf16_t* s, const float* g, long ld, int nvalid) {
    constexpr int V4 = D / 4, RS = NT / V4;
    static_assert(NT % V4 == 0 && NROWS % RS == 0, "stage: whole rows an iteration");
    const int r0 = threadIdx.x / V4, c = (threadIdx.x % V4) * 4;
#pragma unroll
    for (int r = r0, i = 0; i < NROWS / RS; i++, r += RS) {
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < nvalid) x = *(const float4*)(g + (long)r * ld + c);
        u32* d = (u32*)(s + r * (D + 8) + c);
        d[0] = pack_bf16x2(x.x, x.y);
        d[1] = pack_bf16x2(x.z, x.w);
    }
}

// Start copying rows [0, NROWS) of a BF16 matrix (row stride `ld` values, D
// columns) into shared memory [NROWS][D + 8]; rows >= nvalid become zero. The same
// values stage() makes from the f32 originals. All NT threads of the block (128,
// or the decode kernel's one warp); then cp_commit.
// Thread t copies chunk t % C of rows t / C + it * (NT / C): its addresses are one
// base each and constant strides (the index arithmetic per copy was most of the
// one-warp decode kernel's instructions).
template <int D, int NROWS, int NT = 128>
__device__ __forceinline__ void stage16(bf16_t* s, const bf16_t* g, long ld, int nvalid) {
    constexpr int C = D / 8, RS = NT / C;  // 16-byte chunks per row; rows an iteration
    static_assert(NT % C == 0 && NROWS % RS == 0, "stage16: whole rows an iteration");
    const int r0 = threadIdx.x / C, c = (threadIdx.x % C) * 8;
    u32 sa = smem_addr(s + r0 * (D + 8) + c);
    const bf16_t* ga = g + (long)r0 * ld + c;
    const long gstep = (long)RS * ld;
    int r = r0;
#pragma unroll 8
    for (int it = 0; it < NROWS / RS; it++) {
        cp16_at(sa, r < nvalid ? ga : g, r < nvalid);
        sa += RS * (D + 8) * 2;
        ga += gstep;
        r += RS;
    }
}

// Double-buffered key/value tiles in sb [2][K, V] ([FA_BC][D + 8] each), rows of
// kb, vb (stride kvw) up to L: start copying tile j + 1 into its buffer and wait
// for tile j (on the last tile, for everything). All threads; a __syncthreads must
// follow before tile j is read.
template <int D>
__device__ __forceinline__ void kv_next(bf16_t* sb, const bf16_t* kb, const bf16_t* vb, long kvw, int j,
                                        int ntiles, int L) {
    const int T = FA_BC * (D + 8);
    if (j + 1 < ntiles) {
        bf16_t* nxt = sb + ((j + 1) & 1) * 2 * T;
        long off = (long)(j + 1) * FA_BC * kvw;
        int nk = min(FA_BC, L - (j + 1) * FA_BC);
        stage16<D, FA_BC>(nxt, kb + off, kvw, nk);
        stage16<D, FA_BC>(nxt + T, vb + off, kvw, nk);
        cp_commit();
        cp_wait<1>();
    } else {
        cp_wait<0>();
    }
}

// fa_to_bf16_x3: x (f32) -> y (BF16, RNE) for q, k and v in one launch (blockIdx.y
// picks the tensor; n_i multiples of 4): the operand copies of the tensor-core
// attention, the same rounding stage() applies. Four float4 loads in flight a
// thread (three launches of one load at a time ran at about 1 TB/s).
struct ToBf16x3 {
    const float* x[3];
    bf16_t* y[3];
    long n[3];
};
extern "C" __global__ void fa_to_bf16_x3(ToBf16x3 t) {
    pdl_entry();
    // Picked by value (an index into the parameter arrays would copy them to the stack).
    const int b = blockIdx.y;
    const float* x = b == 0 ? t.x[0] : b == 1 ? t.x[1] : t.x[2];
    bf16_t* y = b == 0 ? t.y[0] : b == 1 ? t.y[1] : t.y[2];
    const long n = b == 0 ? t.n[0] : b == 1 ? t.n[1] : t.n[2], stride = (long)gridDim.x * blockDim.x * 4;
    for (long i0 = (blockIdx.x * (long)blockDim.x + threadIdx.x) * 4; i0 < n; i0 += 4 * stride) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const long i = i0 + u * stride;
            if (i < n) v[u] = *(const float4*)(x + i);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const long i = i0 + u * stride;
            if (i < n) *(uint2*)(y + i) = make_uint2(pack_bf16x2(v[u].x, v[u].y), pack_bf16x2(v[u].z, v[u].w));
        }
    }
}

// A-operand fragment of rows [r0, r0+16), columns [k0, k0+16) of a staged matrix.
template <int D>
__device__ __forceinline__ void frag_a(u32 (&a)[4], const bf16_t* s, int r0, int k0, int lane) {
    int mi = lane >> 3;
    ldsm_x4(a[0], a[1], a[2], a[3], s + (r0 + (lane & 7) + (mi & 1) * 8) * (D + 8) + k0 + (mi >> 1) * 8);
}

// B-operand fragments for n-blocks nb, nb+1 (rows n0 + 8nb.. of the staged matrix
// are the columns of B) at k-step k0: B[k][n] = s[n][k].
template <int D>
__device__ __forceinline__ void frag_b(u32& b0, u32& b1, u32& b2, u32& b3, const bf16_t* s, int n0,
                                       int k0, int lane) {
    int mi = lane >> 3;
    ldsm_x4(b0, b1, b2, b3, s + (n0 + (mi >> 1) * 8 + (lane & 7)) * (D + 8) + k0 + (mi & 1) * 8);
}

// B-operand fragments for n-blocks at columns d0, d0+8, k-step rows [k0, k0+16):
// B[k][n] = s[k][n] (transposed load).
template <int D>
__device__ __forceinline__ void frag_bt(u32& b0, u32& b1, u32& b2, u32& b3, const bf16_t* s, int k0,
                                        int d0, int lane) {
    int mi = lane >> 3;
    ldsm_x4_t(b0, b1, b2, b3, s + (k0 + (mi & 1) * 8 + (lane & 7)) * (D + 8) + d0 + (mi >> 1) * 8);
}

// acc[16 x 8*NB] = A[16 x D] . S[n0.., :]^T, A from registers (D/16 fragments).
template <int D, int NB>
__device__ __forceinline__ void mma_abt(float (&acc)[NB][4], const u32 (&a)[D / 16][4], const bf16_t* s,
                                        int n0, int lane) {
#pragma unroll
    for (int nb = 0; nb < NB; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nb][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
#pragma unroll
        for (int nb = 0; nb < NB; nb += 2) {
            u32 b0, b1, b2, b3;
            frag_b<D>(b0, b1, b2, b3, s, n0 + nb * 8, ks * 16, lane);
            mma_bf16(acc[nb], a[ks], b0, b1);
            mma_bf16(acc[nb + 1], a[ks], b2, b3);
        }
    }
}

// acc[16 x D] += P[16 x 16*KS] . S[k0.., :], P given as f32 accumulators
// p[2*KS][4] (n-blocks of 8 columns), rounded to BF16 here.
template <int D, int KS>
__device__ __forceinline__ void mma_pv(float (&acc)[D / 8][4], const float (&p)[2 * KS][4], const bf16_t* s,
                                       int k0, int lane) {
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        u32 a[4] = {pack_bf16x2(p[2 * ks][0], p[2 * ks][1]), pack_bf16x2(p[2 * ks][2], p[2 * ks][3]),
                    pack_bf16x2(p[2 * ks + 1][0], p[2 * ks + 1][1]),
                    pack_bf16x2(p[2 * ks + 1][2], p[2 * ks + 1][3])};
#pragma unroll
        for (int nd = 0; nd < D / 8; nd += 2) {
            u32 b0, b1, b2, b3;
            frag_bt<D>(b0, b1, b2, b3, s, k0 + ks * 16, nd * 8, lane);
            mma_bf16(acc[nd], a, b0, b1);
            mma_bf16(acc[nd + 1], a, b2, b3);
        }
    }
}

// One warp, one tile of FA_BC keys starting at position key0, for the warp's 16
// query rows (this thread holds rows lane/4 and lane/4 + 8, at positions pos[0],
// pos[1]). The online-softmax state: o[16 x D] unnormalised, m (log2 domain,
// scaled) and this thread's partial row sums l. The only place the forward math
// lives, so training and decode share it: fa_tile = fa_tile_p (reads K) then the
// P.V product (reads V), split so the decode kernel can refill K's buffer between.
template <int D>
__device__ __forceinline__ void fa_tile_p(float (&s)[FA_BC / 8][4], const u32 (&qf)[D / 16][4], const bf16_t* sK,
                                          int key0, const int (&pos)[2], float sl2, float (&o)[D / 8][4],
                                          float (&m)[2], float (&l)[2], int lane) {
    mma_abt<D, FA_BC / 8>(s, qf, sK, 0, lane);
    float mx[2] = {m[0], m[1]};
    // A tile wholly at or before both of the thread's rows needs no mask (the same
    // values either way: the mask would keep every one).
    if (key0 + FA_BC - 1 <= min(pos[0], pos[1])) {
#pragma unroll
        for (int nb = 0; nb < FA_BC / 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[nb][e] * sl2;
                s[nb][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
    } else {
#pragma unroll
        for (int nb = 0; nb < FA_BC / 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int c = key0 + nb * 8 + 2 * (lane & 3) + (e & 1);
                float x = c <= pos[e >> 1] ? s[nb][e] * sl2 : FA_NEG_INF;
                s[nb][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
    }
    float alpha[2], ps[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        alpha[i] = exp2f(m[i] - mx[i]);
        m[i] = mx[i];
    }
#pragma unroll
    for (int nb = 0; nb < FA_BC / 8; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float p = exp2f(s[nb][e] - m[e >> 1]);
            s[nb][e] = p;
            ps[e >> 1] += p;
        }
#pragma unroll
    for (int i = 0; i < 2; i++) l[i] = l[i] * alpha[i] + ps[i];
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++) {
        o[nd][0] *= alpha[0];
        o[nd][1] *= alpha[0];
        o[nd][2] *= alpha[1];
        o[nd][3] *= alpha[1];
    }
}

template <int D>
__device__ __forceinline__ void fa_tile(const u32 (&qf)[D / 16][4], const bf16_t* sK, const bf16_t* sV,
                                        int key0, const int (&pos)[2], float sl2, float (&o)[D / 8][4],
                                        float (&m)[2], float (&l)[2], int lane) {
    float s[FA_BC / 8][4];
    fa_tile_p<D>(s, qf, sK, key0, pos, sl2, o, m, l, lane);
    mma_pv<D, FA_BC / 16>(o, s, sV, 0, lane);
}

// Normalise and store the warp's rows: row i of the tile goes to out + orow[i]
// (negative: not stored; out null: no f32 output, only o16); lse (log2 domain,
// scaled scores) to lse[lrow[i]]. o16 (not null): the same values rounded to BF16
// at the same offsets; with `stage` (the warp's 2,048 bytes of shared memory, sm_90
// on, D = 128) through warp_tile_store_tm, whose 16-byte stores took the place of
// 4-byte ones a quad wrote 16 bytes a row with (~0.4 ms of a 0.6B bf16 step,
// H100): the same pack2_bf16 of the same values, so the same bits. toks: the
// warp's rows below L (rows past it are the tail); ld: the rows' stride.
template <int D>
__device__ __forceinline__ void fa_finish(float (&o)[D / 8][4], const float (&m)[2], float (&l)[2], float* out,
                                          const long (&orow)[2], float* lse, const long (&lrow)[2],
                                          int lane, bf16_t* o16 = nullptr, u8* stage = nullptr, int toks = 0,
                                          long ld = 0) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    // o becomes the output in place (o * (1 / l), the values stored), so no second
    // copy of it is live (with one, the kernel took 209 registers against 168).
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const float inv = 1.0f / l[i];
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++) {
            o[nd][2 * i] *= inv;
            o[nd][2 * i + 1] *= inv;
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (orow[i] < 0) continue;
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++)
            if (out) *(float2*)(out + orow[i] + nd * 8 + 2 * (lane & 3)) = make_float2(o[nd][2 * i], o[nd][2 * i + 1]);
        if (lse && (lane & 3) == 0) lse[lrow[i]] = m[i] + log2f(l[i]);
    }
    if (!o16) return;
#if __CUDA_ARCH__ >= 900
    if constexpr (D == 128 && FA_O16_STAGE) {
        // The warp's row 0 is lane 0's first row (orow < 0 only past toks).
        const long r0 = __shfl_sync(0xffffffffu, orow[0], 0);
        if (toks > 0) warp_tile_store_tm(reinterpret_cast<const float(&)[64]>(o), o16 + r0, ld, toks, D, stage, lane);
        return;
    }
#endif
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (orow[i] < 0) continue;
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++)
            *(u32*)(o16 + orow[i] + nd * 8 + 2 * (lane & 3)) = pack2_bf16(o[nd][2 * i], o[nd][2 * i + 1]);
    }
}

// Training forward. tiles[3t..3t+3] = (first row of the sequence in the packed
// batch, first query position of the tile, sequence length). Grid (tiles, nh),
// 128 threads. q [rows, nh*D], k, v [rows, nkv*D] in BF16 (fa_to_bf16_x3); out
// [rows, nh*D] f32; lse [rows, nh]; o16 (when not null) out's BF16 copy as well
// (fuses pad_bf16_f32 of out: the o projection's BF16 operand). Key/value tiles
// are double-buffered: tile j+1 is in flight while tile j is computed.
template <int D>
__device__ void fa_fwd(const bf16_t* q, const bf16_t* k, const bf16_t* v, const int* tiles, int nh, int nkv,
                       float sl2, float* out, float* lse, bf16_t* o16) {
    extern __shared__ __align__(16) unsigned char fa_sm[];
    const int T = FA_BC * (D + 8);
    bf16_t* sb = (bf16_t*)fa_sm;  // [2][K, V]
    int h = blockIdx.x % nh, tile = blockIdx.x / nh, kvh = h / (nh / nkv);
    int seq0 = tiles[3 * tile], q0 = tiles[3 * tile + 1], L = tiles[3 * tile + 2];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    long qw = (long)nh * D, kvw = (long)nkv * D;
    int nq = min(FA_BR, L - q0);
    // Q goes through the second buffer into registers.
    stage16<D, FA_BR>(sb + 2 * T, q + (seq0 + q0) * qw + h * D, qw, nq);
    cp_commit();
    const bf16_t* kb = k + (long)seq0 * kvw + kvh * D;
    const bf16_t* vb = v + (long)seq0 * kvw + kvh * D;
    stage16<D, FA_BC>(sb, kb, kvw, min(FA_BC, L));
    stage16<D, FA_BC>(sb + T, vb, kvw, min(FA_BC, L));
    cp_commit();
    cp_wait<1>();
    __syncthreads();
    u32 qf[D / 16][4];
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) frag_a<D>(qf[ks], sb + 2 * T, warp * 16, ks * 16, lane);
    __syncthreads();
    int r = q0 + warp * 16 + (lane >> 2);
    int pos[2] = {min(r, L - 1), min(r + 8, L - 1)};
    int warp_last = min(q0 + warp * 16 + 15, L - 1);
    float o[D / 8][4], m[2] = {FA_NEG_INF, FA_NEG_INF}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[nd][e] = 0.f;
    int ntiles = (q0 + nq - 1) / FA_BC + 1;
    for (int j = 0; j < ntiles; j++) {
        bf16_t* cur = sb + (j & 1) * 2 * T;
        kv_next<D>(sb, kb, vb, kvw, j, ntiles, L);
        __syncthreads();
        if (j * FA_BC <= warp_last) fa_tile<D>(qf, cur, cur + T, j * FA_BC, pos, sl2, o, m, l, lane);
        __syncthreads();
    }
    long orow[2], lrow[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int ri = r + 8 * i;
        bool ok = ri < L;
        orow[i] = ok ? (seq0 + ri) * qw + h * D : -1;
        lrow[i] = (long)(seq0 + ri) * nh + h;
    }
    // The K/V buffers are free (the last tile's copies waited for, every warp past
    // the loop's barrier): warp w stages its o16 rows in bytes [2048 w, 2048 (w + 1)).
    const int toks = max(0, min(16, L - (q0 + warp * 16)));
    fa_finish<D>(o, m, l, out, orow, lse, lrow, lane, o16, reinterpret_cast<u8*>(sb) + 2048 * warp, toks, qw);
}

// The o projection's operand of a decode step's attention output [rows, nh*D]
// (fuses quant_row1x128_f32, codes != null, or pad_bf16_f32, yb != null, of out):
// codes [rows_pad][cols_pad] and scales [L][rows_pad] as row1x128 lays them out,
// or the BF16 copy [rows][cols_pad]. Blocks of rows past `rows` write the 1x128
// padding (code 0, scale 1).
struct DecOperand {
    int rows, rows_pad, cols_pad, pad_;
    u8* codes;
    float* scales;
    bf16_t* yb;
};

// Row b's heads h0 .. h0 + group - 1 from the warp's o and the row sums l that
// fa_finish reduced: the values it stored (o * (1 / l)), so the quantizer's. A
// quad of lanes (lane >> 2) holds a row, lane & 3 its columns nd * 8 + 2 (lane & 3)
// (+1); a 1x128 group is 16 nd of one head (D a multiple of 128 when codes are
// asked for), its amax the quad's max, as row1x128's warp max over the group.
template <int D>
__device__ __forceinline__ void fa_dec_operand(const float (&o)[D / 8][4], const float (&l)[2], const DecOperand& op,
                                               int b, int h0, int group, int lane) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int hr = (lane >> 2) + 8 * i;
        const bool valid = hr < group;
        const float inv = 1.0f / l[i];
        const long at = (long)b * op.cols_pad + (long)(h0 + hr) * D + 2 * (lane & 3);
        if (op.yb && valid) {
#pragma unroll
            for (int nd = 0; nd < D / 8; nd++)
                *(u32*)(op.yb + at + nd * 8) = pack2_bf16(o[nd][2 * i] * inv, o[nd][2 * i + 1] * inv);
        }
        if (!op.codes) continue;
#pragma unroll
        for (int gi = 0; gi < D / 128; gi++) {
            u32 mx = 0;
#pragma unroll
            for (int nd = 16 * gi; nd < 16 * gi + 16; nd++)
                mx = max_abs_bits(max_abs_bits(mx, o[nd][2 * i] * inv), o[nd][2 * i + 1] * inv);
            // Every lane takes part (a quad is one row; rows past `group` unused).
            mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float sc = e4m3_scale(mx);
            const Quot d = quot(sc);
            if (!valid) continue;
#pragma unroll
            for (int nd = 16 * gi; nd < 16 * gi + 16; nd++)
                *(unsigned short*)(op.codes + at + nd * 8) =
                    (unsigned short)encode2(o[nd][2 * i] * inv, o[nd][2 * i + 1] * inv, d);
            if ((lane & 3) == 0) op.scales[((long)(h0 + hr) * (D / 128) + gi) * op.rows_pad + b] = sc;
        }
    }
}

// A padding row's share of the 1x128 operand: its heads' codes 0, scales 1.
template <int D>
__device__ __forceinline__ void fa_dec_operand_pad(const DecOperand& op, int b, int h0, int group, int lane) {
    if (!op.codes) return;
    for (int c = lane * 4; c < group * D; c += 128) *(u32*)(op.codes + (long)b * op.cols_pad + h0 * D + c) = 0u;
    for (int g = lane; g < group * (D / 128); g += 32) op.scales[((long)h0 * (D / 128) + g) * op.rows_pad + b] = 1.0f;
}

// Decode: query row b's `group` heads of kv head kvh at position len[b] - 1 against
// the row's len[b] keys in the BF16 caches k_cache, v_cache [*, nkv*D]: cache rows
// kv0[b] .. kv0[b] + len[b], or (pt not null: a paged cache) key j in cache row
// pt[kv0[b] + j / FA_BC] * FA_BC + j % FA_BC, a page being one key tile, so each
// tile is one page and the tiles, their order and every value read are the same
// (fa_scatter_bf16 or fa_scatter_kv16 wrote them with the rounding of fa_to_bf16_x3). q, out [B, nh*D]
// f32. Block b * nkv + kvh, two warps: the (row, kv head)'s chain of key tiles in
// the forward's order (fa_tile's two halves), one buffer each for K and V, the next
// K tile streaming in during this tile's P.V and the next V tile during the next
// tile's scores. Warp w computes the scores of key blocks 4w .. 4w + 3 of each tile
// (mma_abt's MMAs for those blocks) and P.V for output columns [w D/2, (w + 1) D/2)
// (each column's MMAs over the tile's four key steps in order, as mma_pv). The row
// maxima are exchanged (max is exact), the row sums' chain goes on in the forward's
// order (warp 1 adds its 16 values to warp 0's per-lane partial), P crosses as its
// BF16 A fragments, and warp 1 holds l: the bits of one warp doing it all (the
// one-warp kernel it replaced, whose chain was latency-bound: ncu, s27, 0.65 waves,
// 6% occupancy, 55% of DRAM bandwidth at batch 64).
// Append (kn, vn [B, nkv*D] f32 not null): the row's own key and value are not in
// the caches yet; the block writes its head's slice to the row of key len[b] - 1
// (fuses fa_scatter_bf16 of k and v: the same pack_bf16x2 rounding) and puts the
// same bits into the last tile's shared copy, whatever the tile's copy read there.
// op (codes or yb not null): the o projection's operand of out, made here too
// (fa_dec_operand; fuses the quantizer or BF16 copy of out).
struct DecX {
    float mx[2][16];       // [warp][row]: each warp's row maxima over its keys
    float ps[2][32];       // [row half][lane]: warp 0's per-lane partial row sums
    u32 pa[2][2][4][32];   // [warp][its key step][register][lane]: P's A fragments
    float l[16];           // the finished row sums (warp 1's)
    u32 amx[2][16];        // [warp][row]: the operand's amax over each warp's columns
};
static_assert(sizeof(DecX) == 2624, "flash.rs decode_launch reserves 2,624 bytes for DecX");

// fa_dec2_qkv's inputs: the q, k, v projections' split-K partials (no bias, no
// residual) and Qwen3's q/k norm weights, eps, each row's RoPE position and tables:
// ops.cu's qkv_sk_norm_rope's arguments but its outputs.
struct DecQkv {
    SkIn q, k, v;
    const float *qw, *kw;
    float eps;
    const int* pos;
    const float *cos_t, *sin_t;
};

// Row b's q heads kvh * group .. + group - 1, then its k and v heads of KV head kvh,
// into z16 [(group + 2)][D] as BF16 (fuses qkv_sk_norm_rope for the block's heads:
// its qkv_sk_head, so its values, then the rounding fa_dec2 gives them:
// pack_bf16x2 rounds each value alone, so a pair read back is pack_bf16x2 of the
// pair). Warp w makes heads w, w + 2, ... of that list.
template <int D>
__device__ __forceinline__ void fa_dec_qkv(const DecQkv& z, bf16_t* z16, int b, int kvh, int group, int nh, int nkv,
                                           int w) {
    if constexpr (D <= 128) {
        // Two heads at a time (t and t + 2), both loaded before either is summed.
        for (int t = w; t < group + 2; t += 4) {
            const int t2 = t + 2;
            const int ka = t < group ? 0 : t == group ? 1 : 2, kb = t2 < group ? 0 : t2 == group ? 1 : 2;
            const int ha = ka == 0 ? kvh * group + t : kvh, hb = kb == 0 ? kvh * group + t2 : kvh;
            qkv_sk_heads2(z.q, z.k, z.v, b, D, z.eps, z.qw, z.kw, z.pos[b], z.cos_t, z.sin_t, ka, ha,
                          z16 + t * D, t2 < group + 2, kb, hb, z16 + t2 * D);
        }
        return;
    }
    for (int t = w; t < group + 2; t += 2) {
        const int kind = t < group ? 0 : t == group ? 1 : 2;
        const int hh = kind == 0 ? kvh * group + t : kvh, cols = (kind == 0 ? nh : nkv) * D;
        qkv_sk_head(z.q, z.k, z.v, kind, b, hh, cols, D, z.eps, z.qw, z.kw, z.pos[b], z.cos_t, z.sin_t, nullptr,
                    z16 + t * D);
    }
}

// QKV (fa_dec2_qkv): q, kn, vn unused; the block makes its q heads and its new k
// and v rows from z's partials (fa_dec_qkv) while K's and V's first tiles are in
// flight, into DecX's pa (free until the first tile's P) where they fit, else
// after DecX ((group + 2) * D BF16 values: decode_launch adds the bytes).
template <int D, bool QKV>
__device__ void fa_dec2(const float* q, bf16_t* kc, bf16_t* vc, const int* kv0, const int* pt, const int* len, int nh,
                        int nkv, float sl2, float* out, const float* kn, const float* vn, DecOperand op,
                        const DecQkv& z) {
    static_assert(D == 64 || D == 128, "fa_dec2: head_dim 64 or 128");
    extern __shared__ __align__(16) unsigned char fa_sm[];
    constexpr int T = FA_BC * (D + 8), HD = D / 16;  // HD: a warp's blocks of 8 output columns
    bf16_t* sK = (bf16_t*)fa_sm;
    bf16_t* sV = sK + T;
    DecX& x = *(DecX*)(sV + T);
    const int b = blockIdx.x / nkv, kvh = blockIdx.x % nkv, group = nh / nkv;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, r0 = lane >> 2;
    if (op.codes && b >= op.rows) {  // a padding row of the 1x128 operand
        if (w == 0) fa_dec_operand_pad<D>(op, b, kvh * group, group, lane);
        return;
    }
    const int n = len[b], k0 = kv0[b];
    const long qw = (long)nh * D, kvw = (long)nkv * D;
    // Key tile j's first cache row: contiguous from kv0[b], or its page.
    auto tile_row = [&](int j) -> long { return pt ? (long)pt[k0 + j] * FA_BC : (long)k0 + (long)j * FA_BC; };
    bf16_t* kb = kc + kvh * D;
    bf16_t* vb = vc + kvh * D;
    const long row0 = tile_row(0) * kvw;
    stage16<D, FA_BC, 64>(sK, kb + row0, kvw, min(FA_BC, n));
    cp_commit();
    stage16<D, FA_BC, 64>(sV, vb + row0, kvw, min(FA_BC, n));
    cp_commit();
    // The row's q heads and new k, v rows: f32 in global memory, rounded here, or
    // made here as BF16 (z16).
    const bf16_t* z16 = nullptr;
    if constexpr (QKV) {
        bf16_t* zs = (group + 2) * D * 2 <= (int)sizeof(x.pa) ? (bf16_t*)x.pa : (bf16_t*)(&x + 1);
        fa_dec_qkv<D>(z, zs, b, kvh, group, nh, nkv, w);
        __syncthreads();
        z16 = zs;
    }
    // The new row (warp 0; lane l holds columns 2 l + 64 i, +1): to the caches, and patched
    // into the last tile's shared copies below.
    const bool append = QKV || kn != nullptr;
    u32 kp[D / 64], vp[D / 64];
    if (append && w == 0) {
        const long src = (long)b * kvw + kvh * D, dst = (tile_row((n - 1) / FA_BC) + (n - 1) % FA_BC) * kvw;
#pragma unroll
        for (int i = 0; i < D / 64; i++) {
            const int c = 2 * lane + 64 * i;
            if constexpr (QKV) {
                kp[i] = *(const u32*)(z16 + group * D + c);
                vp[i] = *(const u32*)(z16 + (group + 1) * D + c);
            } else {
                kp[i] = pack_bf16x2(kn[src + c], kn[src + c + 1]);
                vp[i] = pack_bf16x2(vn[src + c], vn[src + c + 1]);
            }
            *(u32*)(kb + dst + c) = kp[i];
            *(u32*)(vb + dst + c) = vp[i];
        }
    }
    const int last = (n - 1) % FA_BC;
    // Q straight into frag_a's layout (register 2 h + i: row lane / 4 + 8 i, columns
    // 16 ks + 8 h + 2 (lane % 4), +1), rows from `group` on zero: stage()'s values.
    u32 qf[D / 16][4];
    {
        const float* qb = q + b * qw + (long)kvh * group * D + 2 * (lane & 3);
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = r0 + 8 * (e & 1), c = 16 * ks + 8 * (e >> 1);
                if constexpr (QKV) {
                    qf[ks][e] = r < group ? *(const u32*)(z16 + r * D + c + 2 * (lane & 3)) : 0u;
                } else {
                    float2 v = make_float2(0.f, 0.f);
                    if (r < group) v = *(const float2*)(qb + (long)r * D + c);
                    qf[ks][e] = pack_bf16x2(v.x, v.y);
                }
            }
    }
    const int pos = n - 1;
    float o[HD][4], m[2] = {FA_NEG_INF, FA_NEG_INF}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int nd = 0; nd < HD; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[nd][e] = 0.f;
    const int ntiles = (n - 1) / FA_BC + 1;
    for (int j = 0; j < ntiles; j++) {
        const int key0 = j * FA_BC;
        // patch: the new row over the last tile's copy, once every thread's copies of
        // the tile have landed (the row's copy is another warp's).
        const bool patch = append && j + 1 == ntiles, more = j + 1 < ntiles;
        // The next tile's page, read now (used after this tile's scores).
        const int pnext = pt && more ? pt[k0 + j + 1] : 0;
        cp_wait<1>();  // this thread's share of K tile j
        __syncthreads();  // K tile j whole
        if (patch) {
            if (w == 0) {
#pragma unroll
                for (int i = 0; i < D / 64; i++) *(u32*)(sK + last * (D + 8) + 2 * lane + 64 * i) = kp[i];
            }
            __syncthreads();
        }
        // fa_tile_p for key blocks 4w .. 4w + 3 (both of a thread's rows sit at pos).
        float s[4][4];
        mma_abt<D, 4>(s, qf, sK, 32 * w, lane);
        float mx[2] = {m[0], m[1]};
        if (key0 + FA_BC - 1 <= pos) {
#pragma unroll
            for (int nb = 0; nb < 4; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float v = s[nb][e] * sl2;
                    s[nb][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
        } else {
#pragma unroll
            for (int nb = 0; nb < 4; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = key0 + 32 * w + nb * 8 + 2 * (lane & 3) + (e & 1);
                    const float v = c <= pos ? s[nb][e] * sl2 : FA_NEG_INF;
                    s[nb][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        }
        if ((lane & 3) == 0) {
            x.mx[w][r0] = mx[0];
            x.mx[w][r0 + 8] = mx[1];
        }
        __syncthreads();  // both warps' maxima; both done with K tile j
        const int nk = min(FA_BC, n - (j + 1) * FA_BC);
        const long off = (pt ? (long)pnext * FA_BC : (long)k0 + (long)(j + 1) * FA_BC) * kvw;
        if (more) {
            stage16<D, FA_BC, 64>(sK, kb + off, kvw, nk);
            cp_commit();
        }
        float alpha[2], ps[2] = {0.f, 0.f};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float t = fmaxf(mx[i], x.mx[1 - w][r0 + 8 * i]);
            alpha[i] = exp2f(m[i] - t);
            m[i] = t;
        }
#pragma unroll
        for (int nb = 0; nb < 4; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = exp2f(s[nb][e] - m[e >> 1]);
                s[nb][e] = p;
                if (w == 0) ps[e >> 1] += p;
            }
        if (w == 0) {
            x.ps[0][lane] = ps[0];
            x.ps[1][lane] = ps[1];
        }
        // This warp's two key steps of P as mma_pv packs them.
#pragma unroll
        for (int k = 0; k < 2; k++) {
            x.pa[w][k][0][lane] = pack_bf16x2(s[2 * k][0], s[2 * k][1]);
            x.pa[w][k][1][lane] = pack_bf16x2(s[2 * k][2], s[2 * k][3]);
            x.pa[w][k][2][lane] = pack_bf16x2(s[2 * k + 1][0], s[2 * k + 1][1]);
            x.pa[w][k][3][lane] = pack_bf16x2(s[2 * k + 1][2], s[2 * k + 1][3]);
        }
        if (more) {
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();  // V tile j whole, P's fragments, warp 0's partial sums
        if (patch) {
            if (w == 0) {
#pragma unroll
                for (int i = 0; i < D / 64; i++) *(u32*)(sV + last * (D + 8) + 2 * lane + 64 * i) = vp[i];
            }
            __syncthreads();
        }
        if (w == 1) {
            ps[0] = x.ps[0][lane];
            ps[1] = x.ps[1][lane];
#pragma unroll
            for (int nb = 0; nb < 4; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) ps[e >> 1] += s[nb][e];
        }
#pragma unroll
        for (int i = 0; i < 2; i++) l[i] = l[i] * alpha[i] + ps[i];  // warp 1's is the row's
#pragma unroll
        for (int nd = 0; nd < HD; nd++) {
            o[nd][0] *= alpha[0];
            o[nd][1] *= alpha[0];
            o[nd][2] *= alpha[1];
            o[nd][3] *= alpha[1];
        }
#pragma unroll
        for (int ks = 0; ks < FA_BC / 16; ks++) {
            const u32 a[4] = {x.pa[ks >> 1][ks & 1][0][lane], x.pa[ks >> 1][ks & 1][1][lane],
                              x.pa[ks >> 1][ks & 1][2][lane], x.pa[ks >> 1][ks & 1][3][lane]};
#pragma unroll
            for (int nd = 0; nd < HD; nd += 2) {
                u32 b0, b1, b2, b3;
                frag_bt<D>(b0, b1, b2, b3, sV, ks * 16, (w * HD + nd) * 8, lane);
                mma_bf16(o[nd], a, b0, b1);
                mma_bf16(o[nd + 1], a, b2, b3);
            }
        }
        __syncthreads();  // both done with V tile j and the exchange buffers
        if (more) {
            stage16<D, FA_BC, 64>(sV, vb + off, kvw, nk);
            cp_commit();
        }
    }
    // fa_finish's row sums (warp 1's, reduced over the quad in its order), shared.
    if (w == 1) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
            l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        }
        if ((lane & 3) == 0) {
            x.l[r0] = l[0];
            x.l[r0 + 8] = l[1];
        }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; i++) l[i] = x.l[r0 + 8 * i];
    const int h0 = kvh * group;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int hr = r0 + 8 * i;
        if (hr >= group) continue;
        const float inv = 1.0f / l[i];
        float* orow = out + b * qw + (long)(h0 + hr) * D + w * (D / 2) + 2 * (lane & 3);
#pragma unroll
        for (int nd = 0; nd < HD; nd++)
            *(float2*)(orow + nd * 8) = make_float2(o[nd][2 * i] * inv, o[nd][2 * i + 1] * inv);
    }
    // fa_dec_operand over the two warps' halves: one 1x128 group a head (D = 128),
    // its amax the max of both halves' (exact).
    if (!op.codes && !op.yb) return;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int hr = r0 + 8 * i;
        const bool valid = hr < group;
        const float inv = 1.0f / l[i];
        const long at = (long)b * op.cols_pad + (long)(h0 + hr) * D + w * (D / 2) + 2 * (lane & 3);
        if (op.yb && valid) {
#pragma unroll
            for (int nd = 0; nd < HD; nd++)
                *(u32*)(op.yb + at + nd * 8) = pack2_bf16(o[nd][2 * i] * inv, o[nd][2 * i + 1] * inv);
        }
        if constexpr (D == 128) {
            if (!op.codes) continue;  // uniform over the block
            u32 amx = 0;
#pragma unroll
            for (int nd = 0; nd < HD; nd++)
                amx = max_abs_bits(max_abs_bits(amx, o[nd][2 * i] * inv), o[nd][2 * i + 1] * inv);
            amx = max(amx, __shfl_xor_sync(0xffffffffu, amx, 1));
            amx = max(amx, __shfl_xor_sync(0xffffffffu, amx, 2));
            if ((lane & 3) == 0) x.amx[w][hr] = amx;
            __syncthreads();
            amx = max(amx, x.amx[1 - w][hr]);
            const float sc = e4m3_scale(amx);
            const Quot d = quot(sc);
            if (!valid) continue;
#pragma unroll
            for (int nd = 0; nd < HD; nd++)
                *(unsigned short*)(op.codes + at + nd * 8) =
                    (unsigned short)encode2(o[nd][2 * i] * inv, o[nd][2 * i + 1] * inv, d);
            if (w == 0 && (lane & 3) == 0) op.scales[(long)(h0 + hr) * op.rows_pad + b] = sc;
        }
    }
}

// dst[rows[j]] = BF16(src[srows[j]]) (srows null: src[j]) for rows of `cols`
// values (even): new rows of a BF16 KV cache, rounded as fa_to_bf16_x3 rounds the
// training forward's k, v (srows: a source row may go to several cache rows, a
// shared prompt's last page into each sample's own copy).
extern "C" __global__ void fa_scatter_bf16(bf16_t* dst, const long* rows, const long* srows, long nrows, long cols,
                                           const float* src) {
    pdl_entry();
    long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 2;
    if (i >= nrows * cols) return;
    long j = i / cols, c = i % cols;
    const float* s = src + (srows ? srows[j] : j) * cols + c;
    *(u32*)(dst + rows[j] * cols + c) = pack_bf16x2(s[0], s[1]);
}

// dk[rows[j]] = sk[srows[j]] and dv[rows[j]] = sv[srows[j]] (srows null: row j)
// for rows of `cols` BF16 values (a multiple of 8) already rounded by their
// producers (a prefill's k from qk_norm_rope_bf16, v from its rows GEMM: the bits
// fa_scatter_bf16 makes of their f32 values). Grid (rows, 2): block (j, 0) copies
// k's row, (j, 1) v's, 16 bytes a thread; no index division (fa_scatter_bf16
// divides per pair).
extern "C" __global__ void fa_scatter_kv16(bf16_t* dk, bf16_t* dv, const long* rows, const long* srows, long cols,
                                           const bf16_t* sk, const bf16_t* sv) {
    pdl_entry();
    const long j = blockIdx.x, js = srows ? srows[j] : j;
    const uint4* src = reinterpret_cast<const uint4*>((blockIdx.y ? sv : sk) + js * cols);
    uint4* dst = reinterpret_cast<uint4*>((blockIdx.y ? dv : dk) + rows[j] * cols);
    for (long c = threadIdx.x; c < cols / 8; c += blockDim.x) dst[c] = src[c];
}

// Values i .. i + 3 as f32: of f when not null, else of h's BF16 values (exact).
__device__ __forceinline__ float4 quad_f32(const float* f, const bf16_t* h, long i) {
    if (f) return *(const float4*)(f + i);
    float v[4];
    bf16x4_to_f32(*(const uint2*)(h + i), v);
    return make_float4(v[0], v[1], v[2], v[3]);
}

// The backward's inputs in one pass over dout: delta[r, h] = dout[r, h, :] .
// out[r, h, :] (the softmax backward's row term) and dout16 = BF16(dout) (RNE, as
// fa_to_bf16_x3). Grid rows, 128 threads: warp w takes heads w, w+4, ..; lane l the
// values 4 l .. 4 l + 3 (+128 ..), summed in that order, then across lanes. dout
// null: dout16 is the input (the o projection's DGrad output as cuBLASLt wrote it,
// whose f32 values its epilogue would have written as dout: the same delta).
// out null: out16 is the output read (BF16), where the forward kept only its BF16
// values (the BF16 flows' training: the o projection reads those, and the f32
// output was 33.5 MB a 0.6B 8 x 512 layer written and read for delta alone).
extern "C" __global__ void fa_bwd_prep(const float* dout, const float* out, const bf16_t* out16, int nh, int hd,
                                       bf16_t* dout16, float* delta) {
    pdl_entry();
    int r = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int h = warp; h < nh; h += 4) {
        const long o0 = ((long)r * nh + h) * hd;
        float s = 0.f;
        for (int d = lane * 4; d < hd; d += 128) {
            const float4 a = quad_f32(dout, dout16, o0 + d);
            if (dout) *(uint2*)(dout16 + o0 + d) = make_uint2(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w));
            const float4 b = quad_f32(out, out16, o0 + d);
            s += a.x * b.x;
            s += a.y * b.y;
            s += a.z * b.z;
            s += a.w * b.w;
        }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) delta[(long)r * nh + h] = s;
    }
}

// dK, dV of one 64-key tile (tiles as in fa_fwd, q0 read as the tile's first key)
// for one kv head. Each warp owns 16 keys: S^T = K Q^T, P^T from lse,
// dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q.
// Summed over the group's query heads, then query rows, in order. q, k, v, dout
// in BF16; steps of FA_BQ query rows double-buffered. dv16 (when not null): dv's
// BF16 GEMM operand as well (fuses pad_bf16_f32 of dv: the v projection's dy), rows at
// stride ld16 (nkv * D, or q + k + v's where it is a column slice of their stacked dy).
// dv null: that operand alone (f32 dv is 16.8 MB a 0.6B 8 x 512 layer no one read).
template <int D>
__device__ void fa_bwd_kv(const bf16_t* dout, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                          const float* lse, const float* delta, const int* tiles, int nh, int nkv, float sl2,
                          float scale, float* dk, float* dv, int round_dv, bf16_t* dv16, long ld16) {
    extern __shared__ __align__(16) unsigned char fa_sm[];
    const int T = FA_BC * (D + 8), S = FA_BQ * (D + 8);
    bf16_t* sK = (bf16_t*)fa_sm;
    bf16_t* sV = sK + T;
    bf16_t* sQO = sV + T;                      // [2][Q, dO] of one step
    float* sLD = (float*)(sQO + 4 * S);        // [2][lse, delta] of one step
    int kvh = blockIdx.x % nkv, tile = blockIdx.x / nkv, group = nh / nkv;
    int seq0 = tiles[3 * tile], k0 = tiles[3 * tile + 1], L = tiles[3 * tile + 2];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    long qw = (long)nh * D, kvw = (long)nkv * D;
    int nk = min(FA_BC, L - k0);
    stage16<D, FA_BC>(sK, k + (seq0 + k0) * kvw + kvh * D, kvw, nk);
    stage16<D, FA_BC>(sV, v + (seq0 + k0) * kvw + kvh * D, kvw, nk);
    cp_commit();
    float ak[D / 8][4], av[D / 8][4];
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) ak[nd][e] = av[nd][e] = 0.f;
    int kw0 = k0 + warp * 16;  // the warp's first key position
    int key[2] = {kw0 + (lane >> 2), kw0 + (lane >> 2) + 8};
    // Steps: (head hi, query rows qs) for hi in the group, qs from k0 to L.
    int per_head = (L - k0 + FA_BQ - 1) / FA_BQ, nsteps = group * per_head;
    auto issue = [&](int st) {
        int h = kvh * group + st / per_head, qs = k0 + (st % per_head) * FA_BQ;
        int nq = min(FA_BQ, L - qs);
        bf16_t* b = sQO + (st & 1) * 2 * S;
        stage16<D, FA_BQ>(b, q + (seq0 + qs) * qw + h * D, qw, nq);
        stage16<D, FA_BQ>(b + S, dout + (seq0 + qs) * qw + h * D, qw, nq);
        float* ld = sLD + (st & 1) * 2 * FA_BQ;
        if (threadIdx.x < FA_BQ) {
            int i = threadIdx.x;
            bool ok = i < nq;
            ld[i] = ok ? lse[(long)(seq0 + qs + i) * nh + h] : 0.f;
            ld[FA_BQ + i] = ok ? delta[(long)(seq0 + qs + i) * nh + h] : 0.f;
        }
        cp_commit();
    };
    issue(0);
    for (int st = 0; st < nsteps; st++) {
        if (st + 1 < nsteps) {
            issue(st + 1);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        int qs = k0 + (st % per_head) * FA_BQ, nq = min(FA_BQ, L - qs);
        const bf16_t* sQ = sQO + (st & 1) * 2 * S;
        const bf16_t* sO = sQ + S;
        const float* sL = sLD + (st & 1) * 2 * FA_BQ;
        const float* sD = sL + FA_BQ;
        if (qs + nq - 1 >= kw0) {  // else every query row is before the warp's keys
            u32 kf[D / 16][4];
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++) frag_a<D>(kf[ks], sK, warp * 16, ks * 16, lane);
            float p[FA_BQ / 8][4];
            mma_abt<D, FA_BQ / 8>(p, kf, sQ, 0, lane);
#pragma unroll
            for (int nb = 0; nb < FA_BQ / 8; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int c = nb * 8 + 2 * (lane & 3) + (e & 1);  // query row in the step
                    bool ok = c < nq && qs + c >= key[e >> 1];
                    p[nb][e] = ok ? exp2f(p[nb][e] * sl2 - sL[c]) : 0.f;
                }
            mma_pv<D, FA_BQ / 16>(av, p, sO, 0, lane);
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++) frag_a<D>(kf[ks], sV, warp * 16, ks * 16, lane);
            float dp[FA_BQ / 8][4];
            mma_abt<D, FA_BQ / 8>(dp, kf, sO, 0, lane);
#pragma unroll
            for (int nb = 0; nb < FA_BQ / 8; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int c = nb * 8 + 2 * (lane & 3) + (e & 1);
                    dp[nb][e] = p[nb][e] * (dp[nb][e] - sD[c]);
                }
            mma_pv<D, FA_BQ / 16>(ak, dp, sQ, 0, lane);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (key[i] >= L) continue;
        long row = (seq0 + key[i]) * kvw + kvh * D;
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++) {
            int d = nd * 8 + 2 * (lane & 3);
            *(float2*)(dk + row + d) = make_float2(ak[nd][2 * i] * scale, ak[nd][2 * i + 1] * scale);
            const float2 v2 = round_dv ? make_float2(round_bf16(av[nd][2 * i]), round_bf16(av[nd][2 * i + 1]))
                                       : make_float2(av[nd][2 * i], av[nd][2 * i + 1]);
            if (dv) *(float2*)(dv + row + d) = v2;
            if (dv16) *(u32*)(dv16 + (seq0 + key[i]) * ld16 + kvh * D + d) = pack2_bf16(v2.x, v2.y);
        }
    }
}

// dQ of one 64-row tile for one head: S = Q K^T, P from lse,
// dP = dO V^T, dS = P (dP - delta), dQ += dS K, over key tiles in order (double-
// buffered). q, k, v, dout in BF16.
template <int D>
__device__ void fa_bwd_q(const bf16_t* dout, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                         const float* lse, const float* delta, const int* tiles, int nh, int nkv, float sl2,
                         float scale, float* dq) {
    extern __shared__ __align__(16) unsigned char fa_sm[];
    const int T = FA_BC * (D + 8);
    bf16_t* sQ = (bf16_t*)fa_sm;
    bf16_t* sO = sQ + T;
    bf16_t* sb = sO + T;  // [2][K, V]
    int h = blockIdx.x % nh, tile = blockIdx.x / nh, kvh = h / (nh / nkv);
    int seq0 = tiles[3 * tile], q0 = tiles[3 * tile + 1], L = tiles[3 * tile + 2];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    long qw = (long)nh * D, kvw = (long)nkv * D;
    int nq = min(FA_BR, L - q0);
    stage16<D, FA_BR>(sQ, q + (seq0 + q0) * qw + h * D, qw, nq);
    stage16<D, FA_BR>(sO, dout + (seq0 + q0) * qw + h * D, qw, nq);
    const bf16_t* kb = k + (long)seq0 * kvw + kvh * D;
    const bf16_t* vb = v + (long)seq0 * kvw + kvh * D;
    stage16<D, FA_BC>(sb, kb, kvw, min(FA_BC, L));
    stage16<D, FA_BC>(sb + T, vb, kvw, min(FA_BC, L));
    cp_commit();
    int r = q0 + warp * 16 + (lane >> 2);
    float lr[2], dr[2];
    int pos[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int ri = min(r + 8 * i, L - 1);
        pos[i] = r + 8 * i < L ? ri : -1;  // invalid rows: every key masked
        lr[i] = lse[(long)(seq0 + ri) * nh + h];
        dr[i] = delta[(long)(seq0 + ri) * nh + h];
    }
    int warp_last = min(q0 + warp * 16 + 15, L - 1);
    float a[D / 8][4];
#pragma unroll
    for (int nd = 0; nd < D / 8; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) a[nd][e] = 0.f;
    int ntiles = (q0 + nq - 1) / FA_BC + 1;
    for (int j = 0; j < ntiles; j++) {
        bf16_t* cur = sb + (j & 1) * 2 * T;
        kv_next<D>(sb, kb, vb, kvw, j, ntiles, L);
        __syncthreads();
        if (j * FA_BC <= warp_last) {
            const bf16_t* sK = cur;
            const bf16_t* sV = cur + T;
            u32 f[D / 16][4];
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++) frag_a<D>(f[ks], sQ, warp * 16, ks * 16, lane);
            float p[FA_BC / 8][4];
            mma_abt<D, FA_BC / 8>(p, f, sK, 0, lane);
#pragma unroll
            for (int nb = 0; nb < FA_BC / 8; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int c = j * FA_BC + nb * 8 + 2 * (lane & 3) + (e & 1);
                    p[nb][e] = c <= pos[e >> 1] ? exp2f(p[nb][e] * sl2 - lr[e >> 1]) : 0.f;
                }
#pragma unroll
            for (int ks = 0; ks < D / 16; ks++) frag_a<D>(f[ks], sO, warp * 16, ks * 16, lane);
            float dp[FA_BC / 8][4];
            mma_abt<D, FA_BC / 8>(dp, f, sV, 0, lane);
#pragma unroll
            for (int nb = 0; nb < FA_BC / 8; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) dp[nb][e] = p[nb][e] * (dp[nb][e] - dr[e >> 1]);
            mma_pv<D, FA_BC / 16>(a, dp, sK, 0, lane);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (pos[i] < 0) continue;
        long row = (seq0 + r + 8 * i) * qw + h * D;
#pragma unroll
        for (int nd = 0; nd < D / 8; nd++)
            *(float2*)(dq + row + nd * 8 + 2 * (lane & 3)) =
                make_float2(a[nd][2 * i] * scale, a[nd][2 * i + 1] * scale);
    }
}

#define FA_INSTANTIATE(D)                                                                                   \
    extern "C" __global__ void __launch_bounds__(128) fa_fwd_##D(const bf16_t* q, const bf16_t* k,         \
                                                                 const bf16_t* v, const int* tiles, int nh, \
                                                                 int nkv, float sl2, float* out, float* lse, \
                                                                 bf16_t* o16) { pdl_entry();                \
        fa_fwd<D>(q, k, v, tiles, nh, nkv, sl2, out, lse, o16);                                            \
    }                                                                                                       \
    /* The same, capped at 168 registers for 3 CTAs an SM (spills a little at D = 128). */                 \
    extern "C" __global__ void __launch_bounds__(128, 3) fa_fwd_occ3_##D(const bf16_t* q, const bf16_t* k, \
                                                                 const bf16_t* v, const int* tiles, int nh, \
                                                                 int nkv, float sl2, float* out, float* lse, \
                                                                 bf16_t* o16) { pdl_entry();                \
        fa_fwd<D>(q, k, v, tiles, nh, nkv, sl2, out, lse, o16);                                            \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(64)                                                        \
        fa_dec2_##D(const float* q, bf16_t* kc, bf16_t* vc, const int* kv0, const int* pt, const int* len,    \
                    int nh, int nkv, float sl2, float* out, const float* kn, const float* vn, DecOperand op) {  \
        pdl_entry();                                                                                        \
        fa_dec2<D, false>(q, kc, vc, kv0, pt, len, nh, nkv, sl2, out, kn, vn, op, DecQkv{});                \
    }                                                                                                       \
    /* fa_dec2 making its q heads and new k, v rows from the projections' partials. */                     \
    extern "C" __global__ void __launch_bounds__(64)                                                        \
        fa_dec2_qkv_##D(SkIn qi, SkIn ki, SkIn vi, const float* qw, const float* kw, float eps,              \
                        const int* pos, const float* cos_t, const float* sin_t, bf16_t* kc, bf16_t* vc,      \
                        const int* kv0, const int* pt, const int* len, int nh, int nkv, float sl2,          \
                        float* out, DecOperand op) { pdl_entry();                                           \
        const DecQkv z{qi, ki, vi, qw, kw, eps, pos, cos_t, sin_t};                                          \
        fa_dec2<D, true>(nullptr, kc, vc, kv0, pt, len, nh, nkv, sl2, out, nullptr, nullptr, op, z);         \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(128)                                                       \
        fa_bwd_kv_##D(const bf16_t* dout, const bf16_t* q, const bf16_t* k, const bf16_t* v, const float* lse, \
                      const float* delta, const int* tiles, int nh, int nkv, float sl2, float scale,        \
                      float* dk, float* dv, int round_dv, bf16_t* dv16, long ld16) { pdl_entry();                                      \
        fa_bwd_kv<D>(dout, q, k, v, lse, delta, tiles, nh, nkv, sl2, scale, dk, dv, round_dv, dv16, ld16);        \
    }                                                                                                       \
    extern "C" __global__ void __launch_bounds__(128)                                                       \
        fa_bwd_q_##D(const bf16_t* dout, const bf16_t* q, const bf16_t* k, const bf16_t* v, const float* lse,  \
                     const float* delta, const int* tiles, int nh, int nkv, float sl2, float scale,         \
                     float* dq) { pdl_entry();                                                                           \
        fa_bwd_q<D>(dout, q, k, v, lse, delta, tiles, nh, nkv, sl2, scale, dq);                             \
    }

FA_INSTANTIATE(64)
FA_INSTANTIATE(128)
