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

__device__ __forceinline__ float bf16_to_f32(bf16_t h) { return __uint_as_float(((u32)h) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN. Same as half::bf16::from_f32.
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

__device__ __forceinline__ float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// fp8::scale_for, from the bit pattern of the group's largest |x| (max over
// `bits & 0x7fffffff` is the max magnitude, and any NaN pattern wins).
__device__ __forceinline__ float e4m3_scale(u32 amax_bits) {
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
__device__ __forceinline__ u32 e4m3x2(float lo, float hi) {
    if (isnan(lo) || isnan(hi)) return e4m3_encode(lo) | (e4m3_encode(hi) << 8);
    lo = fminf(fmaxf(lo, -E4M3_MAX), E4M3_MAX);
    hi = fminf(fmaxf(hi, -E4M3_MAX), E4M3_MAX);
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return (u32)r;
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

// The logistic function as ops/swiglu.rs computes it (swiglu in ops.cu and quantize.cu).
__device__ __forceinline__ float sigmoid(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
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
