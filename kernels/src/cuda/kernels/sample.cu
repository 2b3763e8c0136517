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

// The warp's best (score, index) into every lane's bs, bi.
__device__ __forceinline__ void warp_argmax(double& bs, int& bi) {
    for (int o = 16; o > 0; o >>= 1) {
        double os = __shfl_xor_sync(0xffffffffu, bs, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (beats(os, oi, bs, bi)) {
            bs = os;
            bi = oi;
        }
    }
}

// The block's best (score, index) into thread 0's bs, bi (all threads must call).
__device__ void block_argmax(double& bs, int& bi, double* sh_s, int* sh_i) {
    warp_argmax(bs, bi);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        sh_s[w] = bs;
        sh_i[w] = bi;
    }
    __syncthreads();
    bs = lane < nw ? sh_s[lane] : -__longlong_as_double(0x7ff0000000000000ll);
    bi = lane < nw ? sh_i[lane] : NO_INDEX;
    warp_argmax(bs, bi);
}

// Grid (rows), block 1024 (any multiple of 32 up to 1024 works).
extern "C" __global__ void sample_rows(const float* logp, int rows, int vocab, int greedy, const u64* seeds,
                                       int* tokens, float* out_logp) {
    pdl_entry();
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
    block_argmax(bs, bi, sh_s, sh_i);
    if (threadIdx.x == 0) {
        int t = bi == NO_INDEX ? 0 : bi;
        tokens[r] = t;
        out_logp[r] = lr[t];
    }
}

// sample_rows over log_softmax_rows(z) without the log-probability rows (fuses
// log_softmax_rows' entry (z_j - m) - ln S, with m and ln S from row_stats, into the
// scoring). Grid (rows, chunks), block 256: block (r, c) scores the entries
// [c * len, (c + 1) * len) of row r and writes its best (score, index) to cs, ci
// [rows][chunks]; sample_pick takes the best of a row's chunks. Lowest index on
// exact ties, as sample_rows, so the chunking changes no token.
extern "C" __global__ void sample_chunks(const float* z, const float* m, const float* lns, int rows, int vocab,
                                         int len, int greedy, const u64* seeds, double* cs, int* ci) {
    pdl_entry();
    __shared__ double sh_s[32];
    __shared__ int sh_i[32];
    int r = blockIdx.x, c = blockIdx.y, chunks = gridDim.y;
    const float* zr = z + (long)r * vocab;
    const float mr = m[r], lr = lns[r];
    u64 key = greedy ? 0ull : mix64(seeds[r] ^ SEED_SALT);
    double bs = -__longlong_as_double(0x7ff0000000000000ll);
    int bi = NO_INDEX;
    const int j1 = min(vocab, (c + 1) * len);
    for (int j = c * len + threadIdx.x; j < j1; j += blockDim.x) {
        double s = (double)((zr[j] - mr) - lr);
        if (!greedy) s = __dadd_rn(s, gumbel(key, j));
        if (s > bs) {
            bs = s;
            bi = j;
        }
    }
    block_argmax(bs, bi, sh_s, sh_i);
    if (threadIdx.x == 0) {
        cs[(long)r * chunks + c] = bs;
        ci[(long)r * chunks + c] = bi;
    }
}

// Grid (rows), block 32: a row's token from its chunks' bests and its logp (the
// log_softmax_rows entry, computed as there).
extern "C" __global__ void sample_pick(const float* z, const float* m, const float* lns, int vocab, int chunks,
                                       const double* cs, const int* ci, int* tokens, float* out_logp) {
    pdl_entry();
    int r = blockIdx.x, lane = threadIdx.x;
    double bs = -__longlong_as_double(0x7ff0000000000000ll);
    int bi = NO_INDEX;
    for (int c = lane; c < chunks; c += 32) {
        double s = cs[(long)r * chunks + c];
        int i = ci[(long)r * chunks + c];
        if (beats(s, i, bs, bi)) {
            bs = s;
            bi = i;
        }
    }
    warp_argmax(bs, bi);
    if (lane == 0) {
        int t = bi == NO_INDEX ? 0 : bi;
        tokens[r] = t;
        out_logp[r] = (z[(long)r * vocab + t] - m[r]) - lns[r];
    }
}
