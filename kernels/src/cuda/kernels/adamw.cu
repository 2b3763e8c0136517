// One AdamW step per element (adamw.rs), bit-exact with adamw_reference: every
// operation is an explicit round-to-nearest intrinsic, so nothing is contracted.
// f32 for the moments and the parameter, f64 for the update, rounded once to f32.

// x / b correctly rounded for a b shared by every element (the bias corrections):
// with r = RN(1/b) (the host's), q = x r is within an ulp, its residual x - q b is
// exact and q + residual * r is RN(x / b) (Markstein); copysign keeps a -0's sign.
// x is an f32 value (far from double's underflow); x not finite, or r = 0 (the
// host's mark for a b without a normal reciprocal): the division.
__device__ __forceinline__ double div_by(double x, double b, double r) {
    if (r == 0.0 || !isfinite(x)) return __ddiv_rn(x, b);
    const double q = __dmul_rn(x, r);
    return copysign(__fma_rn(__fma_rn(-q, b, x), r, q), x);
}
__device__ __forceinline__ float adamw_one(float p, float g, float* m_io, float* v_io, double lr, float b1,
                                           float b2, double eps, double bc1, double bc2, double r1, double r2,
                                           float wd_factor, int decay, float grad_scale) {
    float gi = __fmul_rn(g, grad_scale);
    float mi = __fadd_rn(__fmul_rn(b1, *m_io), __fmul_rn(__fsub_rn(1.0f, b1), gi));
    float vi = __fadd_rn(__fmul_rn(b2, *v_io), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, b2), gi), gi));
    *m_io = mi;
    *v_io = vi;
    double mhat = div_by((double)mi, bc1, r1);
    double vhat = div_by((double)vi, bc2, r2);
    if (decay) p = __fmul_rn(p, wd_factor);
    double upd = __ddiv_rn(__dmul_rn(lr, mhat), __dadd_rn(__dsqrt_rn(vhat), eps));
    return __fsub_rn(p, __double2float_rn(upd));
}
__device__ __forceinline__ void adamw_elem(float* p, float g, float* m, float* v, long i, double lr, float b1,
                                           float b2, double eps, double bc1, double bc2, double r1, double r2,
                                           float wd_factor, int decay, float grad_scale) {
    float mi = m[i], vi = v[i];
    p[i] = adamw_one(p[i], g, &mi, &vi, lr, b1, b2, eps, bc1, bc2, r1, r2, wd_factor, decay, grad_scale);
    m[i] = mi;
    v[i] = vi;
}
// The step on elements i0 .. i0+3 of a tensor (p, g, m, v 16-byte aligned there,
// pend and pb 8-byte): four loads, four adamw_one, the stores (pb: the new values'
// BF16 copy, pack2_bf16's rounding); the new values in P. adamw_multi's vector path
// and adamw_block128_multi share it.
__device__ __forceinline__ void adamw_quad(float* p, const float* g, float* m, float* v, const bf16_t* pend,
                                           bf16_t* pb, long i0, double lr, float b1, float b2, double eps,
                                           double bc1, double bc2, double r1, double r2, float wd_factor, int decay,
                                           float grad_scale, float (&P)[4]) {
    const float4 pp = *reinterpret_cast<const float4*>(p + i0);
    float G[4];
    grad_val4(g, pend, i0, G);
    float4 mm = *reinterpret_cast<const float4*>(m + i0), vv = *reinterpret_cast<const float4*>(v + i0);
    const float* Q = &pp.x;
    float* M = &mm.x;
    float* V = &vv.x;
#pragma unroll
    for (int u = 0; u < 4; u++)
        P[u] = adamw_one(Q[u], G[u], &M[u], &V[u], lr, b1, b2, eps, bc1, bc2, r1, r2, wd_factor, decay, grad_scale);
    *reinterpret_cast<float4*>(p + i0) = make_float4(P[0], P[1], P[2], P[3]);
    *reinterpret_cast<float4*>(m + i0) = mm;
    *reinterpret_cast<float4*>(v + i0) = vv;
    if (pb) *reinterpret_cast<uint2*>(pb + i0) = make_uint2(pack2_bf16(P[0], P[1]), pack2_bf16(P[2], P[3]));
}
// The same on the cnt (at most 4) elements from i0, one at a time (no alignment
// needed): the tails and unaligned tensors.
__device__ __forceinline__ void adamw_few(float* p, const float* g, float* m, float* v, const bf16_t* pend,
                                          bf16_t* pb, long i0, int cnt, double lr, float b1, float b2, double eps,
                                          double bc1, double bc2, double r1, double r2, float wd_factor, int decay,
                                          float grad_scale, float (&P)[4]) {
#pragma unroll
    for (int u = 0; u < 4; u++) {
        if (u >= cnt) break;
        adamw_elem(p, grad_val(g, pend, i0 + u), m, v, i0 + u, lr, b1, b2, eps, bc1, bc2, r1, r2, wd_factor, decay,
                   grad_scale);
        P[u] = p[i0 + u];
        if (pb) pb[i0 + u] = f32_to_bf16(P[u]);
    }
}
extern "C" __global__ void adamw_step(float* p, const float* g, float* m, float* v, long n, double lr,
                                      float b1, float b2, double eps, double bc1, double bc2, double r1,
                                      double r2, float wd_factor, int decay, float grad_scale) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    adamw_elem(p, g[i], m, v, i, lr, b1, b2, eps, bc1, bc2, r1, r2, wd_factor, decay, grad_scale);
}

