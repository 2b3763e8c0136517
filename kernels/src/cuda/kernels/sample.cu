// Token sampling from log-probability rows logp [rows, vocab] (sample.rs), one block
// per row: greedy argmax, or Gumbel-max argmax_j (logp_j + G_j) with
// G_j = -log(-log(u_j)) and u_j from a counter-based hash of (seed, j). Integer hash
// and f64 noise exactly as sample_reference; lowest index wins exact ties; NaN and
// -inf never win (a row with nothing else gives token 0).

// -inf in f64: the score that never wins (the start of every best, a skipped entry's).
#define NEG_INF (-__longlong_as_double(0x7ff0000000000000ll))

// Gumbel noise of entry j for a row whose key is mix64(seed ^ SEED_SALT): from the
// splitmix64 hash h of (key, j), u = (the top 53 bits of h + 1/2) 2^-53 in f64 (0 < u
// < 1 but for the all-ones top bits, where the add rounds to 2^53: u = 1 and the
// noise +inf, as the reference's), and the noise is -log(-log(u)).
__device__ __forceinline__ u64 gumbel_hash(u64 key, long j) { return mix64(key + ((u64)j + 1ull) * GOLDEN_GAMMA); }
__device__ __forceinline__ double gumbel_u(u64 h) { return __dmul_rn(__dadd_rn((double)(h >> 11), 0.5), 0x1p-53); }
// An f32 upper bound of gumbel_u(h) from h's top 24 bits: u <= ((h >> 11) + 1) 2^-53
// (the f64 add rounds up by at most 1/2) <= ((h >> 40) + 1) 2^-24, exact in f32.
__device__ __forceinline__ float gumbel_u_upper(u64 h) { return (float)((u32)(h >> 40) + 1u) * 0x1p-24f; }

// An upper bound of -log(-log(u)) given uh >= u, from f32 fast logarithms, for
// skipping the f64 noise of entries that cannot win: each logarithm widened by
// 1e-6 + 1e-5 |value| (__logf: at most 2^-21.4 absolute error on [0.5, 2], 3 ulp
// elsewhere; the f32 adds' roundings are far inside), plus 1e-4. +inf where the bound
// would not be safe (uh = 1, or -log uh not above 2^-100).
__device__ __forceinline__ float gumbel_upper(float uh) {
    const float inf = __int_as_float(0x7f800000);
    if (!(uh < 1.0f)) return inf;
    const float l = __logf(uh);
    const float a = -(l + (1e-6f + fabsf(l) * 1e-5f));  // <= -log(u)
    if (!(a > 0x1p-100f)) return inf;
    const float la = __logf(a);
    return -(la - (1e-6f + fabsf(la) * 1e-5f)) + 1e-4f;  // >= -log(a)
}

// A cruder upper bound of the noise from h's leading ones alone (no logarithm, no
// conversion): with L < 32 leading ones in h's top 32 bits, h >> 11 has a 0 at bit
// 52 - L, so gumbel_u(h) <= ((h >> 11) + 1) 2^-53 <= 1 - 2^-(L+1), -log u >
// 2^-(L+1), and -log(-log u) < (L + 1) ln 2 (the f64 logarithms' error is far
// inside the 1e-3 added; ln 2 rounded up in f32). +inf for L = 32. A CPU test
// (sample.rs) checks the bound at its tightest h for every L.
__device__ __forceinline__ float gumbel_upper_ones(u64 h) {
    const int l = __clz(~(u32)(h >> 32));
    if (l >= 32) return __int_as_float(0x7f800000);
    // (float)(l + 1) exactly, without an I2F: 2^23 + (l + 1) read as a float, less 2^23.
    const float n = __int_as_float(0x4b000000 | (l + 1)) - 8388608.0f;
    return fmaf(n, 0.6931472f, 1e-3f);
}

// The score of an entry of log-probability x against a threshold bs (a score some
// entry of the row holds; bsf: a float at most bs): x (greedy), or x + the exact f64
// noise, or -inf (never taken) when x + an upper bound of the noise already falls
// short of bs: RN(x + G) <= RN(x + bound) < bs, so the entry could neither win nor
// tie, and the tokens are sample_reference's. The leading-ones bound first, x + it
// rounded up in f32 against bsf (so x + G < that float < bs, and RN(x + G) below
// bs too); then the logarithms' tighter one in f64; most entries stop at the
// first (the running maximum of Gumbel noise outgrows a fresh draw but rarely), so
// the f32 logarithms, the f64 compare and the f64 noise (a 64-bit conversion and
// two f64 logarithms) are the exception.
__device__ __forceinline__ double score(float x, bool greedy, u64 key, long j, double bs, float bsf) {
    if (greedy) return (double)x;
    const u64 h = gumbel_hash(key, j);
    if (__fadd_ru(x, gumbel_upper_ones(h)) < bsf) return NEG_INF;
    if (__dadd_rn((double)x, (double)gumbel_upper(gumbel_u_upper(h))) < bs)
        return NEG_INF;
    return __dadd_rn((double)x, -log(-log(gumbel_u(h))));
}

