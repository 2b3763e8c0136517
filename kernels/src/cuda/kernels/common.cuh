// Shared by every Jet kernel source (prepended before NVRTC compiles a module).
// No CUDA headers: BF16 and E4M3 conversions are written out here, bit for bit
// the ones of the CPU reference (half's bf16::from_f32, fp8::encode).

typedef unsigned char u8;
typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef unsigned long long u64;

#define E4M3_MAX 448.0f
// fp8::encode(NaN): F8E4M3::from_f32(NaN), the positive NaN code.
#define E4M3_NAN 0x7fu
// A masked gradient (grad.rs GradAcc) keeps a byte for each 2^GRAD_MASK_SHIFT values
// (grad.rs MASK_CHUNK, which a test holds to this).
#define GRAD_MASK_SHIFT 10

__device__ __forceinline__ float bf16_to_f32(bf16_t h) { return __uint_as_float(((u32)h) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN. Same as half::bf16::from_f32.
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

__device__ __forceinline__ float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }
// Two f32 as packed BF16, lo first, by f32_to_bf16 each (the bits of two scalar
// stores; pack_bf16x2's instruction differs only in NaN payloads).
__device__ __forceinline__ u32 pack2_bf16(float lo, float hi) {
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}
// round_bf16 by the hardware conversion (cvt.rn.bf16.f32, then widened): the same
// value but for a NaN's payload (the instruction gives 0x7fff), for kernels whose
// outputs depend on a NaN only through its being one (swiglu_bwd_fp8 under
// SWIGLU_HW_BF16, quantize.cu).
__device__ __forceinline__ float round_bf16_hw(float f) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return __uint_as_float((u32)h << 16);
}
// Four consecutive BF16 values (8 bytes, lo first) as f32: exact.
__device__ __forceinline__ void bf16x4_to_f32(uint2 q, float v[4]) {
    v[0] = __uint_as_float(q.x << 16);
    v[1] = __uint_as_float(q.x & 0xffff0000u);
    v[2] = __uint_as_float(q.y << 16);
    v[3] = __uint_as_float(q.y & 0xffff0000u);
}
// A parameter's gradient at i (grad.rs GradAcc; read by the gradient norm and AdamW):
// its f32 accumulator (null: not written yet, +0) plus, when not null, the last WGrad
// output still in BF16, added as the WGrad epilogue (linear_epilogue_bf16 into the
// accumulator) would have added it: __fadd_rn(acc, dW).
__device__ __forceinline__ float grad_val(const float* acc, const bf16_t* pend, long i) {
    const float a = acc ? acc[i] : 0.0f;
    return pend ? __fadd_rn(a, bf16_to_f32(pend[i])) : a;
}
// grad_val of values i0 .. i0 + 3 into v, in 16-byte (acc) and 8-byte (pend) loads:
// both 4-aligned where not null (AdamW's and grad_settle's vector paths).
__device__ __forceinline__ void grad_val4(const float* acc, const bf16_t* pend, long i0, float (&v)[4]) {
    const float4 a = acc ? *reinterpret_cast<const float4*>(acc + i0) : make_float4(0, 0, 0, 0);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    if (pend) {
        float d[4];
        bf16x4_to_f32(*reinterpret_cast<const uint2*>(pend + i0), d);
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = __fadd_rn(v[u], d[u]);
    }
}
// A value of an f32 or BF16 buffer as f32 (kernels templated on their input's type).
__device__ __forceinline__ float to_f32(float f) { return f; }
__device__ __forceinline__ float to_f32(bf16_t h) { return bf16_to_f32(h); }

// Four consecutive values at column c (c % 4 == 0) of a row; zero beyond `cols`.
__device__ __forceinline__ void load4(const float* row, int c, int cols, bool vec, float v[4]) {
    if (vec && c + 3 < cols) {
        float4 q = *reinterpret_cast<const float4*>(row + c);
        v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
    } else {
        for (int i = 0; i < 4; i++) v[i] = c + i < cols ? row[c + i] : 0.0f;
    }
}
__device__ __forceinline__ void load4(const bf16_t* row, int c, int cols, bool vec, float v[4]) {
    if (vec && c + 3 < cols) {
        bf16x4_to_f32(*reinterpret_cast<const uint2*>(row + c), v);
    } else {
        for (int i = 0; i < 4; i++) v[i] = c + i < cols ? bf16_to_f32(row[c + i]) : 0.0f;
    }
}

