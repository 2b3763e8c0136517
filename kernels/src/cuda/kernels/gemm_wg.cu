// The batch-invariant forward GEMMs on Hopper's warpgroup MMA (sm_90a `wgmma`):
// d [M][N] = x [M, K] w [N, K]^T, the twins of the split-K decode kernel (gemm_sk,
// gemv_fp8.cu) and the rows kernel (gemm_rows.cu) for GPUs that have wgmma. sm_90
// has no E4M3 mma.sync (ptxas turns it into f16 HMMA after conversions, so FP8 ran
// at BF16's rate there); wgmma runs E4M3 at twice the BF16 rate, and reads both
// operands from shared memory, so the shared-memory bound of mma.sync goes too.
//
// One arithmetic for both kernels (group_mma below), so a row's bits do not depend
// on the kernel or the batch (rollout == training). A group is 128 values of k:
//   FP8:  four k32 wgmma steps chained from zero (part), then acc = fma(xs * ws,
//         part, acc), the terms of fp8_gemm;
//   BF16: eight k16 steps chained straight into acc.
// acc restarts at each split of gps groups (splits() in gemv.rs), and the splits
// are added in order, the first taken as is. The hardware's order inside a step
// differs from mma.sync's, so these kernels agree bit for bit with each other, not
// with the mma.sync family (gemv.rs picks one family for a device).
//
// Shared-memory tiles (both operands K-major, the only FP8 wgmma layout): rows of
// 128 bytes in the 128-byte swizzle (16-byte unit u of row r at u ^ (r & 7)),
// 8-row atoms 1024 bytes apart, tiles 1024-byte aligned. A group's row is 128 FP8
// bytes, one tile; a BF16 group (256 bytes) is two tiles ("planes"), k 0-63 and
// 64-127. A k step moves the descriptor's start 32 bytes along the row (the
// hardware applies the swizzle to the address bits). Operands stream in through
// cp.async stages (split-K) or bulk tensor copies (rows, whose copy engine writes
// the same swizzle). context.rs prepends wgmma.cuh (gen_wgmma.py) and wg_common.cuh
// (descriptors, fences, the swizzled tile loader) to this file.

// The rows kernels give each consumer warp two 2 KiB epilogue stages (warp_tile_tma),
// FP8 paying with five operand stages in place of six (the 8 x 4 KiB fit the sixth's
// space); BF16 keeps its three (227 KiB in all, the most a block may have).
// E4M3 codes, 128x128 weight blocks and 1x128 token scales.
struct Fp8W {
    static constexpr int GB = 128;                // bytes of a row's group
    static constexpr int S_SK = 4, S_ROWS = 5;  // stages of the split-K / rows kernels
    static constexpr bool FP8 = true;
};
// BF16 values, no scales.
struct Bf16W {
    static constexpr int GB = 256;
    static constexpr int S_SK = 3, S_ROWS = 3;
    static constexpr bool FP8 = false;
};

// One group for this warpgroup: A's 64 rows at shared address wt (planes wp bytes
// apart) x B's N rows at xt (planes xp apart): weight rows x tokens, except in the
// FP8 rows kernel (tokens x weight rows). FP8: d = the group's sums from zero;
// BF16: d += them.
template <class E, int N>
__device__ __forceinline__ void group_mma(float (&d)[N / 2], u32 wt, u32 wp, u32 xt, u32 xp) {
    wg_fence();
    fence_regs(d);
    if constexpr (E::FP8) {
        const u64 a = sw128_desc(wt), b = sw128_desc(xt);
#pragma unroll
        for (int j = 0; j < 4; j++) wgmma_fp8(d, a + 2 * j, b + 2 * j, j);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++)
            wgmma_bf16(d, sw128_desc(wt + (j >> 2) * wp) + 2 * (j & 3), sw128_desc(xt + (j >> 2) * xp) + 2 * (j & 3), 1);
    }
    wg_commit();
    wg_wait0();
    fence_regs(d);
}

// acc = fma(xs[token] * sw, part, acc) for the thread's N / 2 accumulators (token
// 8 j + 2 (lane % 4) (+1) of register 4 j + i): fp8_gemm's scaled group term.
template <int N>
__device__ __forceinline__ void scale_fold(float (&acc)[N / 2], const float (&part)[N / 2], const float* sx, float sw,
                                           int lane) {
#pragma unroll
    for (int j = 0; j < N / 8; j++) {
        const float2 s = *reinterpret_cast<const float2*>(sx + j * 8 + (lane & 3) * 2);
        const float s0 = s.x * sw, s1 = s.y * sw;
        acc[4 * j + 0] = __fmaf_rn(s0, part[4 * j + 0], acc[4 * j + 0]);
        acc[4 * j + 1] = __fmaf_rn(s1, part[4 * j + 1], acc[4 * j + 1]);
        acc[4 * j + 2] = __fmaf_rn(s0, part[4 * j + 2], acc[4 * j + 2]);
        acc[4 * j + 3] = __fmaf_rn(s1, part[4 * j + 3], acc[4 * j + 3]);
    }
}

// ---- split-K decode kernel: gemm_sk's grid and outputs ----------------------------
// Block = one warpgroup = 64 weight rows x NT tokens; grid (ceil(N/64), splits, token
// chunks of NT): block (bx, ks, c) takes groups [ks*gps, (ks+1)*gps) and writes its
// partial sums to p[ks][token][n] (stride ldp, slices sstride apart). Dynamic shared
// memory: WgSkSmem<E, NT>::BYTES (gemv.rs `WgKernel::smem_bytes` repeats it).
template <class E, int NT>
struct WgSkSmem {
    static constexpr int S = E::S_SK, WT = 64 * E::GB, STAGE = WT + NT * E::GB;
    static constexpr int BYTES = S * STAGE + S * NT * 4 + 1024;
};

