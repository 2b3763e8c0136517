// Attention's backward on Hopper's warpgroup MMA (sm_90a `wgmma`): the twins of
// flash.cu's fa_bwd_kv and fa_bwd_q, the same algorithm (7 products, no atomics,
// every sum in a fixed order: deterministic run to run) and the same inputs and
// outputs. Only the order of the additions inside a tensor-core product differs,
// so the gradients agree with the mma.sync kernels to f32 rounding, not bit for bit
// (nothing needs them to: the forward, which decode must match, stays in flash.cu).
//
// Why: mma.sync feeds every product from registers, loaded from shared memory by
// each warp (ldmatrix); the backward's four warps each reload K, V, Q and dO for
// every 16 x 8 piece and run out of registers for more. wgmma reads its B operand
// (and here the S-shaped products' A too) straight from shared memory, one 64-row
// product per warpgroup, and leaves the registers to the accumulators.
//
// One warpgroup (128 threads) a CTA, tiles of FW_T = 64 rows x D BF16 in shared
// memory in the 128-byte swizzle (wg_common.cuh): D / 64 planes of 64 rows x 128
// bytes. The S-shaped products (K Q^T, V dO^T, Q K^T, dO V^T: d is the reduction)
// read both tiles K-major; the P V-shaped ones (P^T dO, dS^T Q, dS K: rows are the
// reduction) take P or dS from registers (the accumulator layout is the A
// fragment's) and read the same tiles as MN-major B operands (d contiguous = N).

#define FW_T 64  // rows of a tile: a dK/dV CTA's keys, a step's query rows, a dQ CTA's rows

// Bytes of one tile.
template <int D>
struct FwTile {
    static constexpr int BYTES = FW_T * 2 * D;
};

// d [64 x 64] = A B^T over the D columns of two K-major tiles at shared addresses
// a, b (64 rows each): D / 16 k16 steps, planes FW_T * 128 bytes apart.
template <int D>
__device__ __forceinline__ void fw_mma_st(float (&d)[32], u32 a, u32 b) {
#pragma unroll
    for (int j = 0; j < D / 16; j++) {
        const u32 off = (j >> 2) * (FW_T * 128);
        wgmma_bf16(d, sw128_desc(a + off) + 2 * (j & 3), sw128_desc(b + off) + 2 * (j & 3), j);
    }
}

// d [64 x D] += A B: A = 64 x 64 BF16 in registers (four k16 fragments), B = the
// 64-row tile at b read MN-major (row = k, d = n): one n64 product a plane, a k16
// step 16 rows (2048 bytes) down.
template <int D>
__device__ __forceinline__ void fw_mma_pv(float (&d)[D / 64][32], const u32 (&a)[4][4], u32 b) {
#pragma unroll
    for (int p = 0; p < D / 64; p++)
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgmma_bf16_rt(d[p], a[kk], sw128_desc(b + p * (FW_T * 128) + kk * 2048), 1);
}

// The A fragments of a 64 x 64 accumulator, rounded to BF16 (RNE): k16 step kk is
// columns 16 kk .. 16 kk + 15, i.e. accumulators 8 kk .. 8 kk + 7.
__device__ __forceinline__ void fw_frags(u32 (&a)[4][4], const float (&x)[32]) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) a[kk][i] = pack_bf16x2(x[8 * kk + 2 * i], x[8 * kk + 2 * i + 1]);
}