// load4 of N rows (row i at x + i ldx, read where on[i]) in two steps, so that all
// of a thread's loads are in flight before any is used: load_rows4's loads leave
// the values' bits in Raw4 registers (predicated 16- or 8-byte loads where the quad
// is whole and aligned; scalar loads after them where a row's quad is not), and
// widen_rows4 then turns them into f32 (exact, the values load4 gives). load4 under
// `if (row read)` widened each row's BF16 inside its own branch, so a thread waited
// out one memory round trip a row: 28-31% of the warp samples of
// token_logprobs_bwd_fp8_z16 and swiglu_bwd_fp8 (ncu, H100, forty-fifth session).
template <typename T>
struct Raw4;
template <>
struct Raw4<float> {
    float4 q;
    __device__ __forceinline__ void load(const float* p) { q = *reinterpret_cast<const float4*>(p); }
    __device__ __forceinline__ void load_few(const float* row, int c, int cols) {
        q.x = c < cols ? row[c] : 0.0f, q.y = c + 1 < cols ? row[c + 1] : 0.0f;
        q.z = c + 2 < cols ? row[c + 2] : 0.0f, q.w = c + 3 < cols ? row[c + 3] : 0.0f;
    }
    __device__ __forceinline__ void widen(float (&v)[4]) const { v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w; }
};
template <>
struct Raw4<bf16_t> {
    uint2 q;
    __device__ __forceinline__ void load(const bf16_t* p) { q = *reinterpret_cast<const uint2*>(p); }
    __device__ __forceinline__ void load_few(const bf16_t* row, int c, int cols) {
        u32 b[4];
#pragma unroll
        for (int i = 0; i < 4; i++) b[i] = c + i < cols ? (u32)row[c + i] : 0u;
        q = make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
    }
    __device__ __forceinline__ void widen(float (&v)[4]) const { bf16x4_to_f32(q, v); }
};
template <int N, typename T>
__device__ __forceinline__ void load_rows4(Raw4<T> (&raw)[N], const T* x, long ldx, int c, int cols, bool vec,
                                           const bool (&on)[N]) {
    const bool fast = vec && c + 3 < cols;
#pragma unroll
    for (int i = 0; i < N; i++) {
        raw[i].q = {};
        if (on[i] && fast) raw[i].load(x + i * ldx + c);
    }
#pragma unroll
    for (int i = 0; i < N; i++)
        if (on[i] && !fast) raw[i].load_few(x + i * ldx, c, cols);
}
template <int N, typename T>
__device__ __forceinline__ void widen_rows4(const Raw4<T> (&raw)[N], float (&v)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++) raw[i].widen(v[i]);
}
// load_rows4 of one row: its quad's raw bits, widened (Raw4::widen) after the
// thread's other loads have issued.
template <typename T>
__device__ __forceinline__ Raw4<T> load_raw4(const T* row, int c, int cols, bool vec) {
    Raw4<T> r[1];
    const bool on[1] = {true};
    load_rows4(r, row, 0, c, cols, vec, on);
    return r[0];
}
// load_rows4 and widen_rows4 of N rows into v, NB rows at a time (NB divides N: the
// raw registers of all N rows may not fit beside the values).
template <int NB, int N, typename T>
__device__ __forceinline__ void load_rows4_by(float (&v)[N][4], const T* x, long ldx, int c, int cols, bool vec,
                                              const bool (&on)[N]) {
#pragma unroll
    for (int h = 0; h < N; h += NB) {
        Raw4<T> raw[NB];
        bool o[NB];
#pragma unroll
        for (int i = 0; i < NB; i++) o[i] = on[h + i];
        load_rows4(raw, x + h * ldx, ldx, c, cols, vec, o);
        widen_rows4(raw, *reinterpret_cast<float(*)[NB][4]>(&v[h]));
    }
}

// Four f32 values to columns c .. c+3 (c % 4 == 0) of a row, those below `cols`: one
// 16-byte store when vec (row 16-byte aligned) and all four are in the row.
__device__ __forceinline__ void store4(float* row, int c, int cols, bool vec, const float v[4]) {
    if (vec && c + 3 < cols) {
        *reinterpret_cast<float4*>(row + c) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
        for (int i = 0; i < 4; i++)
            if (c + i < cols) row[c + i] = v[i];
    }
}

// Two f32 -> packed BF16x2, round to nearest even (lo in the low half): the
// tensor-core attention's operands (flash.cu, flash_wg.cu).
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// fp8::scale_for, from the bit pattern of the group's largest |x| (max over
// `bits & 0x7fffffff` is the max magnitude, and any NaN pattern wins).
// For amax in [2^-94, inf) the division is amax / 448 = y / 7 with y = amax 2^-6
// (exact), done as RN(y / 7) by Markstein's correction with RN(1/7): q = y r7
// within an ulp, its residual y - 7q exact, q + residual * r7 correctly rounded
// (three instructions in place of the division).
__device__ __forceinline__ float e4m3_scale(u32 amax_bits) {
    if (amax_bits >= 0x10800000u && amax_bits < 0x7f800000u) {
        const float y = __uint_as_float(amax_bits) * 0.015625f, r7 = __uint_as_float(0x3e124925u);
        const float q = __fmul_rn(y, r7);
        return fmaf(fmaf(-q, 7.0f, y), r7, q);
    }
    if (amax_bits > 0x7f800000u) return __uint_as_float(0x7fc00000u);
    float s = __uint_as_float(amax_bits) / E4M3_MAX;
    if (s > 0.0f && s <= 3.40282347e38f) return s;
    if (s == 0.0f) return 1.0f;
    return __uint_as_float(0x7f800000u);
}

// fp8::encode: saturate to +-448, then round to nearest even (E4M3 "fn": bias 7,
// 3 mantissa bits, subnormal step 2^-9, no infinities).
__device__ __forceinline__ u32 e4m3_encode(float x) {
    if (isnan(x)) return E4M3_NAN;
    u32 sign = (__float_as_uint(x) >> 24) & 0x80u;
    float a = fminf(fabsf(x), E4M3_MAX);
    int e = (int)(__float_as_uint(a) >> 23) - 127;
    if (e < -6) {
        // Below the smallest normal 2^-6: multiples of 2^-9 (a * 512 is exact).
        return sign | (u32)rintf(a * 512.0f);  // 8 -> 0x08, the smallest normal
    }
    // a * 2^(3-e) is exact and lies in [8, 16); rintf rounds to nearest even.
    u32 q = (u32)rintf(a * __uint_as_float((u32)(127 + 3 - e) << 23));
    if (q == 16u) { e += 1; q = 8u; }
    return sign | ((u32)(e + 7) << 3) | (q - 8u);
}

// Two values at once through the hardware conversion (sm_89+): after the clamp to
// +-448 the satfinite path never triggers, and cvt.rn rounds to nearest even like
// e4m3_encode, subnormals and signed zeros included. NaN keeps the software path
// (fp8::encode gives the positive NaN code whatever the sign).
// The conversion alone, lo in the low byte: for finite values within +-448 (1 + 2^-23).
__device__ __forceinline__ u32 cvt_e4m3x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return (u32)r;
}
__device__ __forceinline__ u32 e4m3x2(float lo, float hi) {
    if (isnan(lo) || isnan(hi)) return e4m3_encode(lo) | (e4m3_encode(hi) << 8);
    return cvt_e4m3x2(fminf(fmaxf(lo, -E4M3_MAX), E4M3_MAX), fminf(fmaxf(hi, -E4M3_MAX), E4M3_MAX));
}