// Block (bx, by, bz): weight rows bx * 64.., split by, tokens bz * NT..
template <class E, int NT>
__device__ void wg_sk_at(const u8* __restrict__ w, const float* __restrict__ ws, int lds, const u8* __restrict__ x,
                         const float* __restrict__ xs, int ldxs, float* __restrict__ p, long ldp, long sstride, int M,
                         int N, int N_pad, int K_pad, int gps, int bx, int by, int bz) {
    using SM = WgSkSmem<E, NT>;
    constexpr int S = SM::S, GB = E::GB;
    extern __shared__ u8 smem_raw[];
    u8* smem = align1024(smem_raw);
    float* sxs = reinterpret_cast<float*>(smem + S * SM::STAGE);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n0 = bx * 64, t0 = bz * NT;
    const int L = (K_pad + 127) / 128;
    const long RB = (long)K_pad * (GB / 128);  // bytes of a row
    x += (long)t0 * RB;
    if (E::FP8) xs += t0;
    p += (long)t0 * ldp;
    M = min(M - t0, NT);
    const int g0 = by * gps, g1 = min(L, g0 + gps);
    const u8* wsrc = w + (long)n0 * RB;
    const float* wsr = ws + (E::FP8 ? (long)(n0 / 128) * lds : 0);
    auto load = [&](int g) {
        if (g < g1) {
            const int b = (g - g0) % S;
            u8* st = smem + b * SM::STAGE;
            load_tile<GB, 64, 128>(st, wsrc, RB, (long)g * GB, N_pad - n0, tid);
            load_tile<GB, NT, 128>(st + SM::WT, x, RB, (long)g * GB, M, tid);
            if (E::FP8 && tid < NT) cp4(sxs + b * NT + tid, xs + (tid < M ? (long)g * ldxs + tid : 0), tid < M);
        }
        cp_commit();
    };

    float acc[NT / 2];
    zero(acc);
    const u32 sbase = smem_addr(smem);
#pragma unroll
    for (int s = 0; s < S - 1; s++) load(g0 + s);
    for (int g = g0; g < g1; g++) {
        // Group g has landed and every thread is done with group g - 1's stage.
        cp_wait<S - 2>();
        fence_async_smem();
        __syncthreads();
        load(g + S - 1);
        const int b = (g - g0) % S;
        const u32 wt = sbase + b * SM::STAGE, xt = wt + SM::WT;
        if constexpr (E::FP8) {
            float part[NT / 2];
            group_mma<E, NT>(part, wt, 0, xt, 0);
            scale_fold<NT>(acc, part, sxs + b * NT, wsr[g], lane);
        } else {
            group_mma<E, NT>(acc, wt, 64 * 128, xt, NT * 128);
        }
    }
    cp_wait<0>();
    float* out = p + (long)by * sstride;
#pragma unroll
    for (int r = 0; r < NT / 2; r++) {
        const int row = n0 + warp * 16 + (lane >> 2) + ((r & 2) ? 8 : 0);
        const int tok = (r >> 2) * 8 + (lane & 3) * 2 + (r & 1);
        if (row < N && tok < M) out[(long)tok * ldp + row] = acc[r];
    }
}

template <class E, int NT>
__device__ __forceinline__ void wg_sk(const u8* w, const float* ws, int lds, const u8* x, const float* xs, int ldxs,
                                      float* p, long ldp, long sstride, int M, int N, int N_pad, int K_pad, int gps) {
    wg_sk_at<E, NT>(w, ws, lds, x, xs, ldxs, p, ldp, sstride, M, N, N_pad, K_pad, gps, blockIdx.x, blockIdx.y,
                    blockIdx.z);
}

#define WG_SK(NAME, E, NT) SK_KERNEL(NAME, (128), wg_sk<E, NT>)

// Up to three split-K GEMMs of one X (the q, k, v or gate, up projections of a
// decode step) in one launch: problem i takes the next `blocks` = nbx * ks * nz
// blocks of grid x after problem i - 1's (nz token chunks), block b of it being
// (b / nz % nbx, b / nz / nbx, b % nz) of its own launch, so each output's bits are
// those of wg_sk alone. A weight tile's token chunks run side by side (its second
// read from L2; grid z order put all three weights between them, 48 MB at 8B).
// gemv.rs `SkGroup` lays it out.
struct SkProb {
    const u8* w;
    const float* ws;
    float* p;
    long ldp, sstride;
    int lds, N, N_pad, gps, nbx, blocks;
};
struct SkGroup {
    SkProb pr[3];
    int count, pad_;
};
#define WG_SKG(NAME, E, NT)                                                                                     \
    extern "C" __global__ void __launch_bounds__(128)                                                           \
        NAME(SkGroup g, const u8* x, const float* xs, int ldxs, int M, int K_pad, int nz) {                    \
        pdl_entry();                                                                                            \
        int b = blockIdx.x;                                                                                     \
        SkProb P = g.pr[0];                                                                                     \
        if (g.count > 1 && b >= g.pr[0].blocks) {                                                               \
            b -= g.pr[0].blocks;                                                                                \
            P = g.pr[1];                                                                                        \
            if (g.count > 2 && b >= g.pr[1].blocks) {                                                           \
                b -= g.pr[1].blocks;                                                                            \
                P = g.pr[2];                                                                                    \
            }                                                                                                   \
        }                                                                                                       \
        const int bz = b % nz;                                                                                  \
        b /= nz;                                                                                                \
        wg_sk_at<E, NT>(P.w, P.ws, P.lds, x, xs, ldxs, P.p, P.ldp, P.sstride, M, P.N, P.N_pad, K_pad, P.gps,  \
                        b % P.nbx, b / P.nbx, bz);                                                              \
    }