// 2^x by the hardware's approximation, results below 2^-126 flushed to zero: one
// MUFU instruction where exp2f adds the subnormal range's scaling (these kernels are
// bound by instruction issue). A row's largest P is at least 1 / L, so what the
// flush drops is below 2^-100 of it.
__device__ __forceinline__ float fw_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Start copying rows [0, nvalid) of a BF16 matrix (row stride ld values; rows past
// nvalid zero) into the swizzled 64-row tile at dst. All 128 threads; then cp_commit.
template <int D>
__device__ __forceinline__ void fw_load(u8* dst, const bf16_t* src, long ld, int nvalid) {
    load_tile<2 * D, FW_T, 128>(dst, reinterpret_cast<const u8*>(src), ld * 2, 0, nvalid, threadIdx.x);
}

// Every thread's copies have landed and are visible to wgmma (the async proxy).
template <int N>
__device__ __forceinline__ void fw_landed() {
    cp_wait<N>();
    fence_async_smem();
    __syncthreads();
}

// Grids as flash.cu's: block b = (tile b / heads, head b % heads), most work first.

// dK, dV of one 64-key tile (q0 read as the tile's first key) for one kv head:
// fa_bwd_kv's sums, steps of 64 query rows (the group's
// heads, then query rows, in order; Q, dO and the rows' lse, delta double-buffered).
// Per step: S^T = K Q^T and dP^T = V dO^T; P^T from lse, dS^T = P^T (dP^T - delta);
// dV += P^T dO, dK += dS^T Q. Thread rows: keys 16 warp + lane / 4 (+8). dv16 (when
// not null): dv's BF16 GEMM operand as well, and dv null, as fa_bwd_kv.
template <int D>
__device__ void fw_bwd_kv(const bf16_t* dout, const bf16_t* q, const bf16_t* k, const bf16_t* v, const float* lse,
                          const float* delta, const int* tiles, int nh, int nkv, float sl2, float scale, float* dk,
                          float* dv, int round_dv, bf16_t* dv16, long ld16) {
    constexpr int TB = FwTile<D>::BYTES, PL = D / 64;
    extern __shared__ u8 fw_raw[];
    u8* sm = align1024(fw_raw);
    u8* sK = sm;
    u8* sV = sm + TB;
    u8* sQO = sm + 2 * TB;                   // [2][Q, dO] of a step
    float* sLD = (float*)(sm + 6 * TB);      // [2][lse, delta] of a step
    const int kvh = blockIdx.x % nkv, tile = blockIdx.x / nkv, group = nh / nkv;
    const int seq0 = tiles[3 * tile], k0 = tiles[3 * tile + 1], L = tiles[3 * tile + 2];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long qw = (long)nh * D, kvw = (long)nkv * D;
    const int nk = min(FW_T, L - k0);
    fw_load<D>(sK, k + (seq0 + k0) * kvw + kvh * D, kvw, nk);
    fw_load<D>(sV, v + (seq0 + k0) * kvw + kvh * D, kvw, nk);
    cp_commit();
    float ak[PL][32], av[PL][32];
#pragma unroll
    for (int p = 0; p < PL; p++) zero(ak[p]), zero(av[p]);
    const int key0 = k0 + warp * 16 + (lane >> 2);  // the thread's keys: key0, key0 + 8
    const int per_head = (L - k0 + FW_T - 1) / FW_T, nsteps = group * per_head;
    auto issue = [&](int st) {
        const int h = kvh * group + st / per_head, qs = k0 + (st % per_head) * FW_T;
        const int nq = min(FW_T, L - qs);
        u8* b = sQO + (st & 1) * 2 * TB;
        fw_load<D>(b, q + (seq0 + qs) * qw + h * D, qw, nq);
        fw_load<D>(b + TB, dout + (seq0 + qs) * qw + h * D, qw, nq);
        // The rows' lse and delta as asynchronous copies too (zero past the rows): a
        // plain load here would hold the warpgroup for a memory round trip each step.
        float* ld = sLD + (st & 1) * 2 * FW_T;
        if (tid < FW_T) {
            const bool ok = tid < nq;
            const long i = ok ? (long)(seq0 + qs + tid) * nh + h : 0;
            cp4(ld + tid, lse + i, ok);
            cp4(ld + FW_T + tid, delta + i, ok);
        }
        cp_commit();
    };
    issue(0);
    const u32 kA = smem_addr(sK), vA = smem_addr(sV);
    for (int st = 0; st < nsteps; st++) {
        if (st + 1 < nsteps) {
            issue(st + 1);
            fw_landed<1>();
        } else {
            fw_landed<0>();
        }
        const int qs = k0 + (st % per_head) * FW_T, nq = min(FW_T, L - qs);
        const u32 qA = smem_addr(sQO + (st & 1) * 2 * TB), oA = qA + TB;
        const float* sL = sLD + (st & 1) * 2 * FW_T;
        const float* sD = sL + FW_T;
        // Four groups in flight in turn: P^T is made while dP^T runs, dS^T while
        // dV's product runs.
        float s[32], dp[32];
        wg_fence();
        fw_mma_st<D>(s, kA, qA);
        wg_commit();
        fw_mma_st<D>(dp, vA, oA);
        wg_commit();
        wg_wait<1>();
        fence_regs(s);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[4 * j + e] = fw_exp2(s[4 * j + e] * sl2 - sL[j * 8 + 2 * (lane & 3) + (e & 1)]);
        // The mask (p = 0 exactly) only where the step is not wholly after the
        // tile's keys with 64 rows: most steps skip it.
        if (qs < k0 + FW_T || nq < FW_T) {
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = j * 8 + 2 * (lane & 3) + (e & 1);  // query row in the step
                    const bool ok = c < nq && qs + c >= key0 + (e & 2) * 4;
                    s[4 * j + e] = ok ? s[4 * j + e] : 0.f;
                }
        }
        u32 pa[4][4], da[4][4];
        fw_frags(pa, s);
        wg_fence();
#pragma unroll
        for (int p = 0; p < PL; p++) fence_regs(av[p]);
        fw_mma_pv<D>(av, pa, oA);
        wg_commit();
        wg_wait<1>();  // dP^T (committed before dV's product)
        fence_regs(dp);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int c = j * 8 + 2 * (lane & 3) + (e & 1);
                dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - sD[c]);
            }
        fw_frags(da, dp);
        wg_fence();
