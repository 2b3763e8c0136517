// A decode step's gate and up projections, SwiGLU and the down projection's 1x128
// operand in one launch (FP8, sm_90a, at most 64 tokens): fuses the grouped split-K
// kernel (wg_fp8_skg_n64, gemm_wg.cu) and swiglu_sk_operand (quantize.cu), the same
// operations in the same order, so every code and scale is theirs.
//
// Why unsplit: bulk copies let few blocks read the weights at the rate many do
// (bench/results/stream-probe-s35.cu), so the split's partials, their trip through
// L2 and the consumer kernel can go. A block owns one 1x128 group of h: 128 features
// of gate and the same 128 of up, 256 weight rows, so the group's amax never leaves
// the block. What sets its time is not the stream but each block's chain (the
// groups' MMA waits and folds, then SwiGLU and the quantizer on the block's own
// threads): H200, fp8 batch 64, ncu: 15.6 us at 0.6B's 24 blocks against 7.5 + 5.7
// us for the two launches it replaces, the rollout 3.3% slower; at 8B's widths (96
// blocks) the rollout runs 3.7-3.8% faster. gemv.rs takes it where the
// grid covers at least half the SMs (gate_up_swiglu_fits).
//
// Block: 4 warpgroups (512 threads); warpgroup w holds 64 weight rows: gate
// [f0, f0 + 64), gate [f0 + 64, f0 + 128), up [f0, ...), up [f0 + 64, ...) for
// w = 0..3, against the block's 64 token slots (wgmma n64). One thread issues each
// group's bulk tensor copies (the probe's rate needs them: per-thread cp.async at
// 24 blocks ran the kernel slower than the two it replaces) into a ring of GU_S
// stages. Each group of 128 k is group_mma then scale_fold, acc restarting every gps
// groups and the slices added in order, the first as is: wg_sk_at's slices, summed
// as sk_epi4 sums them. Then the
// up warpgroups put epi_value of their totals in a shared [token][feature] tile, the
// gate warpgroups turn it into h = gv * sigmoid(gv) * uv (swiglu_operand_at's
// expression), and each warp takes tokens through swiglu_operand_at's tail: h's
// store and store_operand4.
#define GU_S 5
#define GU_NT 64
#define GU_VLD 132  // the h tile's row stride in floats (bank-spread, 16-byte rows)
struct GuSmem {
    // A stage: gate's 128 rows, up's 128 rows (two 128 x 128-byte boxes), then the
    // 64-token X box; the stages' token scales; the full barriers.
    static constexpr int WT = 128 * 128, XT = GU_NT * 128, STAGE = 2 * WT + XT;
    static constexpr u32 TX = 2 * WT + XT + GU_NT * 4;  // bytes a stage's copies land
    static constexpr int BYTES = GU_S * STAGE + GU_S * GU_NT * 4 + GU_S * 8 + 1024;  // gemv.rs GU_SMEM
};