// The scaled value a code rounds, as the CPU's fp8::quotient: for a scale s in
// [2^-88, 2^125] (`fast`: r normal and finite) x * r with r = RN(1/s), s's correctly
// rounded reciprocal made once a group: one multiplication a value (the
// correctly rounded x / s through Markstein's residual correction took four;
// the quantizers are bound by their instructions). Otherwise the division itself.
// In the fast range x and the products are finite and |x r| <= 448 (1 + 2^-22):
// the hardware conversion alone encodes them (satfinite rounds the few just over
// 448 to 448, as the CPU's saturation does); -0 stays -0 (r > 0).
struct Quot {
    float s, r;
    bool fast;
};
__device__ __forceinline__ Quot quot(float s) {
    return {s, __frcp_rn(s), s >= 0x1p-88f && s <= 0x1p125f};
}
__device__ __forceinline__ float qdiv(float x, Quot d) { return __fmul_rn(x, d.r); }

// e4m3_scale and quot of a group whose largest |x| (bits a) is 0 or in [2^-79, inf),
// the usual range (`usual_amax`), without branches: scale 1 for an all-zero group,
// else e4m3_scale's Markstein quotient; the reciprocal as __frcp_rn's fast path
// computes it (MUFU.RCP, one Newton step: the same instructions), which covers
// every such scale (>= 2^-87.8), so the quotients are quot's fast ones. A warp
// quantizing groups one after another through e4m3_scale and quot ran each group
// in its own branch regions (their range checks, __frcp_rn's slow-path call), one
// dependent chain at a time; with these a thread's groups interleave.
__device__ __forceinline__ bool usual_amax(u32 a) { return a == 0u || (a >= 0x18000000u && a < 0x7f800000u); }
__device__ __forceinline__ Quot quot_usual(u32 a) {
    const float y = __uint_as_float(a) * 0.015625f, r7 = __uint_as_float(0x3e124925u);
    const float q = __fmul_rn(y, r7);
    const float s = a == 0u ? 1.0f : fmaf(fmaf(-q, 7.0f, y), r7, q);
    float r0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(s));
    return {s, fmaf(fmaf(-s, r0, 1.0f), r0, r0), true};
}
// `quot_usual_is_quot` (ops.cu) compares it with quot(e4m3_scale(a)) at every usual a.
// encode4's codes of four values at a fast Quot (quot_usual's).
__device__ __forceinline__ u32 encode4_fast(const float v[4], Quot d) {
    return cvt_e4m3x2(qdiv(v[0], d), qdiv(v[1], d)) | (cvt_e4m3x2(qdiv(v[2], d), qdiv(v[3], d)) << 16);
}

// The two codes of lo, hi (lo in the low byte) at scale d: half of quantize.cu's
// encode4 (the hardware conversion of the quotients, or of the divisions
// themselves outside the fast range), for the decode attention's operand.
__device__ __forceinline__ u32 encode2(float lo, float hi, Quot d) {
    if (d.fast) return cvt_e4m3x2(qdiv(lo, d), qdiv(hi, d));
    return e4m3x2(lo / d.s, hi / d.s);
}

__device__ __forceinline__ u32 max_abs_bits(u32 m, float v) {
    return max(m, __float_as_uint(v) & 0x7fffffffu);
}

// Deterministic block reductions (fixed tree for a fixed blockDim); blockDim.x
// must be a multiple of 32 and at most 1024. `sh` holds 32 floats.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ float block_sum(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}
__device__ float block_max(float v, float* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -__uint_as_float(0x7f800000u);
    return warp_max(v);
}

// RN(n / d) for sigmoid's operands (d = 1 + e in [1, 2], n = 1 or e): the fast
// path of the compiler's IEEE division (MUFU.RCP, one Newton step, the quotient
// corrected by its residual; the same instructions), without its range check
// (FCHK) and the slow path's call, which these operands never take (not a general
// division: a tiny n with d > 1 is outside what was checked). Straight-line, so the compiler interleaves
// many of them: the per-element check and call made each sigmoid its own branch
// region, and a tile's 32 values a thread ran one after another (swiglu_dual at
// 77 instructions a value and 62% issue; ncu, H100, twenty-sixth session).
// n below 2^-100 only comes with d = 1 (sigmoid: 1 + e rounds to 1 for e < 2^-24),
// where every step is exact: n itself, subnormals and zeros included.
// `sigmoid_div_is_ieee` (ops.cu) checks every f32 sigmoid against the division.
__device__ __forceinline__ float div_unit(float n, float d) {
    float r0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(d));
    const float r = fmaf(r0, fmaf(-d, r0, 1.0f), r0);
    const float q = fmaf(n, r, 0.0f);
    return fmaf(r, fmaf(-d, q, n), q);
}