// ---- rows kernel: gemm_rows's sums, fed by the tensor memory accelerator -----------
// Each 128 x 128 tile walks all K groups: acc restarts every gps groups and tot =
// slice 0 + slice 1 + ... is the split-K launch's in-order sum of its partials, so
// a row's bits equal the decode kernel's. The loads and the math are decoupled
// (warp-specialized): a producer thread issues bulk tensor copies (TMA: the 128-byte
// swizzle applied by the copy engine, rows and bytes past the tensor's end
// zero-filled) into S stages; two consumer warpgroups wait on a stage's "full"
// barrier, run its wgmma and fold, and free it on its "empty" barrier. No block-wide
// barrier in the loop, so one warpgroup's fold runs while the other's wgmma does.
// Persistent: gridDim.x blocks walk the 128 x 128 tiles (token tile fastest), and
// the producer fills the next tile's stages during the consumers' epilogue.
// Warpgroups 0-1 consume (232 registers: part, acc, tot), warpgroup 2 produces (40):
// thread 256 issues the copies.
// Operand roles: FP8 gives wgmma a warpgroup's 64 tokens as A and the tile's 128
// weight rows as B, so a thread's accumulators are two tokens' (tile_out_tm's
// layout) and its fold needs two scale products a group, which each consumer makes
// itself (xs[token] * ws, scale_fold's FMUL; the loads issued before the group's
// MMAs). The k-sum of an output is the same dot product of the same codes either
// way round: the same bits as the decode kernel's weights-as-A MMAs (cuda_invariant,
// cuda_parity, gpu_parity; H100, forty-fourth and forty-fifth sessions). With the
// weights as A a thread held 32 tokens: 32 products a group (16 LDS.64), made by a
// scaler warp; against that the FP8 GEMMs ran 5-6% faster alone at 8B shapes and
// 3-5% at 0.6B (k/v 2% slower), and the 8B-4l fp8 training step 67.06 -> 65.42 ms.
// BF16 (no fold) ran 3-10% slower with its tokens as A, so it keeps the weights as
// A (tile_out's layout).
struct alignas(64) TMap {
    u64 v[16];
};

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Wait until the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile(
            "{\n.reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
// Box (c0, c1) of the 2-D tensor map at generic address `map` into shared dst; the
// bytes count on barrier bar.
__device__ __forceinline__ void tma_2d(u32 dst, const TMap* map, int c0, int c1, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
        "l"((u64)map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// The reverse copy: shared src (a box of the map, in its swizzle) to the tensor at
// (c0, c1), elements past the tensor's end not written; asynchronous (the copy
// engine reads src and writes global while the thread goes on), one bulk group a
// commit. Before src is written again: bulk_wait_read1 (its reads are done).
__device__ __forceinline__ void tma_store_2d(const TMap* map, int c0, int c1, u32 src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"((u64)map),
                 "r"(c0), "r"(c1), "r"(src)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// All but the latest group's reads done.
__device__ __forceinline__ void bulk_wait_read1() { asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

#define EPI_STAGE 2048
// Prepared, not yet run on a GPU (JET_NVRTC_DEFINES=ROWS_HW_PACK=1; off, so the
// default build's SASS is the measured one): the rows kernels' BF16 outputs packed
// by the hardware conversion where the warp's tile holds no NaN (pack2_bf16_as,
// warp_tile_tma) and epi_value's software rounding skipped (the pack rounds); the
// f32 outputs' round-1 tiles (o, down before their residual) rounded the same way
// (round_bf16_tile): the same bits. bench/results/s62/call3.sh times it and runs
// the bit checks.
#ifndef ROWS_HW_PACK
#define ROWS_HW_PACK 0
#endif
// The element offset in the stage of (token, row) of the [token][16 rows] tile.
__device__ __forceinline__ int epi_at(int tok, int r) { return tok * 16 + (((r >> 3) ^ ((tok >> 2) & 1)) << 3) + (r & 7); }
// Pass c of warp_tile_store (its CT = 64 tokens: tokens 64 c .. 64 c + 63) into the
// stage at shared address sbase. Instruction m stores blocks (j, h) = (2m, 0), (2m,
// 1), (2m + 1, 0), (2m + 1, 1) of the pass (j counted from 8 c); lane l gives block
// l / 8's row l % 8, i.e. token 8 j + l % 8, half h. v is a BF16 value (rounded):
// exact.
template <bool HW = false>
__device__ __forceinline__ void stage_pass(const float (&v)[64], u32 sbase, int c, int lane) {
#pragma unroll
    for (int m = 0; m < 4; m++) {
        const int q = lane >> 3, tok = 8 * (2 * m + (q >> 1)) + (lane & 7);
        const u32 addr = sbase + 2 * epi_at(tok, 8 * (q & 1));
        const int j0 = c * 8 + 2 * m;
        asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
                     "r"(pack2_bf16_as<HW>(v[4 * j0 + 0], v[4 * j0 + 1])),
                     "r"(pack2_bf16_as<HW>(v[4 * j0 + 2], v[4 * j0 + 3])),
                     "r"(pack2_bf16_as<HW>(v[4 * j0 + 4], v[4 * j0 + 5])),
                     "r"(pack2_bf16_as<HW>(v[4 * j0 + 6], v[4 * j0 + 7]))
                     : "memory");
    }
}
// A warp's 16 rows x 128 BF16 outputs through its own EPI_STAGE bytes of shared
// memory, CT tokens at a time: the accumulator layout (register 4 j + 2 h + i holds
// row lane / 4 + 8 h, token 8 j + 2 (lane % 4) + i) goes to a [token][16 rows]
// tile, then each token's 16 values (32 contiguous bytes of y) leave as 16-byte
// stores. Stored from registers, each 2-byte store instruction wrote 16-byte pieces
// of four rows: 1.9 ms slower a 0.6B step than the f32 stores (32-byte pieces),
// which stay direct (staged, they ran 2-14% slower: H100, twentieth session).
// The tile is written by stmatrix .trans (the accumulators' 8 x 8 blocks are mma
// fragments, row = weight row, column = token; transposed, a block's memory row is
// a token's 8 weight rows): four instructions a pass where 2-byte shared stores
// took 32 (the BF16-out GEMMs about 2% faster: H100, forty-second session). A token's
// two 16-byte halves (rows 0-7, 8-15) swap places in tokens 4-7 of every 8 (half ^
// (token >> 2 & 1)), so a block's eight rows, 32 bytes apart, fill all 32 banks.
// out: the warp's (row 0, token 0) of y, row stride ld; rows_ok (1-16) rows and toks
// tokens to write.
__device__ __forceinline__ void warp_tile_store(const float (&v)[64], bf16_t* out, long ld, int rows_ok, int toks,
                                                bf16_t* st, int lane) {
    constexpr int CT = EPI_STAGE / 32;  // tokens a pass: 16 rows x 2 bytes each
    static_assert(CT == 64, "stage_pass writes 64 tokens a pass");
    const bool vec = rows_ok == 16 && (((u64)out | (u64)(ld * 2)) & 15) == 0;
#pragma unroll
    for (int c = 0; c < 128 / CT; c++) {
        if (c * CT >= toks) break;  // warp-uniform
        const u32 sbase = smem_addr(st);
        stage_pass(v, sbase, c, lane);
        __syncwarp();
        const int left = toks - c * CT;
        bf16_t* oc = out + (long)(c * CT) * ld;
        if (vec) {
#pragma unroll
            for (int pp = 0; pp < CT * 2 / 32; pp++) {  // two 16-byte halves a token
                const int p = pp * 32 + lane, tok = p >> 1, q = p & 1;
                if (tok < left)
                    *reinterpret_cast<uint4*>(oc + (long)tok * ld + q * 8) =
                        *reinterpret_cast<const uint4*>(st + epi_at(tok, 8 * q));
            }
        } else {
            for (int e = lane; e < CT * 16; e += 32) {
                const int tok = e >> 4, r = e & 15;
                if (tok < left && r < rows_ok) oc[(long)tok * ld + r] = st[epi_at(tok, r)];
            }
        }
        __syncwarp();
    }
}

// The rows kernels' BF16 outputs: the warps' staged tiles leave through the copy
// engine (tma_store_2d, one lane a warp) where the output is 16-byte aligned, in
// place of the warp's 16-byte stores (warp_tile_store, kept for the rest), so the
// consumers go on to the next tile's MMAs while the bytes drain: FP8 q 30.6 ->
// 29.2 us, gate/up 43.9 -> 42.2, LM head 1,931 -> 1,772 alone; the 0.6B fp8 step
// 44.81 -> 44.24 ms, bf16 47.45 -> 47.08 (H100, sixty-first session, call 1).
// The stage tiles are already the maps' swizzled boxes: the FP8 (tokens-as-A)
// [16 tokens][64 columns] tile is the 128-byte swizzle (unit u of row r at u ^
// (r & 7), the stage 1024-byte aligned), the BF16 (weights-as-A) [64 tokens][16
// rows] tile the 32-byte swizzle (half ^ (token >> 2 & 1), epi_at). Same values:
// the same bits. The lane that issues a warp's copies waits for their reads
// before the stage is written again and for their writes at the kernel's end.
//
// A warp's staged tile to y through the copy engine, in two passes of 64 along its
// long side, each the box of ty at (c0, c1) + 64 c along that side:
//   TM (tokens as A): warp_tile_store_tm's 16 tokens x 128 columns, box 64 columns
//       x 16 tokens at (n0 + 64 c, tw) (c0 = n0, c1 = tw, n = columns to write);
//   else (weights as A): warp_tile_store's 16 weight rows x 128 tokens, box 16
//       columns x 64 tokens at (rw, t0 + 64 c) (c0 = rw, c1 = t0, n = tokens).
// The stage is written as those functions write it (stage_pass_tm, stage_pass).
// The warp's passes alternate between its two 2 KiB stages by its running count kb
// (a tile of one pass, n <= 64, would break an alternation by c); before a stage
// is written, only the warp's latest copy, the other stage's, may still be
// reading. Against one stage (a tile's second pass waiting for the copy engine to
// read its first), FP8 q 29.0 -> 28.5 us, gate/up 42.0 -> 40.8, BF16 q 37.8 ->
// 36.8, gate/up 55.9 -> 54.1; the 0.6B fp8 step 44.07 -> 43.95 ms, bf16 46.69 ->
// 46.65 (H100, sixty-second session, call 1): the first pass's read was not what
// held the kernel (the guess was q ~22-24 us).
// ROWS_HW_PACK: v unrounded (the pack rounds them: pack2_bf16 of round_bf16's value
// is pack2_bf16's), their pairs by the hardware conversion where no value of the
// warp's tile is NaN (pack2_bf16_as), else by pack2_bf16.
template <bool TM>
__device__ __forceinline__ void warp_tile_tma(const float (&v)[64], const TMap* ty, int c0, int c1, int n, u8* st,
                                              int& kb, int lane) {
    const u32 s0 = smem_addr(st);
    const bool hw = ROWS_HW_PACK && !tile_has_nan(v);
#pragma unroll
    for (int c = 0; c < 2; c++) {
        if (c * 64 >= n) break;  // warp-uniform
        const u32 sbase = s0 + (kb++ & 1) * EPI_STAGE;
        if (lane == 0) bulk_wait_read1();
        __syncwarp();
        if (hw) {
            if constexpr (TM) stage_pass_tm<true>(v, sbase, c, lane);
            else stage_pass<true>(v, sbase, c, lane);
        } else {
            if constexpr (TM) stage_pass_tm<false>(v, sbase, c, lane);
            else stage_pass<false>(v, sbase, c, lane);
        }
        fence_async_smem();
        __syncwarp();
        if (lane == 0) tma_store_2d(ty, TM ? c0 + 64 * c : c0, TM ? c1 : c1 + 64 * c, sbase);
    }
}

// A warpgroup's 64 x 128 totals out: rows_out's ops per value (the same bits), the
// bias and residual read where the thread's rows are (rb and rb + 8, < N) and its
// tokens t = tb + 8 j + i (i < 2) are below M. f32 straight from the registers;
// BF16 (round == EPI_BF16, no residual; with ROWS_HW_PACK epi_value without its
// rounding, which the pack does: the same bits) through warp_tile_tma<false> (ty_ok:
// y's map ty) or warp_tile_store. rw: the warp's first row; t0: the tile's first token;
// stage: the warp's 2 x EPI_STAGE bytes.
__device__ __forceinline__ void tile_out(float (&tot)[64], int rw, int t0, int M, int N, float* d, long ldd, float* y,
                                         long ldy, const float* bias, int round, const float* res, u8* stage,
                                         const TMap* ty, int ty_ok, int& kb, int lane) {
    const int rb = rw + (lane >> 2), tb = t0 + (lane & 3) * 2, mt = M - tb;
    const bool ok0 = rb < N, ok1 = rb + 8 < N;
    if (y && round == EPI_BF16) {
        const float b0 = (bias && ok0) ? bias[rb] : 0.0f, b1 = (bias && ok1) ? bias[rb + 8] : 0.0f;
#pragma unroll
        for (int r = 0; r < 64; r++)
            tot[r] = epi_value(tot[r], bias, (r & 2) ? b1 : b0, ROWS_HW_PACK ? 0 : round, false, 0.0f);
        const int rows_ok = min(16, N - rw), toks = min(128, M - t0);
        if (ty_ok) {
            if (rows_ok > 0 && toks > 0) warp_tile_tma<false>(tot, ty, rw, t0, toks, stage, kb, lane);
            return;
        }
        if (rows_ok > 0 && toks > 0)
            warp_tile_store(tot, reinterpret_cast<bf16_t*>(y) + (long)t0 * ldy + rw, ldy, rows_ok, toks,
                            reinterpret_cast<bf16_t*>(stage), lane);
        return;
    }
    const long ld = y ? ldy : ldd;
    float* out = (y ? y : d) + (long)tb * ld + rb;
    const float* rp = res ? res + (long)tb * ld + rb : nullptr;
    const float b0 = (y && bias && ok0) ? bias[rb] : 0.0f, b1 = (y && bias && ok1) ? bias[rb + 8] : 0.0f;
    // ROWS_HW_PACK: epi_value's bias and BF16 rounding (round 1) on the whole tile
    // first (round_bf16_tile: the hardware conversion where no value is NaN), then
    // only the residual below: the same operations in the same order.
    const bool pre = ROWS_HW_PACK && y && round == 1;
    if (pre) {
        if (bias) {
#pragma unroll
            for (int r = 0; r < 64; r++) tot[r] += (r & 2) ? b1 : b0;
        }
        round_bf16_tile(tot);
    }
    const float* eb = pre ? nullptr : bias;
    const int er = pre ? 0 : round;
    if (y && rp) {
        // With a residual, half the tile's residual values are loaded before any of
        // their stores: in the loop below each load waited behind the previous
        // value's store (the compiler cannot tell out from res), one memory latency
        // a value pair, which made the o and down projections run twice as long
        // in a training step as without it (ncu, H100, twenty-fifth session). The
        // same epi_value on the same values: the same bits.
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float r[8][2][2];
#pragma unroll
            for (int jj = 0; jj < 8; jj++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int t = 8 * (8 * h + jj) + i;
                    const long o = (long)t * ld;
                    r[jj][i][0] = (t < mt && ok0) ? rp[o] : 0.0f;
                    r[jj][i][1] = (t < mt && ok1) ? rp[o + 8] : 0.0f;
                }
#pragma unroll
            for (int jj = 0; jj < 8; jj++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int j = 8 * h + jj;
                    if (8 * j + i >= mt) continue;
                    const long o = (long)(8 * j + i) * ld;
                    const float v0 = epi_value(tot[4 * j + i], eb, b0, er, true, r[jj][i][0]);
                    const float v1 = epi_value(tot[4 * j + 2 + i], eb, b1, er, true, r[jj][i][1]);
                    if (ok0) out[o] = v0;
                    if (ok1) out[o + 8] = v1;
                }
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < 16; j++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            if (8 * j + i >= mt) continue;
            const long o = (long)(8 * j + i) * ld;
            float v0 = tot[4 * j + i], v1 = tot[4 * j + 2 + i];
            if (y) {
                v0 = epi_value(v0, eb, b0, er, rp, rp && ok0 ? rp[o] : 0.0f);
                v1 = epi_value(v1, eb, b1, er, rp, rp && ok1 ? rp[o + 8] : 0.0f);
            }
            if (ok0) out[o] = v0;
            if (ok1) out[o + 8] = v1;
        }
    }
}

// tile_out for the tokens-as-A layout: the same epi_value a value (the same bits),
// each thread's tokens tw + lane / 4 (+8) below M and columns c = n0 + 8 j + 2 (lane
// % 4) (+1) below N. f32 (d, or y with bias / residual) as 8-byte stores, a token's
// residual pairs all loaded before its stores; BF16 (round == EPI_BF16, no residual;
// with ROWS_HW_PACK epi_value without its rounding, as tile_out) through
// warp_tile_tma<true> (ty_ok: y's map ty; kb its pass count) or
// warp_tile_store_tm. tw: the warp's first token; stage: its 2 x EPI_STAGE
// bytes.
__device__ __forceinline__ void tile_out_tm(float (&tot)[64], int tw, int n0, int M, int N, float* d, long ldd,
                                            float* y, long ldy, const float* bias, int round, const float* res,
                                            u8* stage, const TMap* ty, int ty_ok, int& kb, int lane) {
    const int cb = n0 + 2 * (lane & 3);
    // The thread's 16 column pairs' bias (y's epilogue only), loaded once for both
    // of its tokens.
    float2 bb[16];
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int c = cb + 8 * j;
        bb[j] = make_float2((y && bias && c < N) ? bias[c] : 0.0f, (y && bias && c + 1 < N) ? bias[c + 1] : 0.0f);
    }
    if (y && round == EPI_BF16) {
#pragma unroll
        for (int j = 0; j < 16; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                tot[4 * j + 2 * h] =
                    epi_value(tot[4 * j + 2 * h], bias, bb[j].x, ROWS_HW_PACK ? 0 : round, false, 0.0f);
                tot[4 * j + 2 * h + 1] =
                    epi_value(tot[4 * j + 2 * h + 1], bias, bb[j].y, ROWS_HW_PACK ? 0 : round, false, 0.0f);
            }
        const int toks = min(16, M - tw), cols = min(128, N - n0);
        if (ty_ok) {
            if (toks > 0 && cols > 0) warp_tile_tma<true>(tot, ty, n0, tw, cols, stage, kb, lane);
            return;
        }
        if (toks > 0 && cols > 0)
            warp_tile_store_tm(tot, reinterpret_cast<bf16_t*>(y) + (long)tw * ldy + n0, ldy, toks, cols, stage, lane);
        return;
    }
    const long ld = y ? ldy : ldd;
    float* base = y ? y : d;
    const float* rs = y ? res : nullptr;
    // ROWS_HW_PACK: bias and rounding on the whole tile first, as tile_out.
    const bool pre = ROWS_HW_PACK && y && round == 1;
    if (pre) {
        if (bias) {
#pragma unroll
            for (int j = 0; j < 16; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    tot[4 * j + 2 * h] += bb[j].x;
                    tot[4 * j + 2 * h + 1] += bb[j].y;
                }
        }
        round_bf16_tile(tot);
    }
    const float* eb = pre ? nullptr : bias;
    const int er = pre ? 0 : round;
    const bool vec = (((u64)base | (u64)rs) & 7) == 0 && (ld & 1) == 0;  // bias is read as scalars
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int tok = tw + (lane >> 2) + 8 * h;
        if (tok >= M) continue;
        float* orow = base + (long)tok * ld;
        const float* rrow = rs ? rs + (long)tok * ld : nullptr;
        // The residual's pairs of this token, all loaded before any store (the
        // compiler cannot tell out from res: see tile_out).
        float2 r[16];
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int c = cb + 8 * j;
            r[j] = make_float2(0.0f, 0.0f);
            if (!rrow) continue;
            if (vec && c + 1 < N) {
                r[j] = *reinterpret_cast<const float2*>(rrow + c);
            } else {
                if (c < N) r[j].x = rrow[c];
                if (c + 1 < N) r[j].y = rrow[c + 1];
            }
        }
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int c = cb + 8 * j;
            float v0 = tot[4 * j + 2 * h], v1 = tot[4 * j + 2 * h + 1];
            if (y) {
                v0 = epi_value(v0, eb, bb[j].x, er, rrow, r[j].x);
                v1 = epi_value(v1, eb, bb[j].y, er, rrow, r[j].y);
            }
            if (vec && c + 1 < N) {
                *reinterpret_cast<float2*>(orow + c) = make_float2(v0, v1);
            } else {
                if (c < N) orow[c] = v0;
                if (c + 1 < N) orow[c + 1] = v1;
            }
        }
    }
}