// The largest v of the warp's lanes (all 32 active).
__device__ __forceinline__ double warp_max(double v) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// A thread's entries j0, j0 + step, ... below j1 in that order, their values
// (val(j)) loaded four at a time ahead of the scoring (one load in flight a thread
// left the loop latency-bound), into its best (bs, bi). j0 - lane is the same for
// the warp's lanes, so the loop is warp-uniform. Entries are scored against the
// larger of the thread's best and the warp's (wbest: a score some lane holds, so
// the row's maximum is at least it, and an entry below it can neither win nor tie):
// a lane's own best alone let some lane of nearly every warp take the f64 path at
// every step (each lane 1/k of its k-th entry), and the warp with it. The loop is
// issue-bound (ncu, H200: 68% of issue slots): eight entries a pass with the next
// pass's loads issued first ran 4% slower than this, and a threshold seeded before
// the first pass from each lane's first entry (one f64 pass for the warp, where the
// first pass takes up to four) 2% slower (thirty-second session).
#define SCORE_UNROLL 4
template <class V>
__device__ __forceinline__ void score_entries(int j0, int j1, int step, V val, bool greedy, u64 key, double& bs,
                                              int& bi) {
    const int lane = threadIdx.x & 31;
    double wbest = NEG_INF;
    for (int jb = j0; jb - lane < j1; jb += SCORE_UNROLL * step) {
        float x[SCORE_UNROLL];
#pragma unroll
        for (int u = 0; u < SCORE_UNROLL; u++) x[u] = jb + u * step < j1 ? val(jb + u * step) : 0.0f;
        // The threshold rounded down to f32 once a pass (bs may rise inside it: a
        // lower float only skips less).
        const float bsf = __double2float_rd(fmax(bs, wbest));
#pragma unroll
        for (int u = 0; u < SCORE_UNROLL; u++) {
            const int j = jb + u * step;
            if (j >= j1) break;
            const double s = score(x[u], greedy, key, j, fmax(bs, wbest), bsf);
            if (s > bs) {  // false for NaN and -inf; j rises, so the first maximum stays
                bs = s;
                bi = j;
            }
        }
        if (!greedy) wbest = warp_max(bs);
    }
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
    bs = lane < nw ? sh_s[lane] : NEG_INF;
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
    double bs = NEG_INF;
    int bi = NO_INDEX;
    score_entries(threadIdx.x, vocab, blockDim.x, [&](int j) { return lr[j]; }, greedy, key, bs, bi);
    block_argmax(bs, bi, sh_s, sh_i);
    if (threadIdx.x == 0) {
        int t = bi == NO_INDEX ? 0 : bi;
        tokens[r] = t;
        out_logp[r] = lr[t];
    }
}

// Greedy sample_rows over log_softmax_rows(z) without the log-probability rows (fuses
// log_softmax_rows' entry (z_j - m) - ln S, with m and ln S from row_stats, into the
// scoring). Grid (rows, chunks), block 256: block (r, c) scores the entries
// [c * len, (c + 1) * len) of row r and writes its best (score, index) to cs, ci
// [rows][chunks]; sample_pick takes the best of a row's chunks. Lowest index on
// exact ties, as sample_rows, so the chunking changes no token.
extern "C" __global__ void sample_chunks(const float* z, const float* m, const float* lns, int rows, int vocab,
                                         int len, double* cs, int* ci) {
    pdl_entry();
    __shared__ double sh_s[32];
    __shared__ int sh_i[32];
    int r = blockIdx.x, c = blockIdx.y, chunks = gridDim.y;
    const float* zr = z + (long)r * vocab;
    const float mr = m[r], lr = lns[r];
    double bs = NEG_INF;
    int bi = NO_INDEX;
    const int j1 = min(vocab, (c + 1) * len);
    // Greedy: the scores are the logp values alone (no key, no noise).
    score_entries(c * len + threadIdx.x, j1, blockDim.x, [&](int j) { return (zr[j] - mr) - lr; }, true, 0ull, bs,
                  bi);
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
    double bs = NEG_INF;
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

// A decode step's inputs (decode_graph.rs) from one staged copy, staged [5][n]: each row's
// token, position, offset into the page table, length, and the page that holds its new
// row, which goes into the table (pt [*], pages of pg rows) at the row's offset plus
// (length - 1) / pg: the host picks the page when it stages the step, so a step run
// ahead of the host needs no copy of the table. Fed from the last draw (drawn not null:
// the engine's rule, a row that goes on appends the token it drew), the first fifth
// holds each row's draw row instead (-1: padding, token 0), checked on the host (below
// the draw's rows), and the tokens never travel through the host.
extern "C" __global__ void feed_step(const int* drawn, const int* staged, int n, int* tokens, int* positions,
                                     int* kv0, int* len, int* pt, int pg) {
    pdl_entry();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int r = staged[i];
    tokens[i] = drawn == nullptr ? r : r >= 0 ? drawn[r] : 0;
    positions[i] = staged[n + i];
    const int k0 = staged[2 * n + i], l = staged[3 * n + i];
    kv0[i] = k0;
    len[i] = l;
    pt[k0 + (l - 1) / pg] = staged[4 * n + i];
}