// The logistic function as ops/swiglu.rs computes it: 1 / (1 + exp(-x)) for x >= 0,
// e / (1 + e) with e = exp(x) below (swiglu in ops.cu and quantize.cu), as one
// path of the same operations (the exponent's argument and the numerator selected):
// no divergence where a warp's lanes straddle 0.
__device__ __forceinline__ float sigmoid(float x) {
    const bool pos = x >= 0.0f;
    const float e = expf(pos ? -x : x);
    return div_unit(pos ? 1.0f : e, 1.0f + e);
}
// The same with the IEEE division (the definition sigmoid keeps the bits of).
__device__ __forceinline__ float sigmoid_ieee(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

// The entry of a multi-tensor launch's table that block `block` belongs to: the last
// t < T with tab[t * stride + field] <= block (that field ascending: each tensor's
// first block). adamw_multi, sumsq_partial_multi, quant_block128_multi and
// quant_dual_multi share it.
__device__ __forceinline__ int tensor_of(const long long* tab, int stride, int field, int T, long block) {
    int lo = 0, hi = T - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (tab[(long)mid * stride + field] <= block) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// One entry of d loss / d logits for a token's log-probability and the row's entropy:
// z the logit, l the row's log-sum-exp, h its entropy, gl and ge the gradients of the
// log-probability and the entropy, target whether this entry is the token (then + gl),
// times scale (token_logprobs_bwd in logsoftmax.cu and token_logprobs_bwd_fp8 in
// quantize.cu share it, so their values agree).
__device__ __forceinline__ float logprob_grad(float z, float l, float h, float gl, float ge, bool target,
                                              float scale) {
    const float lp = z - l;
    const float p = expf(lp);
    float d = -gl * p - ge * p * (lp + h);
    if (target) d += gl;
    return __fmul_rn(d, scale);
}

// SwiGLU's gradients of one entry: d/dgate and d/dup of h = silu(g) * u given dh = d
// (swiglu_bwd and swiglu_bwd_bf16 in ops.cu, swiglu_bwd_fp8 in quantize.cu share it,
// so their values agree).
__device__ __forceinline__ float swiglu_dgate(float d, float g, float u, float s) {
    return d * u * s * (1.0f + g * (1.0f - s));
}
__device__ __forceinline__ float swiglu_dup(float d, float g, float s) { return d * g * s; }
__device__ __forceinline__ void swiglu_grads(float d, float g, float u, float& dg, float& du) {
    const float s = sigmoid(g);
    dg = swiglu_dgate(d, g, u, s);
    du = swiglu_dup(d, g, s);
}

// Programmatic dependent launch (context.rs launches every kernel with it on sm_90):
// the first statement of every kernel. It lets the stream's next kernel be scheduled
// as soon as all of this grid's blocks have started, then waits until the previous
// kernel has finished and its writes are visible, so nothing before it touches
// memory and the stream's order of effects is unchanged; what it saves is the gap
// between kernels (launch and block scheduling overlap the previous kernel's tail).
__device__ __forceinline__ void pdl_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// ---- Shared memory and asynchronous copies (flash.cu, gemm_rows.cu) -------------
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}

// The stage passes' BF16 pairs (HW: the hardware conversion, pack_bf16x2; else
// pack2_bf16). cvt.rn.bf16x2.f32 rounds to nearest even as f32_to_bf16 does,
// subnormals and infinities included, and differs only in a NaN's payload (it
// gives 0x7fff): where no value of the warp's tile is NaN (tile_has_nan) its bits
// are pack2_bf16's, one instruction a pair in place of ~15. The software pairs were
// most of the rows kernels' epilogue, itself 38% of the FP8 kernel's warp samples
// at 0.6B's q shape (ncu, H100, sixty-second session, call 2). Used by the rows
// kernels under ROWS_HW_PACK (gemm_wg.cu; prepared, not yet run on a GPU), as is
// round_bf16_tile below, and with round_bf16_as by swiglu_bwd_fp8 under
// SWIGLU_HW_BF16 (quantize.cu).
template <bool HW>
__device__ __forceinline__ u32 pack2_bf16_as(float lo, float hi) {
    if constexpr (HW) return pack_bf16x2(lo, hi);
    else return pack2_bf16(lo, hi);
}
// round_bf16 or (HW) round_bf16_hw, as pack2_bf16_as picks its pack.
template <bool HW>
__device__ __forceinline__ float round_bf16_as(float f) {
    if constexpr (HW) return round_bf16_hw(f);
    else return round_bf16(f);
}
// Whether any value of the warp's 64-value register tiles is NaN (warp-uniform, so
// the stage passes' stmatrix stay convergent): the largest |bits| above inf's.
__device__ __forceinline__ bool tile_has_nan(const float (&v)[64]) {
    u32 m = 0u;
#pragma unroll
    for (int r = 0; r < 64; r++) m = max_abs_bits(m, v[r]);
    return __any_sync(0xffffffffu, m > 0x7f800000u);
}

// round_bf16 of a register tile (the rows kernels' f32 outputs under ROWS_HW_PACK,
// gemm_wg.cu): pairs through the hardware conversion, widened back, where the
// warp's tile holds no NaN (the values round_bf16 gives), else round_bf16 a value.
__device__ __forceinline__ void round_bf16_tile(float (&v)[64]) {
    if (tile_has_nan(v)) {
#pragma unroll
        for (int r = 0; r < 64; r++) v[r] = round_bf16(v[r]);
        return;
    }
#pragma unroll
    for (int r = 0; r < 64; r += 2) {
        const u32 p = pack_bf16x2(v[r], v[r + 1]);
        v[r] = __uint_as_float(p << 16);
        v[r + 1] = __uint_as_float(p & 0xffff0000u);
    }
}

// stmatrix is sm_90 on.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Pass c of warp_tile_store_tm: columns 64 c .. 64 c + 63 of v into the stage at
// shared address sbase. Instruction m stores blocks (j, h) = (j0, 0), (j0, 1), (j0 +
// 1, 0), (j0 + 1, 1), j0 = 8 c + 2 m; lane l gives the address of block l / 8's row
// l % 8. HW: pack2_bf16_as.
template <bool HW = false>
__device__ __forceinline__ void stage_pass_tm(const float (&v)[64], u32 sbase, int c, int lane) {
#pragma unroll
    for (int m = 0; m < 4; m++) {
        const int q = lane >> 3, r = 8 * (q & 1) + (lane & 7), u = 2 * m + (q >> 1);
        const u32 addr = sbase + r * 128 + ((u ^ (r & 7)) << 4);
        const int j0 = 8 * c + 2 * m;
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
                     "r"(pack2_bf16_as<HW>(v[4 * j0 + 0], v[4 * j0 + 1])),
                     "r"(pack2_bf16_as<HW>(v[4 * j0 + 2], v[4 * j0 + 3])),
                     "r"(pack2_bf16_as<HW>(v[4 * j0 + 4], v[4 * j0 + 5])),
                     "r"(pack2_bf16_as<HW>(v[4 * j0 + 6], v[4 * j0 + 7]))
                     : "memory");
    }
}
// A warp's 16 rows x 128 BF16 outputs in mma C-fragment layout (register 4 j + 2 h
// + i holds row lane / 4 + 8 h of the warp's 16, column 8 j + 2 (lane % 4) + i: the
// FP8 rows kernel's tokens-as-A accumulators, gemm_wg.cu, and the attention
// forward's o, flash.cu) through 2,048 bytes of shared memory, 64 columns a pass:
// stmatrix (not transposed: an 8 x 8 block's memory row is a row's 8 outputs, 16
// bytes) into a [16 rows][8 units of 16 bytes] stage, unit u of row r at u ^ (r & 7)
// so a block's eight rows, 128 bytes apart, fill all 32 banks; then each row's 128
// bytes leave as eight 16-byte stores. out: the warp's (row 0, column 0) of y, row
// stride ld; toks (1-16) rows and cols (1-128) columns to write.
__device__ __forceinline__ void warp_tile_store_tm(const float (&v)[64], bf16_t* out, long ld, int toks, int cols,
                                                   u8* st, int lane) {
    const bool vec = (((u64)out | (u64)(ld * 2)) & 15) == 0;
    const u32 sbase = smem_addr(st);
#pragma unroll
    for (int c = 0; c < 2; c++) {
        if (c * 64 >= cols) break;  // warp-uniform
        stage_pass_tm(v, sbase, c, lane);
        __syncwarp();
        const int left = cols - c * 64;
        bf16_t* oc = out + c * 64;
#pragma unroll
        for (int pp = 0; pp < 4; pp++) {
            const int e = pp * 32 + lane, r = e >> 3, u = e & 7;
            if (r >= toks) continue;
            const bf16_t* src = reinterpret_cast<const bf16_t*>(st + r * 128 + ((u ^ (r & 7)) << 4));
            if (vec && u * 8 + 8 <= left) {
                *reinterpret_cast<uint4*>(oc + (long)r * ld + u * 8) = *reinterpret_cast<const uint4*>(src);
            } else {
                for (int k = 0; k < 8; k++)
                    if (u * 8 + k < left) oc[(long)r * ld + u * 8 + k] = src[k];
            }
        }
        __syncwarp();
    }
}
#endif