// Dynamic shared memory: stages (W tile then X tile, GB / 128 planes of 128 rows x
// 128 bytes each), the token scales of each stage (FP8), the full and empty
// barriers, then the 8 consumer warps' epilogue tiles (gemv.rs repeats BYTES).
template <class E>
struct WgTmaSmem {
    static constexpr int S = E::S_ROWS, WT = 128 * E::GB, STAGE = 2 * WT;
    // The consumer warps' epilogue tiles (EPI_STAGE bytes each) after the barriers.
    // 1024-byte aligned: the BF16 outputs' copies read the tiles in the maps' swizzles.
    static constexpr int EPI = (S * STAGE + S * 128 * 4 + 2 * S * 8 + 1023) / 1024 * 1024;
    static constexpr int BYTES = EPI + 8 * 2 * EPI_STAGE + 1024;
};
// gemv.rs launch_rows_tma allocates these sizes (its wg_geometry's stages: FP8 five,
// BF16 three; two epilogue stages a warp).
static_assert(WgTmaSmem<Fp8W>::BYTES == 200704, "gemv.rs launch_rows_tma's FP8 shared memory");
static_assert(WgTmaSmem<Bf16W>::BYTES == 232448, "gemv.rs launch_rows_tma's BF16 shared memory (227 KiB)");