// tg, tu: gate's / up's E4M3 codes [N_pad][K_pad] (boxes of 128 bytes x 128 rows,
// 128-byte swizzle), wgs, wus their 128x128 scales (stride lds); tx: the tokens'
// codes [M][K_pad] (boxes of 128 bytes x 64 rows), txs their 1x128 scales [L][ldxs]
// (boxes of 64 x 1); M <= 64; cols (gate's N) a multiple of 128, grid cols / 128;
// h [M][cols] (may be null) and the operand's codes, scales, yb as
// swiglu_sk_operand's.
extern "C" __global__ void __launch_bounds__(512, 1)
    wg_fp8_gate_up_swiglu(const __grid_constant__ TMap tg, const __grid_constant__ TMap tu,
                          const __grid_constant__ TMap tx, const __grid_constant__ TMap txs,
                          const float* __restrict__ wgs, const float* __restrict__ wus, int lds, int M, int K_pad,
                          int gps, int cols, float* h, int rows_pad, int cols_pad, u8* codes, float* scales,
                          bf16_t* yb) {
    pdl_entry();
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    using SM = GuSmem;
    constexpr int S = GU_S, NT = GU_NT;
    extern __shared__ u8 smem_raw[];
    u8* smem = align1024(smem_raw);
    const u32 sbase = smem_addr(smem), sxs = sbase + S * SM::STAGE, full = sxs + S * NT * 4;
    const float* xsp = reinterpret_cast<const float*>(smem + S * SM::STAGE);
    const int tid = threadIdx.x, w = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int f0 = blockIdx.x * 128;
    const float* wsr = (w < 2 ? wgs : wus) + (long)(f0 / 128) * lds;
    const int L = (K_pad + 127) / 128;
    // The weight block scales of groups lane and lane + 32, loaded once: read in the
    // group loop, each was a trip to L2 between a group's MMAs and its fold.
    const float ws_lo = lane < L ? wsr[lane] : 0.0f, ws_hi = lane + 32 < L ? wsr[lane + 32] : 0.0f;
    if (tid == 0) {
        for (int s = 0; s < S; s++) mbar_init(full + s * 8, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    // Group g's copies into stage g % S, by one thread.
    auto issue = [&](int g) {
        if (g >= L) return;
        const int b = g % S;
        const u32 st = sbase + b * SM::STAGE, bar = full + b * 8;
        mbar_expect_tx(bar, SM::TX);
        tma_2d(st, &tg, g * 128, f0, bar);
        tma_2d(st + SM::WT, &tu, g * 128, f0, bar);
        tma_2d(st + 2 * SM::WT, &tx, g * 128, 0, bar);
        tma_2d(sxs + b * NT * 4, &txs, 0, g, bar);
    };
    if (tid == 0)
        for (int g = 0; g < S; g++) issue(g);

    float acc[NT / 2], tot[NT / 2];
    zero(acc);
#pragma unroll
    for (int r = 0; r < NT / 2; r++) tot[r] = -0.0f;  // -0 + slice 0 = slice 0, taken as is
    int fold_at = gps;
    for (int g = 0; g < L; g++) {
        const int b = g % S;
        mbar_wait(full + b * 8, (g / S) & 1);
        if (g > 0 && g - 1 + S < L) {  // block-uniform
            // Every thread is done with group g - 1: its stage takes group g - 1 + S.
            __syncthreads();
            if (tid == 0) issue(g - 1 + S);
        }
        // Warpgroup w's 64 rows: gate (w < 2) or up, rows (w & 1) 64 of the 128-row box.
        const u32 wt = sbase + b * SM::STAGE + (w >> 1) * SM::WT + (w & 1) * 64 * 128;
        const u32 xt = sbase + b * SM::STAGE + 2 * SM::WT;
        float part[NT / 2];
        group_mma<Fp8W, NT>(part, wt, 0, xt, 0);
        const float wsg = L <= 64 ? __shfl_sync(0xffffffffu, g < 32 ? ws_lo : ws_hi, g & 31) : wsr[g];
        scale_fold<NT>(acc, part, xsp + b * NT, wsg, lane);
        if (g + 1 == fold_at || g + 1 == L) {  // a split slice's end: wg_sk_at's partial, added in order
#pragma unroll
            for (int r = 0; r < NT / 2; r++) {
                tot[r] += acc[r];
                acc[r] = 0.0f;
            }
            fold_at += gps;
        }
    }
    __syncthreads();  // every copy has landed and been read: the h tile takes stage 0's bytes

    // Register r holds feature (w & 1) 64 + warp 16 + lane / 4 (+8 for r & 2) of the
    // group, token 8 (r / 4) + 2 (lane % 4) + (r & 1): wg_sk_at's store layout.
    float* V = reinterpret_cast<float*>(smem);
    const int fb = (w & 1) * 64 + warp * 16 + (lane >> 2), tb = (lane & 3) * 2;
    if (w >= 2) {
#pragma unroll
        for (int r = 0; r < NT / 2; r++)
            V[(tb + (r >> 2) * 8 + (r & 1)) * GU_VLD + fb + ((r & 2) ? 8 : 0)] =
                epi_value(tot[r], false, 0.0f, 1, false, 0.0f);
    }
    __syncthreads();
    if (w < 2) {
#pragma unroll
        for (int r = 0; r < NT / 2; r++) {
            float* at = V + (tb + (r >> 2) * 8 + (r & 1)) * GU_VLD + fb + ((r & 2) ? 8 : 0);
            const float gv = epi_value(tot[r], false, 0.0f, 1, false, 0.0f), uv = *at;
            *at = gv * sigmoid(gv) * uv;
        }
    }
    __syncthreads();
    // swiglu_operand_at's tail, warp (r, blockIdx.x) for the block's tokens r.
    const int c = f0 + lane * 4;
    for (int r = tid >> 5; r < rows_pad; r += 16) {  // warp-uniform
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (r < M) {
            const float4 q = *reinterpret_cast<const float4*>(V + r * GU_VLD + lane * 4);
            v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
            if (h) store4(h + (long)r * cols, c, cols, ((u64)h & 15) == 0, v);
        }
        store_operand4(v, r, blockIdx.x, c, lane, rows_pad, cols_pad, codes, scales, yb);
    }
#endif
}
