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
extern "C" __global__ void adamw_step(float* p, const float* g, float* m, float* v, long n, double lr,
                                      float b1, float b2, double eps, double bc1, double bc2, double r1,
                                      double r2, float wd_factor, int decay, float grad_scale) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    adamw_elem(p, g[i], m, v, i, lr, b1, b2, eps, bc1, bc2, r1, r2, wd_factor, decay, grad_scale);
}

// adamw_step over T tensors in one launch (the same per-element operations, so the
// same bits): tab[t] = {p, g, m, v, n, first block, decay, pend, pb} as 9 int64, the
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
    if (threadIdx.x == 0) st = tensor_of(tab, 9, 5, T, blockIdx.x);
    __syncthreads();
    const long long* e = tab + (long)st * 9;
    float *p = (float*)e[0], *m = (float*)e[2], *v = (float*)e[3];
    const float* g = (const float*)e[1];
    const bf16_t* pend = (const bf16_t*)e[7];
    bf16_t* pb = (bf16_t*)e[8];
    const long n = e[4], i0 = (((long)blockIdx.x - e[5]) * blockDim.x + threadIdx.x) * 4;
    const int decay = (int)e[6];
    if (i0 >= n) return;
    const bool vec =
        i0 + 3 < n && (((u64)p | (u64)g | (u64)m | (u64)v) & 15) == 0 && (((u64)pend | (u64)pb) & 7) == 0;
    if (!vec) {
        for (long i = i0; i < min(i0 + 4, n); i++) {
            adamw_elem(p, grad_val(g, pend, i), m, v, i, lr, b1, b2, eps, bc1, bc2, r1, r2, wd_factor, decay,
                       grad_scale);
            if (pb) pb[i] = f32_to_bf16(p[i]);
        }
        return;
    }
    float4 pp = *reinterpret_cast<const float4*>(p + i0);
    float G[4];
    grad_val4(g, pend, i0, G);
    float4 mm = *reinterpret_cast<const float4*>(m + i0), vv = *reinterpret_cast<const float4*>(v + i0);
    float* P = &pp.x; float* M = &mm.x; float* V = &vv.x;
#pragma unroll
    for (int u = 0; u < 4; u++)
        P[u] = adamw_one(P[u], G[u], &M[u], &V[u], lr, b1, b2, eps, bc1, bc2, r1, r2, wd_factor, decay,
                         grad_scale);
    *reinterpret_cast<float4*>(p + i0) = pp;
    *reinterpret_cast<float4*>(m + i0) = mm;
    *reinterpret_cast<float4*>(v + i0) = vv;
    if (pb) *reinterpret_cast<uint2*>(pb + i0) = make_uint2(pack2_bf16(P[0], P[1]), pack2_bf16(P[2], P[3]));
}