// tot += acc, then acc = 0: the end of a split slice when tot starts at -0.
__device__ __forceinline__ void add_slice(float (&tot)[64], float (&acc)[64]) {
#pragma unroll
    for (int r = 0; r < 64; r++) {
        tot[r] += acc[r];
        acc[r] = 0.0f;
    }
}

#ifndef ROWS_NO_STORE
#define ROWS_NO_STORE 0
#endif
// Measurement only (JET_NVRTC_DEFINES=ROWS_BF16_WARP_STORES=1): the BF16 outputs
// by the warps' 16-byte stores as before the sixty-first session (ty_ok ignored),
// to time the copy engine's stores against them at other shapes.
#ifndef ROWS_BF16_WARP_STORES
#define ROWS_BF16_WARP_STORES 0
#endif
// Prepared, not yet run on a GPU (JET_NVRTC_DEFINES=ROWS_STAGE_RUN=1; off): the
// consumers' stage index and full-barrier phase kept as running counters in place of
// it % S and (it / S) & 1 each group (S is 5 for FP8: a multiply-high, shifts and a
// subtract on the path from one group's wait to the next one's MMAs). The same
// stages in the same order: the same bits.
#ifndef ROWS_STAGE_RUN
#define ROWS_STAGE_RUN 0
#endif
// Prepared, not yet run on a GPU (JET_NVRTC_DEFINES=ROWS_SKEW=G; off at 0). The
// two consumer warpgroups take each tile's halves in lockstep, so both run the
// per-tile epilogue at once while the tensor cores wait (38% of the FP8 kernel's
// warp samples at 0.6B's q shape, where a tile is only eight groups: ncu, H100,
// sixty-second session). Here the second starts its first tile G groups (at most
// S) after the first: a one-time offset, which nothing pulls back and the stages
// cap (warpgroup 0 keeps S - G stages of prefetch), so one's epilogue can run under
// the other's MMAs, as a ping-pong schedule would have it, without giving up the
// shared W tile. An epilogue hides at most G groups of the other's MMAs
// (warpgroup 0's) or S - G (warpgroup 1's): G ~ S / 2. Each warpgroup does the
// same work in the same order: the same bits. (Not the sixteenth session's turns
// at issuing, which alternated every group's MMAs and was 4-5% slower.)
#ifndef ROWS_SKEW
#define ROWS_SKEW 0
#endif
// tw: W [N_pad rows][K_pad], tx: X [M rows][K_pad] (boxes of 128 bytes x 128 rows);
// txs (FP8): the token scales [L][M] f32 (box 128 tokens x 1 group).
template <class E>
__device__ void wg_rows_tma(const TMap* tw, const TMap* tx, const TMap* txs, const float* __restrict__ ws, int lds,
                            float* __restrict__ d, long ldd, int M, int N, int K_pad, int gps,
                            float* __restrict__ y, long ldy, const float* __restrict__ bias, int round,
                            const float* __restrict__ res, const TMap* ty, int ty_ok) {
    using SM = WgTmaSmem<E>;
    constexpr int S = SM::S, GB = E::GB, PLANES = GB / 128, EPP = E::FP8 ? 128 : 64;  // elements a plane row
    constexpr u32 TX_BYTES = SM::STAGE + (E::FP8 ? 128 * 4 : 0);
    extern __shared__ u8 smem_raw[];
    u8* smem = align1024(smem_raw);
    // Shared: stages, token scales [S][128], then the full and empty barriers.
    const u32 sbase = smem_addr(smem), sxs = sbase + S * SM::STAGE, full = sxs + S * 128 * 4, empty = full + S * 8;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int L = (K_pad + 127) / 128, tiles_m = (M + 127) / 128, tiles = tiles_m * ((N + 127) / 128);
    if (tid == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(full + s * 8, 1);
            mbar_init(empty + s * 8, 8);  // a consumer warp each
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (wg == 2) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (tid == 256) {
            int it = 0;
            for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
                const int t0 = (t % tiles_m) * 128, n0 = (t / tiles_m) * 128;
                for (int g = 0; g < L; g++, it++) {
                    const int s = it % S;
                    if (it >= S) mbar_wait(empty + s * 8, ((it / S) - 1) & 1);
                    const u32 bar = full + s * 8, st = sbase + s * SM::STAGE;
                    mbar_expect_tx(bar, TX_BYTES);
#pragma unroll
                    for (int p = 0; p < PLANES; p++) {
                        tma_2d(st + p * 128 * 128, tw, g * 128 + p * EPP, n0, bar);
                        tma_2d(st + SM::WT + p * 128 * 128, tx, g * 128 + p * EPP, t0, bar);
                    }
                    if (E::FP8) tma_2d(sxs + s * 512, txs, t0, g, bar);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        if (ROWS_BF16_WARP_STORES) ty_ok = 0;
        // FP8: this thread's two tokens' scales in a stage (tokens lane / 4 (+8) of its warp's 16).
        const float* sx = reinterpret_cast<const float*>(smem + S * SM::STAGE) + wg * 64 + warp * 16 + (lane >> 2);
        int it = 0, kb = 0;  // kb: the warp's copy-engine passes so far (warp_tile_tma)
        int rs = 0, rph = 0;  // ROWS_STAGE_RUN: it % S and (it / S) & 1, run along
        // ROWS_SKEW: warpgroup 1 waits on named barrier 1 until warpgroup 0 has
        // taken SKEW groups (it can take S before the producer needs warpgroup 1's
        // empty arrivals: no deadlock), or has run out of groups.
        constexpr int SKEW = ROWS_SKEW < S ? ROWS_SKEW : S;
        bool skew_due = SKEW > 0 && wg == 0;
        if (SKEW > 0 && wg == 1) asm volatile("bar.sync 1, 256;" ::: "memory");
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            const int t0 = (t % tiles_m) * 128, n0 = (t / tiles_m) * 128;
            // tot starts at -0, the identity of +: tot + slice 0 = slice 0, bits and
            // signed zeros included (fold_slice's "first taken as is").
            float acc[64], tot[64];
            zero(acc);
#pragma unroll
            for (int r = 0; r < 64; r++) tot[r] = -0.0f;
            int fold_at = gps;
            for (int g = 0; g < L; g++, it++) {
                const int s = ROWS_STAGE_RUN ? rs : it % S;
                mbar_wait(full + s * 8, ROWS_STAGE_RUN ? rph : (it / S) & 1);
                if constexpr (E::FP8) {
                    // A: this warpgroup's 64 tokens of the X tile; B: the tile's 128 weight rows.
                    const u32 at = sbase + s * SM::STAGE + SM::WT + wg * 64 * 128, bt = sbase + s * SM::STAGE;
                    // The scales' loads in flight during the MMAs, then scale_fold's
                    // FMUL and FMAs for the thread's two tokens.
                    const float x0 = sx[s * 128], x1 = sx[s * 128 + 8], w = ws[(long)(n0 / 128) * lds + g];
                    float part[64];
                    group_mma<E, 128>(part, at, 0, bt, 0);
                    const float s0 = __fmul_rn(x0, w), s1 = __fmul_rn(x1, w);
#pragma unroll
                    for (int j = 0; j < 16; j++) {
                        acc[4 * j + 0] = __fmaf_rn(s0, part[4 * j + 0], acc[4 * j + 0]);
                        acc[4 * j + 1] = __fmaf_rn(s0, part[4 * j + 1], acc[4 * j + 1]);
                        acc[4 * j + 2] = __fmaf_rn(s1, part[4 * j + 2], acc[4 * j + 2]);
                        acc[4 * j + 3] = __fmaf_rn(s1, part[4 * j + 3], acc[4 * j + 3]);
                    }
                } else {
                    const u32 at = sbase + s * SM::STAGE + wg * 64 * 128, bt = sbase + s * SM::STAGE + SM::WT;
                    group_mma<E, 128>(acc, at, 128 * 128, bt, 128 * 128);
                }
                __syncwarp();
                if (lane == 0) mbar_arrive(empty + s * 8);
                if (ROWS_STAGE_RUN && ++rs == S) rs = 0, rph ^= 1;
                if (skew_due && it + 1 == SKEW) {
                    asm volatile("bar.arrive 1, 256;" ::: "memory");
                    skew_due = false;
                }
                if (g + 1 == fold_at || g + 1 == L) {
                    add_slice(tot, acc);
                    fold_at += gps;
                }
            }
#if ROWS_NO_STORE
            // Measurement only (JET_NVRTC_DEFINES=ROWS_NO_STORE=1): the tile's
            // totals summed (so no MMA or fold is dead) and the stores skipped
            // (the sum is never that value in practice): the kernel without its
            // epilogue. At 0.6B's q shape the FP8 kernel's f32 stores were a third
            // of it (31.1 -> 20.0 us; fifty-eighth session, H100).
            float chk = 0.0f;
#pragma unroll
            for (int r = 0; r < 64; r++) chk += tot[r];
            if (chk != 1.2345e-30f) continue;
#endif
            u8* stage = smem + SM::EPI + (wg * 4 + warp) * 2 * EPI_STAGE;
            if constexpr (E::FP8)
                tile_out_tm(tot, t0 + wg * 64 + warp * 16, n0, M, N, d, ldd, y, ldy, bias, round, res, stage, ty,
                            ty_ok, kb, lane);
            else
                tile_out(tot, n0 + wg * 64 + warp * 16, t0, M, N, d, ldd, y, ldy, bias, round, res, stage, ty, ty_ok,
                         kb, lane);
        }
        if (skew_due) asm volatile("bar.arrive 1, 256;" ::: "memory");  // fewer than SKEW groups
        if (lane == 0) bulk_wait_all();  // the copies' writes done before the grid ends
    }
}

// The rows kernel's parameters with the operands as tensor maps (gemv.rs
// `launch_rows_tma`); the maps are kernel parameters (__grid_constant__: the copy
// engine reads them where they are).
#define WG_ROWS_TMA(NAME, E)                                                                                         \
    extern "C" __global__ void __launch_bounds__(384, 1)                                                           \
        NAME(const __grid_constant__ TMap tw, const __grid_constant__ TMap tx, const __grid_constant__ TMap txs,    \
             const float* ws, int lds, float* d, long ldd, int M, int N, int K_pad, int gps, float* y, long ldy,   \
             const float* bias, int round, const float* res, const __grid_constant__ TMap ty, int ty_ok) {          \
        pdl_entry();                                                                                               \
        wg_rows_tma<E>(&tw, &tx, &txs, ws, lds, d, ldd, M, N, K_pad, gps, y, ldy, bias, round, res, &ty, ty_ok); \
    }

// Only sm_90a has wgmma: elsewhere this module is empty and gemv.rs never asks it.
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
WG_SK(wg_fp8_sk_n8, Fp8W, 8)
WG_SK(wg_fp8_sk_n16, Fp8W, 16)
WG_SK(wg_fp8_sk_n32, Fp8W, 32)
WG_SK(wg_fp8_sk_n64, Fp8W, 64)
WG_SK(wg_bf16_sk_n8, Bf16W, 8)
WG_SK(wg_bf16_sk_n16, Bf16W, 16)
WG_SK(wg_bf16_sk_n32, Bf16W, 32)
WG_SK(wg_bf16_sk_n64, Bf16W, 64)
WG_SKG(wg_fp8_skg_n8, Fp8W, 8)
WG_SKG(wg_fp8_skg_n16, Fp8W, 16)
WG_SKG(wg_fp8_skg_n32, Fp8W, 32)
WG_SKG(wg_fp8_skg_n64, Fp8W, 64)
WG_SKG(wg_bf16_skg_n8, Bf16W, 8)
WG_SKG(wg_bf16_skg_n16, Bf16W, 16)
WG_SKG(wg_bf16_skg_n32, Bf16W, 32)
WG_SKG(wg_bf16_skg_n64, Bf16W, 64)
WG_ROWS_TMA(wg_fp8_rows_tma, Fp8W)
WG_ROWS_TMA(wg_bf16_rows_tma, Bf16W)
#endif
