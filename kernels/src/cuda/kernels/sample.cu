// Token sampling from log-probability rows logp [rows, vocab] (sample.rs), one block
// per row: greedy argmax, or Gumbel-max argmax_j (logp_j + G_j) with
// G_j = -log(-log(u_j)) and u_j from a counter-based hash of (seed, j). Integer hash
// and f64 noise exactly as sample_reference; lowest index wins exact ties; NaN and
// -inf never win (a row with nothing else gives token 0).

__device__ __forceinline__ u64 mix64(u64 z) {  // the splitmix64 finalizer
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
#define GOLDEN_GAMMA 0x9e3779b97f4a7c15ull
#define SEED_SALT 0x6a09e667f3bcc909ull

// Gumbel noise of entry j for a row whose key is mix64(seed ^ SEED_SALT): u is the top
// 53 bits of the splitmix64 output plus one half, times 2^-53, so 0 < u < 1 exactly.
__device__ __forceinline__ double gumbel(u64 key, long j) {
    u64 h = mix64(key + ((u64)j + 1ull) * GOLDEN_GAMMA);
    double u = __dmul_rn(__dadd_rn((double)(h >> 11), 0.5), 0x1p-53);
    return -log(-log(u));
}

// (score, index) beats (bs, bi): higher score, or the same score at a lower index.
__device__ __forceinline__ bool beats(double s, int i, double bs, int bi) {
    return s > bs || (s == bs && i < bi);
}

#define NO_INDEX 0x7fffffff

// Grid (rows), block 1024 (any multiple of 32 up to 1024 works).
extern "C" __global__ void sample_rows(const float* logp, int rows, int vocab, int greedy, const u64* seeds,
                                       int* tokens, float* out_logp) {
    __shared__ double sh_s[32];
    __shared__ int sh_i[32];
    int r = blockIdx.x;
    const float* lr = logp + (long)r * vocab;
    u64 key = greedy ? 0ull : mix64(seeds[r] ^ SEED_SALT);
    double bs = -__longlong_as_double(0x7ff0000000000000ll);
    int bi = NO_INDEX;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        double s = (double)lr[j];
        if (!greedy) s = __dadd_rn(s, gumbel(key, j));
        if (s > bs) {  // false for NaN and -inf; j rises, so the first maximum stays
            bs = s;
            bi = j;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        double os = __shfl_xor_sync(0xffffffffu, bs, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (beats(os, oi, bs, bi)) {
            bs = os;
            bi = oi;
        }
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        sh_s[w] = bs;
        sh_i[w] = bi;
    }
    __syncthreads();
    if (w != 0) return;
    bs = lane < nw ? sh_s[lane] : -__longlong_as_double(0x7ff0000000000000ll);
    bi = lane < nw ? sh_i[lane] : NO_INDEX;
    for (int o = 16; o > 0; o >>= 1) {
        double os = __shfl_xor_sync(0xffffffffu, bs, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (beats(os, oi, bs, bi)) {
            bs = os;
            bi = oi;
        }
    }
    if (lane == 0) {
        int t = bi == NO_INDEX ? 0 : bi;
        tokens[r] = t;
        out_logp[r] = lr[t];
    }
}