// 16-byte asynchronous copy global -> shared; zero-filled when !valid (a copy of
// source size 0 reads nothing).
__device__ __forceinline__ void cp16(void* s, const void* g, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(s)), "l"(g),
                 "r"(valid ? 16 : 0));
}
// cp16 to a shared address already converted (smem_addr).
__device__ __forceinline__ void cp16_at(u32 s, const void* g, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(g), "r"(valid ? 16 : 0));
}
// The same for one 4-byte word (through L1).
__device__ __forceinline__ void cp4(void* s, const void* g, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(s)), "l"(g),
                 "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
// Wait until at most N of this thread's committed copy groups are in flight.
template <int N>
__device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// ---- The rows kernels' split folds and output (gemm_rows.cu, gemm_wg.cu) ----------
// The end of a split slice: fold the slice's sums acc into the totals as the split-K
// launch's in-order sum of its slices would (the first slice taken as is), then
// restart acc. R accumulators, contiguous.
template <int R>
__device__ __forceinline__ void fold_slice(float* tot, float* acc, bool first) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        tot[r] = first ? acc[r] : tot[r] + acc[r];
        acc[r] = 0.0f;
    }
}
// linear_epilogue's ops on one total v, in its order: + b (the bias's value) when
// has_bias, the BF16 rounding when `round`, then r + v (the residual's value) when
// has_res. One definition for linear_epilogue (ops.cu) and the GEMMs' fused
// epilogues (rows_out; tile_out and tile_out_tm in gemm_wg.cu), so fused and
// unfused agree bit for bit.
// `round` EPI_BF16: rounded as 1, and the GEMM stores the BF16 bits (half the bytes,
// the same values; linear.rs `Act::Bf16`).
#define EPI_BF16 2
__device__ __forceinline__ float epi_value(float v, bool has_bias, float b, int round, bool has_res, float r) {
    if (has_bias) v += b;
    v = round ? round_bf16(v) : v;
    return has_res ? __fadd_rn(r, v) : v;
}

