// The sixtieth session's ROWS_BF16_QUAD forms (tile_out_tm, gemm_wg.cu), removed in
// the sixty-first after call 1 measured them slower than the staged stores
// (bench/results/s61/call1-h100/timing-*.log). Kept for the record.
#if ROWS_BF16_QUAD == 2
        // Measurement form (ROWS_BF16_QUAD=2): as 1, 16-byte stores. A quad's 32
        // columns of chunks j = 4pp .. 4pp + 3 are sixteen BF16 pairs; lane q holds
        // slot k = w_{4k+q} and wants w_{4q+k}: a 4 x 4 transpose in two stages of
        // shfl_xor (lane bit 0 with slot bit 0, then bit 1 with bit 1), four
        // shuffles, then 8 columns a lane.
        {
            bf16_t* yb = reinterpret_cast<bf16_t*>(y);
            const int q = lane & 3;
            const bool odd = q & 1, hi2 = q & 2;
            const bool v16 = (((u64)yb & 15) == 0) && (ldy & 7) == 0;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int tok = tw + (lane >> 2) + 8 * h;
                bf16_t* row = yb + (long)min(tok, M - 1) * ldy;
#pragma unroll
                for (int pp = 0; pp < 4; pp++) {
                    u32 a[4];
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const int j = 4 * pp + k;
                        a[k] = pack2_bf16(tot[4 * j + 2 * h], tot[4 * j + 2 * h + 1]);
                    }
#pragma unroll
                    for (int r = 0; r < 2; r++) {  // slots 2r, 2r + 1 across lanes q, q ^ 1
                        const u32 x = __shfl_xor_sync(0xffffffffu, odd ? a[2 * r] : a[2 * r + 1], 1);
                        if (odd) a[2 * r] = x;
                        else a[2 * r + 1] = x;
                    }
#pragma unroll
                    for (int r = 0; r < 2; r++) {  // slots r, r + 2 across lanes q, q ^ 2
                        const u32 x = __shfl_xor_sync(0xffffffffu, hi2 ? a[r] : a[r + 2], 2);
                        if (hi2) a[r] = x;
                        else a[r + 2] = x;
                    }
                    const int c = n0 + 32 * pp + 8 * q;
                    if (tok >= M) continue;
                    if (v16 && c + 7 < N) {
                        *reinterpret_cast<uint4*>(row + c) = make_uint4(a[0], a[1], a[2], a[3]);
                    } else {
#pragma unroll
                        for (int e = 0; e < 8; e++)
                            if (c + e < N) row[c + e] = (bf16_t)(a[e >> 1] >> (16 * (e & 1)));
                    }
                }
            }
            return;
        }
#elif ROWS_BF16_QUAD
        // Measurement form (JET_NVRTC_DEFINES=ROWS_BF16_QUAD=1): no staging. A quad
        // (lanes 4t .. 4t + 3, one token) holds 16 columns of each chunk pair (j =
        // 2p, 2p + 1) as eight BF16 pairs w0 .. w7 (w_i: columns 2i, 2i + 1; lane q
        // has w_q and w_{4+q} as its slots s0 and s1); two shuffles give lane q
        // w_{2q} and w_{2q+1}, and it stores its four columns as 8 bytes: a warp
        // instruction writes whole 32-byte sectors (8 tokens x 32 bytes), as the f32
        // path's do. The 4-byte stores from the registers' layout (half sectors) ran
        // 25% slower than the staged path (sixtieth session, H100). The same values,
        // so the same bits.
        {
            bf16_t* yb = reinterpret_cast<bf16_t*>(y);
            const int q = lane & 3;
            const bool v8 = (((u64)yb & 7) == 0) && (ldy & 3) == 0;
            // Round 1: lane 0 sends w4 (its slot 1), the others their slot 0; lanes
            // 0, 1, 2 read w1, w2, w4 from lanes 1, 2, 0. Round 2: lane 3 sends w3
            // (slot 0), the others slot 1; lanes 1, 2, 3 read w3, w5, w6 from lanes
            // 3, 1, 2. Lane 3's first read and lane 0's second are not used.
            const int quad = lane & ~3;
            const int src1 = quad + (q == 0 ? 1 : q == 1 ? 2 : 0);
            const int src2 = quad + (q == 1 ? 3 : q == 2 ? 1 : 2);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int tok = tw + (lane >> 2) + 8 * h;
                bf16_t* row = yb + (long)min(tok, M - 1) * ldy;
#pragma unroll
                for (int p = 0; p < 8; p++) {
                    const int j0 = 2 * p, j1 = 2 * p + 1;
                    const u32 s0 = pack2_bf16(tot[4 * j0 + 2 * h], tot[4 * j0 + 2 * h + 1]);
                    const u32 s1 = pack2_bf16(tot[4 * j1 + 2 * h], tot[4 * j1 + 2 * h + 1]);
                    const u32 r1 = __shfl_sync(0xffffffffu, q == 0 ? s1 : s0, src1);
                    const u32 r2 = __shfl_sync(0xffffffffu, q == 3 ? s0 : s1, src2);
                    const u32 lo = q == 0 ? s0 : (q == 3 ? r2 : r1);
                    const u32 hi = q == 0 ? r1 : (q == 3 ? s1 : r2);
                    const int c = n0 + 16 * p + 4 * q;
                    if (tok >= M) continue;
                    if (v8 && c + 3 < N) {
                        *reinterpret_cast<uint2*>(row + c) = make_uint2(lo, hi);
                    } else {
                        const u32 ws[2] = {lo, hi};
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            if (c + e < N) row[c + e] = (bf16_t)(ws[e >> 1] >> (16 * (e & 1)));
                    }
                }
            }
            return;
        }
#endif