#pragma unroll
        for (int p = 0; p < PL; p++) fence_regs(ak[p]);
        fw_mma_pv<D>(ak, da, qA);
        wg_commit();
        wg_wait0();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) fence_u32(pa[kk]), fence_u32(da[kk]);
#pragma unroll
        for (int p = 0; p < PL; p++) fence_regs(ak[p]), fence_regs(av[p]);
        __syncthreads();  // everyone is done with this step's buffers
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int key = key0 + 8 * i;
        if (key >= L) continue;
        const long row = (seq0 + key) * kvw + kvh * D;
#pragma unroll
        for (int p = 0; p < PL; p++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int d = p * 64 + j * 8 + 2 * (lane & 3), e = 4 * j + 2 * i;
                *(float2*)(dk + row + d) = make_float2(ak[p][e] * scale, ak[p][e + 1] * scale);
                const float2 v2 = round_dv ? make_float2(round_bf16(av[p][e]), round_bf16(av[p][e + 1]))
                                           : make_float2(av[p][e], av[p][e + 1]);
                if (dv) *(float2*)(dv + row + d) = v2;
                if (dv16) *(u32*)(dv16 + (seq0 + key) * ld16 + kvh * D + d) = pack2_bf16(v2.x, v2.y);
            }
    }
}

// dQ of one 64-row tile for one head: fa_bwd_q's
// sums over key tiles in order (K, V double-buffered). Per tile: S = Q K^T and
// dP = dO V^T; P from lse, dS = P (dP - delta); dQ += dS K. Thread rows: query
// rows 16 warp + lane / 4 (+8).
template <int D>
__device__ void fw_bwd_q(const bf16_t* dout, const bf16_t* q, const bf16_t* k, const bf16_t* v, const float* lse,
                         const float* delta, const int* tiles, int nh, int nkv, float sl2, float scale, float* dq) {
    constexpr int TB = FwTile<D>::BYTES, PL = D / 64;
    extern __shared__ u8 fw_raw[];
    u8* sm = align1024(fw_raw);
    u8* sQ = sm;
    u8* sO = sm + TB;
    u8* sKV = sm + 2 * TB;  // [2][K, V]
    const int h = blockIdx.x % nh, tile = blockIdx.x / nh, kvh = h / (nh / nkv);
    const int seq0 = tiles[3 * tile], q0 = tiles[3 * tile + 1], L = tiles[3 * tile + 2];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long qw = (long)nh * D, kvw = (long)nkv * D;
    const int nq = min(FW_T, L - q0);
    const bf16_t* kb = k + (long)seq0 * kvw + kvh * D;
    const bf16_t* vb = v + (long)seq0 * kvw + kvh * D;
    fw_load<D>(sQ, q + (seq0 + q0) * qw + h * D, qw, nq);
    fw_load<D>(sO, dout + (seq0 + q0) * qw + h * D, qw, nq);
    fw_load<D>(sKV, kb, kvw, min(FW_T, L));
    fw_load<D>(sKV + TB, vb, kvw, min(FW_T, L));
    cp_commit();
    const int r = q0 + warp * 16 + (lane >> 2);
    float lr[2], dr[2];
    int pos[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int ri = min(r + 8 * i, L - 1);
        pos[i] = r + 8 * i < L ? ri : -1;  // invalid rows: every key masked
        lr[i] = lse[(long)(seq0 + ri) * nh + h];
        dr[i] = delta[(long)(seq0 + ri) * nh + h];
    }
    float a[PL][32];
#pragma unroll
    for (int p = 0; p < PL; p++) zero(a[p]);
    const u32 qA = smem_addr(sQ), oA = smem_addr(sO);
    const int ntiles = (q0 + nq - 1) / FW_T + 1;
    for (int j = 0; j < ntiles; j++) {
        if (j + 1 < ntiles) {
            u8* nxt = sKV + ((j + 1) & 1) * 2 * TB;
            const long off = (long)(j + 1) * FW_T * kvw;
            const int nk = min(FW_T, L - (j + 1) * FW_T);
            fw_load<D>(nxt, kb + off, kvw, nk);
            fw_load<D>(nxt + TB, vb + off, kvw, nk);
            cp_commit();
            fw_landed<1>();
        } else {
            fw_landed<0>();
        }
        const u32 kA = smem_addr(sKV + (j & 1) * 2 * TB), vA = kA + TB;
        // P is made while dP's product runs.
        float s[32], dp[32];
        wg_fence();
        fw_mma_st<D>(s, qA, kA);
        wg_commit();
        fw_mma_st<D>(dp, oA, vA);
        wg_commit();
        wg_wait<1>();
        fence_regs(s);
        // Key tiles wholly before a tile of 64 valid rows (all but the diagonal) need no mask.
        if ((j + 1) * FW_T <= q0 && nq == FW_T) {
#pragma unroll
            for (int jj = 0; jj < 8; jj++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[4 * jj + e] = fw_exp2(s[4 * jj + e] * sl2 - lr[e >> 1]);
        } else {
#pragma unroll
            for (int jj = 0; jj < 8; jj++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = j * FW_T + jj * 8 + 2 * (lane & 3) + (e & 1);  // key position
                    s[4 * jj + e] = c <= pos[e >> 1] ? fw_exp2(s[4 * jj + e] * sl2 - lr[e >> 1]) : 0.f;
                }
        }
        wg_wait0();
        fence_regs(dp);
#pragma unroll
        for (int jj = 0; jj < 8; jj++)
#pragma unroll
            for (int e = 0; e < 4; e++) dp[4 * jj + e] = s[4 * jj + e] * (dp[4 * jj + e] - dr[e >> 1]);
        u32 da[4][4];
        fw_frags(da, dp);
        wg_fence();
#pragma unroll
        for (int p = 0; p < PL; p++) fence_regs(a[p]);
        fw_mma_pv<D>(a, da, kA);
        wg_commit();
        wg_wait0();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) fence_u32(da[kk]);
#pragma unroll
        for (int p = 0; p < PL; p++) fence_regs(a[p]);
        __syncthreads();  // everyone is done with tile j's buffer
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (pos[i] < 0) continue;
        const long row = (seq0 + r + 8 * i) * qw + h * D;
#pragma unroll
        for (int p = 0; p < PL; p++)
#pragma unroll
            for (int jj = 0; jj < 8; jj++) {
                const int e = 4 * jj + 2 * i;
                *(float2*)(dq + row + p * 64 + jj * 8 + 2 * (lane & 3)) =
                    make_float2(a[p][e] * scale, a[p][e + 1] * scale);
            }
    }
}