// ---- a split-K GEMM's epilogue as the input of a fused kernel --------------------
// The values linear_epilogue (ops.cu) writes at (r, c .. c+3) of [rows, cols] from a
// split-K partial d (slices `sstride` apart, added in slice order), no bias, rounded
// to BF16, plus res [rows, cols] when not null (one f32 add): the same adds in the
// same order, so the same bits. Also stores them into out [rows, cols] when not null.
#define SK_W 8
struct SkIn {
    const float* d;
    long ldd, sstride;
    int splits;
    const float* res;
    float* out;
};
// W: the slices a batch (rmsnorm_sk_operand's 64 registers take 4).
template <int W = SK_W>
__device__ __forceinline__ void sk_epi4(const SkIn& P, int r, int c, int cols, float v[4]) {
    const float* dr = P.d + (long)r * P.ldd + c;
    const long i = (long)r * cols + c;
    const bool vec = ((P.ldd | P.sstride | cols) & 3) == 0 &&
                     (((unsigned long long)P.d | (unsigned long long)P.res | (unsigned long long)P.out) & 15) == 0;
    if (vec && c + 3 < cols) {
        // Slices W at a time (the last batch predicated), every load of a batch
        // issued before its adds: one trip to L2 for a decode step's 4 to 8 slices,
        // where a batch of 4 then one slice at a time made a chain of up to 7.
        float4 a, t[W];
#pragma unroll
        for (int u = 0; u < W; u++)
            if (u < P.splits) t[u] = *reinterpret_cast<const float4*>(dr + u * P.sstride);
        a = t[0];
#pragma unroll
        for (int u = 1; u < W; u++)
            if (u < P.splits) a.x += t[u].x, a.y += t[u].y, a.z += t[u].z, a.w += t[u].w;
        for (int s = W; s < P.splits; s += W) {
#pragma unroll
            for (int u = 0; u < W; u++)
                if (s + u < P.splits) t[u] = *reinterpret_cast<const float4*>(dr + (s + u) * P.sstride);
#pragma unroll
            for (int u = 0; u < W; u++)
                if (s + u < P.splits) a.x += t[u].x, a.y += t[u].y, a.z += t[u].z, a.w += t[u].w;
        }
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        for (int j = 0; j < 4; j++) v[j] = epi_value(v[j], false, 0.0f, 1, P.res, P.res ? P.res[i + j] : 0.0f);
        if (P.out) *reinterpret_cast<float4*>(P.out + i) = make_float4(v[0], v[1], v[2], v[3]);
        return;
    }
    for (int j = 0; j < 4; j++) {
        v[j] = 0.0f;
        if (c + j >= cols) continue;
        float t = dr[j];
        for (int s = 1; s < P.splits; s++) t += dr[j + s * P.sstride];
        v[j] = epi_value(t, false, 0.0f, 1, P.res, P.res ? P.res[i + j] : 0.0f);
        if (P.out) P.out[i + j] = v[j];
    }
}
// sk_epi1 at columns c + stride i of row r, i < nn <= N: the loads of every value's
// batch of SK_W slices issued before the first add (one trip to L2 for a decode
// step's slices where value after value made a chain of several); each value's adds
// in slice order, so the bits of linear_epilogue.
template <int N>
__device__ __forceinline__ void sk_epi1_n(const SkIn& P, int r, int c, int stride, int cols, int nn, float v[N]) {
    const float* dr = P.d + (long)r * P.ldd + c;
    float a[N], t[N][SK_W];
    for (int s0 = 0; s0 < P.splits; s0 += SK_W) {
#pragma unroll
        for (int i = 0; i < N; i++)
#pragma unroll
            for (int u = 0; u < SK_W; u++)
                if (i < nn && s0 + u < P.splits) t[i][u] = dr[(s0 + u) * P.sstride + i * stride];
#pragma unroll
        for (int i = 0; i < N; i++)
#pragma unroll
            for (int u = 0; u < SK_W; u++)
                if (i < nn && s0 + u < P.splits) a[i] = s0 + u == 0 ? t[i][u] : a[i] + t[i][u];
    }
#pragma unroll
    for (int i = 0; i < N; i++) {
        if (i >= nn) break;
        const long at = (long)r * cols + c + i * stride;
        v[i] = epi_value(a[i], false, 0.0f, 1, P.res, P.res ? P.res[at] : 0.0f);
        if (P.out) P.out[at] = v[i];
    }
}
// One value of the same, at (r, c).
__device__ __forceinline__ float sk_epi1(const SkIn& P, int r, int c, int cols) {
    float v[1];
    sk_epi1_n<1>(P, r, c, 0, cols, 1, v);
    return v[0];
}

// One total v of (row, tok): through the fused linear epilogue when y != null (fuses
// linear_epilogue: epi_value with bias [N] and res [M][ldy] when not null) into
// y [M][ldy], else as is into d [M][ldd].
// round == EPI_BF16 (no res): y holds BF16 [M][ldy], the rounded values' bits.
__device__ __forceinline__ void rows_out(float v, int row, int tok, float* d, long ldd, float* y, long ldy,
                                         const float* bias, int round, const float* res) {
    if (y) {
        const long i = (long)tok * ldy + row;
        const float e = epi_value(v, bias, bias ? bias[row] : 0.0f, round, res, res ? res[i] : 0.0f);
        if (round == EPI_BF16)
            reinterpret_cast<bf16_t*>(y)[i] = f32_to_bf16(e);
        else
            y[i] = e;
    } else {
        d[(long)tok * ldd + row] = v;
    }
}

// ---- The batch-invariant forward GEMMs' entry points: one parameter list per kind,
// the one gemv.rs passes (`SkOps::sk_args`, `SkOps::rows_args`), for the mma.sync
// (gemv_fp8.cu, gemm_rows.cu) and wgmma (gemm_wg.cu) families alike. The last
// argument is the device function (a template instance) that does the work.
// Split-K: 128 threads, BOUNDS the parenthesized __launch_bounds__ (128 or
// 128, min blocks), partial sums into p.
#define SK_KERNEL(NAME, BOUNDS, ...)                                                                         \
    extern "C" __global__ void __launch_bounds__ BOUNDS                                                      \
        NAME(const u8* w, const float* ws, int lds, const u8* x, const float* xs, int ldxs, float* p, long ldp, \
             long sstride, int M, int N, int N_pad, int K_pad, int gps) {                                    \
        pdl_entry();                                                                                         \
        __VA_ARGS__(w, ws, lds, x, xs, ldxs, p, ldp, sstride, M, N, N_pad, K_pad, gps);                      \
    }
// Rows: 256 threads, one block an SM, into d or through the fused epilogue into y.
#define ROWS_KERNEL(NAME, ...)                                                                                \
    extern "C" __global__ void __launch_bounds__(256, 1)                                                      \
        NAME(const u8* w, const float* ws, int lds, const u8* x, const float* xs, int ldxs, float* d, long ldd, \
             int M, int N, int N_pad, int K_pad, int gps, float* y, long ldy, const float* bias, int round,     \
             const float* res) {                                                                              \
        pdl_entry();                                                                                          \
        __VA_ARGS__(w, ws, lds, x, xs, ldxs, d, ldd, M, N, N_pad, K_pad, gps, y, ldy, bias, round, res);      \
    }