// adamw_step over T tensors in one launch (the same per-element operations, so the
// same bits): tab[t] = {p, g, m, v, n, first block, decay, pend, pb, mask} as 10
// int64 (mask not null: g's chunks of 2^GRAD_MASK_SHIFT values that may hold
// nonzeros; a chunk marked 0 holds +0, which a thread takes without reading g), the
// gradient being grad_val(g, pend, i) (g null: not written yet; pend not null: the
// last WGrad output still in BF16, added here as its epilogue would have); pb not
// null: the parameter's BF16 copy [n], written from the new values (fuses the next
// step's pad_bf16_f32 of the weight: f32_to_bf16 of each value, the same bits); 256-thread
// blocks of 1024 elements, thread j of tensor t's block b taking elements
// 4j .. 4j+3 of the block (float4 loads and stores when the tensor's arrays are
// 16-byte aligned, pend 8-byte: more bytes in flight a thread). scale_p not null:
// the gradient's scale is *scale_p (grad_clip_scale's, on the device), not grad_scale.
extern "C" __global__ void adamw_multi(const long long* tab, int T, double lr, float b1, float b2, double eps,
                                       double bc1, double bc2, double r1, double r2, float wd_factor,
                                       float grad_scale, const float* scale_p) {
    pdl_entry();
    if (scale_p) grad_scale = *scale_p;
    __shared__ int st;
    if (threadIdx.x == 0) st = tensor_of(tab, 10, 5, T, blockIdx.x);
    __syncthreads();
    const long long* e = tab + (long)st * 10;
    float *p = (float*)e[0], *m = (float*)e[2], *v = (float*)e[3];
    const float* g = (const float*)e[1];
    const bf16_t* pend = (const bf16_t*)e[7];
    bf16_t* pb = (bf16_t*)e[8];
    const u8* mask = (const u8*)e[9];
    const long b = (long)blockIdx.x - e[5], n = e[4], i0 = (b * blockDim.x + threadIdx.x) * 4;
    const int decay = (int)e[6];
    if (i0 >= n) return;
    if (mask && !mask[i0 >> GRAD_MASK_SHIFT]) g = nullptr;  // a thread's 4 values lie in one chunk
    const bool vec =
        i0 + 3 < n && (((u64)p | (u64)g | (u64)m | (u64)v) & 15) == 0 && (((u64)pend | (u64)pb) & 7) == 0;
    float P[4];
    if (!vec) {
        adamw_few(p, g, m, v, pend, pb, i0, (int)min(4L, n - i0), lr, b1, b2, eps, bc1, bc2, r1, r2, wd_factor,
                  decay, grad_scale, P);
        return;
    }
    adamw_quad(p, g, m, v, pend, pb, i0, lr, b1, b2, eps, bc1, bc2, r1, r2, wd_factor, decay, grad_scale, P);
}

