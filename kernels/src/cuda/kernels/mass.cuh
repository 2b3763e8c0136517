// What the draws share (sample.cu, sample_top.cu, draw.cu): the row hash and an
// entry's probability mass as a fixed-point integer, both repeated one for one by
// their CPU specifications (sample.rs, sample_top.rs, draw.rs).

__device__ __forceinline__ u64 mix64(u64 z) {  // the splitmix64 finalizer
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
#define GOLDEN_GAMMA 0x9e3779b97f4a7c15ull
#define SEED_SALT 0x6a09e667f3bcc909ull

// An entry's probability mass in units of 2^-40, about min(exp(x), 1) 2^40 (0 for
// -inf; x not NaN): sample_top.rs's entry_units, the same correctly rounded f32
// operations in the same order (x clamped to [-28, 0], n = rne(x log2 e), r by a
// two-part ln 2, degree-7 Taylor polynomial by fmaf, an exact 2^(n + 40), then
// truncation), so both sides weigh an entry the same by construction. It replaced an
// f64 exp a level-0 entry (its constants re-materialised in the unrolled loop): the
// truncated draw 12-13% faster (H200). The 64-bit conversion at the end beat integer
// shifts of the significand (sampling 20.4 against 21.3 ms a batch-64 rollout).
__device__ __forceinline__ u64 mass_units(float x) {
    x = fmaxf(fminf(x, 0.0f), -28.0f);
    const float n = rintf(__fmul_rn(x, __uint_as_float(0x3fb8aa3bu)));
    const float r = fmaf(n, -__uint_as_float(0x35bfbe8eu), fmaf(n, -__uint_as_float(0x3f317200u), x));
    float p = __uint_as_float(0x39500d01u);  // 1/k!, k = 7 .. 0
    p = fmaf(p, r, __uint_as_float(0x3ab60b61u));
    p = fmaf(p, r, __uint_as_float(0x3c088889u));
    p = fmaf(p, r, __uint_as_float(0x3d2aaaabu));
    p = fmaf(p, r, __uint_as_float(0x3e2aaaabu));
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    return (u64)__fmul_rn(p, __int_as_float(((int)n + 40 + 127) << 23));
}

// The plain draw's mass of a tempered logit z in a chunk (or row) of max m (draw.cu,
// draw.rs's draw_units): mass_units(z - m), with z == m weighing 2^40 also where m
// is +inf (inf - inf would be NaN); NaN weighs 0 (never drawn), as does -inf.
__device__ __forceinline__ u64 draw_units(float z, float m) {
    if (z != z) return 0ull;
    return mass_units(z == m ? 0.0f : z - m);
}

// The sum of every thread's v, in every thread (blockDim.x a multiple of 32, at most
// 1024; sh: 32 u64 of shared scratch). Integers: the same sum in any order.
__device__ u64 block_sum_u64(u64 v, u64* sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0ull;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
