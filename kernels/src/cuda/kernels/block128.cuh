// E4M3 encoding of a quantizer's values (quantize.cu, adamw.cu's fused weight
// blocks, gate_up_swiglu.cu's operand): prepended to those modules.

// The four codes of v (scale d), by the hardware conversion of the quotients, or
// (SW, kept as the check of both) by e4m3_encode of each value's quotient.
template <bool SW = false>
__device__ __forceinline__ u32 encode4(const float v[4], Quot d) {
    if (SW) {
        float q[4];
        for (int i = 0; i < 4; i++) q[i] = d.fast ? qdiv(v[i], d) : v[i] / d.s;
        return e4m3_encode(q[0]) | (e4m3_encode(q[1]) << 8) | (e4m3_encode(q[2]) << 16) | (e4m3_encode(q[3]) << 24);
    }
    if (d.fast)
        return cvt_e4m3x2(qdiv(v[0], d), qdiv(v[1], d)) | (cvt_e4m3x2(qdiv(v[2], d), qdiv(v[3], d)) << 16);
    return e4m3x2(v[0] / d.s, v[1] / d.s) | (e4m3x2(v[2] / d.s, v[3] / d.s) << 16);
}

// A fused producer's GEMM operand for one lane's four values v of row r, group g,
// columns c .. c+3 (row1x128's layout; the whole warp calls it): their 1x128 E4M3
// codes and the group's scale (codes != null, as row1x128) or their BF16 copy
// (yb != null, as pad_bf16_f32).
__device__ __forceinline__ void store_operand4(const float v[4], int r, int g, int c, int lane, int rows_pad,
                                               int cols_pad, u8* codes, float* scales, bf16_t* yb) {
    if (codes) {
        u32 m = 0;
        for (int j = 0; j < 4; j++) m = max_abs_bits(m, v[j]);
        m = __reduce_max_sync(0xffffffffu, m);
        // quot_usual where it applies (the same values, no range-check branches).
        const bool usual = usual_amax(m);
        const Quot d = usual ? quot_usual(m) : quot(e4m3_scale(m));
        const u32 q = usual ? encode4_fast(v, d) : encode4(v, d);
        if (c < cols_pad) *reinterpret_cast<u32*>(codes + (long)r * cols_pad + c) = q;
        if (lane == 0) scales[(long)g * rows_pad + r] = d.s;
    }
    if (yb && c < cols_pad) {
        *(uint2*)(yb + (long)r * cols_pad + c) = make_uint2(pack2_bf16(v[0], v[1]), pack2_bf16(v[2], v[3]));
    }
}

// The 128x128 weight-block quantizer's encoding half, shared by quant_block128_*
// (quantize.cu: the block's values loaded from a weight) and adamw_block128_multi
// (adamw.cu: the values AdamW has just computed), so both write the same bits.
// One block of 512 threads per 128x128 block (kb, nb) (column and row block).
// Thread t holds columns kb * 128 + 4 * (t % 32) .. +3 of rows nb * 128 + t / 32 + 16 i,
// i < 8, in v (0 past the weight's rows and columns); from registers: the block's
// largest magnitude, then the codes [rows_pad][cols_pad] and the scale. The last
// column block of a row block writes the zeros of its scale row's stride padding
// (lds), the last row block those of scales_t's, so the scales need no memset.
// codes_t (when not null): the codes of W^T [cols_pad][rows_pad] (a block transposes
// exactly: same codes, same scale), through a shared tile.
__device__ __forceinline__ void block128_encode(const float (&v)[8][4], int rows, int cols, int rows_pad,
                                                int cols_pad, u8* codes, float* scales, int lds, u8* codes_t,
                                                float* scales_t, int lds_t, long ldct, int zlim_t, int kb, int nb) {
    __shared__ u32 red[16];
    __shared__ u32 tile[128][33];  // codes of the block, 4 per word, for the transposed copy
    const int t = threadIdx.x;
    const int cq = t & 31, c = kb * 128 + cq * 4;
    u32 m = 0;
#pragma unroll
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++) m = max_abs_bits(m, v[i][j]);
    m = __reduce_max_sync(0xffffffffu, m);
    if (cq == 0) red[t >> 5] = m;
    __syncthreads();
    m = __reduce_max_sync(0xffffffffu, cq < 16 ? red[cq] : 0u);
    const float s = e4m3_scale(m);
    const Quot d = quot(s);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int rl = (t >> 5) + 16 * i, r = nb * 128 + rl;
        const u32 q = encode4(v[i], d);
        tile[rl][cq] = q;
        if (r < rows_pad && c < cols_pad) *reinterpret_cast<u32*>(codes + (long)r * cols_pad + c) = q;
    }
    const int cb = (cols + 127) / 128, rb = (rows + 127) / 128;
    if (t == 0) {
        scales[(long)nb * lds + kb] = s;
        if (scales_t) scales_t[(long)kb * lds_t + nb] = s;
    }
    if (kb == cb - 1 && t > 0 && cb + t - 1 < lds) scales[(long)nb * lds + cb + t - 1] = 0.0f;
    if (scales_t && nb == rb - 1 && t > 0 && rb + t - 1 < zlim_t) scales_t[(long)kb * lds_t + rb + t - 1] = 0.0f;
    if (!codes_t) return;
    __syncthreads();
    // codes^T row (column cl of the block): 128 bytes, 16 from each of 8 threads.
    for (int k8 = t; k8 < 128 * 8; k8 += 512) {
        const int cl = k8 >> 3, part = k8 & 7, ct = kb * 128 + cl, rl = part * 16, r = nb * 128 + rl;
        if (ct >= cols_pad || r >= rows_pad) continue;  // rows_pad % 16 == 0: whole runs
        u32 o[4];
        for (int k = 0; k < 4; k++) {
            o[k] = 0;
            for (int j = 0; j < 4; j++)
                o[k] |= ((tile[rl + 4 * k + j][cl >> 2] >> (8 * (cl & 3))) & 0xffu) << (8 * j);
        }
        *reinterpret_cast<uint4*>(codes_t + (long)ct * ldct + r) = make_uint4(o[0], o[1], o[2], o[3]);
    }
}