// adamw_multi on weights whose prepared GEMM operands are 128x128 FP8 blocks, each
// block's new values quantized in the same launch (fuses adamw_multi of these tensors
// and quant_block128_multi of their new values: the same per-element operations and
// the same blocks, so the same bits, without reading the new weights back).
// tab[t] = {p, g, m, v, pend, pb, rows, cols, rows_pad, cols_pad, codes, scales, lds,
// codes_t, scales_t, lds_t, decay, first block, ldct, zlim_t, mask} as BLOCKS_ROW int64
// (p, g, m, v, pend, pb [rows, cols] row-contiguous as in adamw_multi; codes .. lds_t,
// ldct and zlim_t as in quant_block128_multi; mask as adamw_multi's: g's chunks marked
// 0 hold +0 and are not read, the tied embedding's). Block b of tensor t is its 128x128 block (b % cb, b / cb),
// 512 threads in block128_encode's layout. The step runs a quad at a time (as
// adamw_multi: its f64 update's registers), each new quad parked in the thread's own
// slots of 64 KiB of dynamic shared memory, then read back for the encoding: two
// blocks an SM, adamw_multi's 32 warps. (The new values held in registers through
// the step, one block an SM: 2.2x slower than the two kernels it fuses; two quads'
// loads in flight, `#pragma unroll 2`: no faster, 8 bytes of spills.)
#define BLOCKS_ROW 21
extern "C" __global__ void __launch_bounds__(512, 2)
    adamw_block128_multi(const long long* tab, int T, double lr, float b1, float b2, double eps, double bc1,
                         double bc2, double r1, double r2, float wd_factor, float grad_scale, const float* scale_p) {
    pdl_entry();
    extern __shared__ float4 parked[];  // [8][512]: slot i * 512 + t is thread t's row i
    if (scale_p) grad_scale = *scale_p;
    __shared__ int st;
    if (threadIdx.x == 0) st = tensor_of(tab, BLOCKS_ROW, 17, T, blockIdx.x);
    __syncthreads();
    const long long* e = tab + (long)st * BLOCKS_ROW;
    float* __restrict__ p = (float*)e[0];
    float* __restrict__ m = (float*)e[2];
    float* __restrict__ v = (float*)e[3];
    const float* __restrict__ g = (const float*)e[1];
    const bf16_t* __restrict__ pend = (const bf16_t*)e[4];
    bf16_t* __restrict__ pb = (bf16_t*)e[5];
    const int rows = (int)e[6], cols = (int)e[7], cb = (cols + 127) / 128, decay = (int)e[16];
    const long b = (long)blockIdx.x - e[17];
    const int kb = (int)(b % cb), nb = (int)(b / cb);
    const int t = threadIdx.x, c = kb * 128 + (t & 31) * 4;
    const bool vec = (cols & 3) == 0 && (((u64)p | (u64)g | (u64)m | (u64)v) & 15) == 0 &&
                     (((u64)pend | (u64)pb) & 7) == 0;
    for (int i = 0; i < 8; i++) {
        const int r = nb * 128 + (t >> 5) + 16 * i;
        float P[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (r < rows) {
            const long i0 = (long)r * cols + c;
            // A whole quad (4-aligned: cols % 4 == 0) lies in one chunk; the rest read g.
            // The mask's address is read from the table here, not kept through the
            // loop (one more live pointer spilled at the 64-register bound).
            const u8* mask = (const u8*)e[20];
            if (vec && c + 3 < cols)
                adamw_quad(p, mask && !mask[i0 >> GRAD_MASK_SHIFT] ? nullptr : g, m, v, pend, pb, i0, lr, b1, b2, eps,
                           bc1, bc2, r1, r2, wd_factor, decay, grad_scale, P);
            else
                adamw_few(p, g, m, v, pend, pb, i0, min(4, cols - c), lr, b1, b2, eps, bc1, bc2, r1, r2, wd_factor,
                          decay, grad_scale, P);
        }
        parked[i * 512 + t] = make_float4(P[0], P[1], P[2], P[3]);
    }
    float w[8][4];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float4 q = parked[i * 512 + t];
        w[i][0] = q.x, w[i][1] = q.y, w[i][2] = q.z, w[i][3] = q.w;
    }
    block128_encode(w, rows, cols, (int)e[8], (int)e[9], (u8*)e[10], (float*)e[11], (int)e[12], (u8*)e[13],
                    (float*)e[14], (int)e[15], (long)e[18], (int)e[19], kb, nb);
}