// Shared memory: 6 tiles (+ the lse, delta of two steps) + 1024 for the alignment.
// flash.rs `wg_smem_bytes` repeats it.
#define FW_INSTANTIATE(D)                                                                                          \
    extern "C" __global__ void __launch_bounds__(128, 2)                                                           \
        fa_bwd_kv_wg_##D(const bf16_t* dout, const bf16_t* q, const bf16_t* k, const bf16_t* v, const float* lse,   \
                         const float* delta, const int* tiles, int nh, int nkv, float sl2, float scale, float* dk,  \
                         float* dv, int round_dv, bf16_t* dv16, long ld16) {                                                      \
        pdl_entry();                                                                                               \
        fw_bwd_kv<D>(dout, q, k, v, lse, delta, tiles, nh, nkv, sl2, scale, dk, dv, round_dv, dv16, ld16);               \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(128, 2)                                                           \
        fa_bwd_q_wg_##D(const bf16_t* dout, const bf16_t* q, const bf16_t* k, const bf16_t* v, const float* lse,    \
                        const float* delta, const int* tiles, int nh, int nkv, float sl2, float scale, float* dq) { \
        pdl_entry();                                                                                               \
        fw_bwd_q<D>(dout, q, k, v, lse, delta, tiles, nh, nkv, sl2, scale, dq);                                    \
    }

// Only sm_90a has wgmma: elsewhere this module is empty and flash.rs never asks it.
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
FW_INSTANTIATE(64)
FW_INSTANTIATE(128)
#endif