// ---- The forward GEMM's arithmetic, shared by the split-K decode kernels
// (gemv_fp8.cu) and the rows kernels (gemm_rows.cu): one definition, so a row's bits
// do not depend on which kernel (or batch) computed it. ---------------------------
__device__ __forceinline__ void mma_bf16_k16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16_k16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// The f16 pair of E4M3 bytes 0-1 (j = 0) or 2-3 (j = 1) of v, low byte in the low
// half; exact (every E4M3 value is an f16).
__device__ __forceinline__ u32 e4m3x2_f16x2(u32 v, int j) {
    u32 r;
    if (j)
        asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, h; }" : "=r"(r) : "r"(v));
    else
        asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, l; }" : "=r"(r) : "r"(v));
    return r;
}
// Weight operand of one 64-value half of an FP8 group for an m16 tile: w0 / w1 the
// 16 E4M3 bytes of rows gid / gid + 8 at k = h*64 + tig*16, as the f16 words of the
// four k16 steps fp8_half_mma takes: step (s, j) = bytes s*8.. , pair j of each word.
__device__ __forceinline__ void fp8_a_words(u32 (&a)[16], uint4 w0, uint4 w1) {
#pragma unroll
    for (int s = 0; s < 2; s++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            u32* q = a + (s * 2 + j) * 4;
            q[0] = e4m3x2_f16x2(s ? w0.z : w0.x, j);
            q[1] = e4m3x2_f16x2(s ? w1.z : w1.x, j);
            q[2] = e4m3x2_f16x2(s ? w0.w : w0.y, j);
            q[3] = e4m3x2_f16x2(s ? w1.w : w1.y, j);
        }
}
// c (an m16n8 tile) += one 64-value half of an FP8 group: four k16 f16 mma steps
// chained in c. (sm_90 has no e4m3 mma.sync: ptxas lowers one k32 e4m3 step to E4M3
// -> f16 conversions and two f16 HMMAs from zero, then an f32 add; written out as f16
// steps, a whole group chains in one accumulator, without the adds.) x: the token's
// same 16 k values as f16 pairs (k 0-1, 2-3, ..., 14-15), so step (s, j) takes words
// s*4 + j and s*4 + 2 + j.
__device__ __forceinline__ void fp8_half_mma(float* c, const u32 (&a)[16], const u32 (&x)[8]) {
#pragma unroll
    for (int s = 0; s < 2; s++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const u32* q = a + (s * 2 + j) * 4;
            mma_f16_k16(c, q[0], q[1], q[2], q[3], x[s * 4 + j], x[s * 4 + 2 + j]);
        }
}
// c += one 32-value quarter of a BF16 group: w0 / w1 the 16 bytes (8 values) of rows
// gid / gid + 8 at k = h*32 + tig*8, x the token's; two k16 steps, each thread's
// values 0-3 first, then 4-7 (the k slots of A and B permuted alike).
__device__ __forceinline__ void bf16_quarter_mma(float* c, uint4 w0, uint4 w1, uint4 x) {
    mma_bf16_k16(c, w0.x, w1.x, w0.y, w1.y, x.x, x.y);
    mma_bf16_k16(c, w0.z, w1.z, w0.w, w1.w, x.z, x.w);
}

// ---- Qwen3's q/k norms with RoPE, one warp's head (ops.cu's qk_norm_rope and
// qkv_sk_norm_rope, flash.cu's fa_dec2_qkv) ------------------------------------
// The norm weight's and the RoPE tables' values a lane of qk_norm_rope_warp reads
// (w at lane + 32 i, i < n = hd / 32; cos and sin at t0 + lane + 32 i, i < n / 2),
// loaded before the head's own values are loaded or summed, so that they take no
// trip to memory of their own: loaded after the head's sum they were two more on
// the decode attention's path, a warp making two heads (thirty-second session).
struct NormRope {
    float w[8], c[4], s[4];
};
__device__ __forceinline__ void norm_rope_load(NormRope& q, int hd, const float* w, long t0, const float* cos_t,
                                               const float* sin_t) {
    const int lane = threadIdx.x & 31, n = hd / 32;
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (i < n) q.w[i] = w[lane + 32 * i];
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (i < n / 2) q.c[i] = cos_t[t0 + lane + 32 * i], q.s[i] = sin_t[t0 + lane + 32 * i];
}

// One warp's head: v[i] (i < n = hd / 32) its values at columns lane + 32 i; writes
// the normed, rotated head to dst (f32) and/or dst16 (its BF16 copy, RNE by the
// conversion fa_to_bf16_x3 uses: the tensor-core attention's operand), each unless
// null, and its rstd (lane 0) to *rs_out unless null. q: the weight's and the
// tables' values (norm_rope_load).
__device__ __forceinline__ void qk_norm_rope_warp(float v[8], int hd, float eps, const NormRope& q, float* dst,
                                                  bf16_t* dst16, float* rs_out) {
    const int lane = threadIdx.x & 31, n = hd / 32, half = hd / 2;
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (i < n) ss += v[i] * v[i];
    ss = warp_sum(ss);
    const float rs = 1.0f / sqrtf(ss / (float)hd + eps);
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (i < n) v[i] = q.w[i] * (v[i] * rs);
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (i < n / 2) {
            int j = lane + 32 * i;
            float c = q.c[i], sn = 1.0f * q.s[i];
            float u = v[i], x = v[i + n / 2];
            const float a = u * c - x * sn, b = x * c + u * sn;
            if (dst) dst[j] = a, dst[j + half] = b;
            if (dst16) {
                const u32 ab = pack_bf16x2(a, b);
                dst16[j] = (bf16_t)(ab & 0xffffu), dst16[j + half] = (bf16_t)(ab >> 16);
            }
        }
    if (lane == 0 && rs_out) *rs_out = rs;
}

// Two heads' sk_epi1_n<4> with no residual and no output copy (qkv_sk_head's use):
// head A's values at row r, columns ca + 32 i of P0, head B's (when hasB) at cb + 32 i
// of P1, i < nn <= 4; every load of a batch of 4 slices of both heads issued before
// the first add, each value's adds in slice order (sk_epi1_n's), then the BF16
// rounding: the same bits, one trip to L2 for both heads where one head after the
// other took two.
__device__ __forceinline__ void sk_epi1_heads2(const SkIn& P0, int ca, const SkIn& P1, int cb, bool hasB, int r,
                                               int nn, float va[4], float vb[4]) {
    const float* da = P0.d + (long)r * P0.ldd + ca;
    const float* db = P1.d + (long)r * P1.ldd + cb;
    const int sa = P0.splits, sb = hasB ? P1.splits : 0, smax = max(sa, sb);
    float a[4], b[4];
    for (int s0 = 0; s0 < smax; s0 += 4) {
        float ta[4][4], tb[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int u = 0; u < 4; u++) {
                if (i < nn && s0 + u < sa) ta[i][u] = da[(s0 + u) * P0.sstride + 32 * i];
                if (i < nn && s0 + u < sb) tb[i][u] = db[(s0 + u) * P1.sstride + 32 * i];
            }
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int u = 0; u < 4; u++) {
                if (i < nn && s0 + u < sa) a[i] = s0 + u == 0 ? ta[i][u] : a[i] + ta[i][u];
                if (i < nn && s0 + u < sb) b[i] = s0 + u == 0 ? tb[i][u] : b[i] + tb[i][u];
            }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (i >= nn) break;
        va[i] = epi_value(a[i], false, 0.0f, 1, false, 0.0f);
        if (hasB) vb[i] = epi_value(b[i], false, 0.0f, 1, false, 0.0f);
    }
}

// The partial of q (kind 0), k (1) or v (2), no residual and no output copy. Field
// by field: a reference into the parameters would copy all three to the stack.
__device__ __forceinline__ SkIn qkv_pick(const SkIn& qi, const SkIn& ki, const SkIn& vi, int kind) {
    SkIn P;
    P.d = kind == 0 ? qi.d : kind == 1 ? ki.d : vi.d;
    P.ldd = kind == 0 ? qi.ldd : kind == 1 ? ki.ldd : vi.ldd;
    P.sstride = kind == 0 ? qi.sstride : kind == 1 ? ki.sstride : vi.sstride;
    P.splits = kind == 0 ? qi.splits : kind == 1 ? ki.splits : vi.splits;
    P.res = nullptr;
    P.out = nullptr;
    return P;
}

// A warp's head of summed q, k or v values out (lane l holds columns l + 32 i, i <
// hd / 32): q and k (kind 0, 1) normed and rotated by qk_norm_rope_warp with q's
// weight and tables, v (2) as summed; to dst (f32) and/or dst16 (BF16,
// pack_bf16x2's rounding) unless null.
__device__ __forceinline__ void qkv_head_out(int kind, float (&v)[8], int hd, float eps, const NormRope& q,
                                             float* dst, bf16_t* dst16) {
    const int lane = threadIdx.x & 31, n = hd / 32;
    if (kind != 2) {
        qk_norm_rope_warp(v, hd, eps, q, dst, dst16, nullptr);
        return;
    }
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (i < n) {
            if (dst) dst[lane + 32 * i] = v[i];
            if (dst16) dst16[lane + 32 * i] = (bf16_t)(pack_bf16x2(v[i], v[i]) & 0xffffu);
        }
}

// One warp's head of a decode step's q, k, v projections' epilogue (fuses
// linear_epilogue_group and qk_norm_rope; ops.cu's qkv_sk_norm_rope and flash.cu's
// fa_dec2_qkv both run it, so both make the same values): head hh of row r of the
// partial `kind` picks (0 q, normed with qw; 1 k, with kw; 2 v), `cols` values a
// row; the slices summed (sk_epi1_n, lane l holding columns l + 32 i, i < hd / 32),
// q and k normed and rotated at position pos (qk_norm_rope_warp), v as summed;
// stored to dst (f32) and/or dst16 (BF16, pack_bf16x2's rounding) unless null.
__device__ __forceinline__ void qkv_sk_head(const SkIn& qi, const SkIn& ki, const SkIn& vi, int kind, int r, int hh,
                                            int cols, int hd, float eps, const float* qw, const float* kw, long pos,
                                            const float* cos_t, const float* sin_t, float* dst, bf16_t* dst16) {
    const int lane = threadIdx.x & 31, n = hd / 32;
    const SkIn P = qkv_pick(qi, ki, vi, kind);
    NormRope q;
    if (kind != 2) norm_rope_load(q, hd, kind == 0 ? qw : kw, pos * (hd / 2), cos_t, sin_t);
    float v[8];
    sk_epi1_n<4>(P, r, hh * hd + lane, 32, cols, min(n, 4), v);
    if (n > 4) sk_epi1_n<4>(P, r, hh * hd + lane + 128, 32, cols, n - 4, v + 4);
    qkv_head_out(kind, v, hd, eps, q, dst, dst16);
}

// qkv_sk_head for a warp's heads A (kind ka, head ha) and, when hasB, B (kb, hb) of
// row r, hd <= 128, into BF16 dsta and dstb only (the decode attention's use): both
// heads' tables and slices loaded before either is summed (sk_epi1_heads2), then
// each head as qkv_sk_head makes it: the same values.
__device__ __forceinline__ void qkv_sk_heads2(const SkIn& qi, const SkIn& ki, const SkIn& vi, int r, int hd, float eps,
                                              const float* qw, const float* kw, long pos,
                                              const float* cos_t, const float* sin_t, int ka, int ha, bf16_t* dsta,
                                              bool hasB, int kb, int hb, bf16_t* dstb) {
    const int lane = threadIdx.x & 31, n = hd / 32;
    const SkIn PA = qkv_pick(qi, ki, vi, ka), PB = qkv_pick(qi, ki, vi, hasB ? kb : ka);
    NormRope qa, qb;
    if (ka != 2) norm_rope_load(qa, hd, ka == 0 ? qw : kw, pos * (hd / 2), cos_t, sin_t);
    if (hasB && kb != 2) norm_rope_load(qb, hd, kb == 0 ? qw : kw, pos * (hd / 2), cos_t, sin_t);
    float va[8], vb[8];
    sk_epi1_heads2(PA, ha * hd + lane, PB, hb * hd + lane, hasB, r, n, va, vb);
    qkv_head_out(ka, va, hd, eps, qa, nullptr, dsta);
    if (hasB) qkv_head_out(kb, vb, hd, eps, qb, nullptr, dstb);
}
