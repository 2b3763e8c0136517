// The plain tempered draw by inverse CDF (draw.rs, whose draw_reference is the
// specification), after logsoftmax.cu (its chunks, row_merge) and mass.cuh.
//
// A row's tempered logits z are cut in logsoftmax.cu's chunks of LS_CHUNK entries.
// Entry j of chunk c weighs U_j = draw_units(z_j, m_c) (m_c: the chunk's max);
// softmax_chunk_stats_mass sums a chunk's into M_c. Chunk c weighs W_c = M_c E_c with
// E_c = draw_units(m_c, m) (m: the row's max), a 128-bit integer. With r the row's
// 64-bit draw (mix64 of its key), the target is T = floor(r total / 2^64) < total, and
// the token is the first entry, in index order, whose running weight (the chunks
// before it, then U_j E_c over its chunk's entries up to it) exceeds T. Every sum is
// an integer sum, so the device adds in any order and picks the reference's token.
// This replaces the Gumbel-max of sample_chunks + sample_pick (a hash and a noise
// bound for every entry, and a second pass over the row) for untruncated draws: the
// masses ride in the log-softmax stats pass, and one chunk a row is read again.

struct u128 {
    u64 lo, hi;
};
__device__ __forceinline__ u128 u128_of(u64 lo, u64 hi) {
    u128 v;
    v.lo = lo;
    v.hi = hi;
    return v;
}
__device__ __forceinline__ u128 u128_mul(u64 a, u64 b) { return u128_of(a * b, __umul64hi(a, b)); }
__device__ __forceinline__ u128 u128_add(u128 a, u128 b) {
    const u64 lo = a.lo + b.lo;
    return u128_of(lo, a.hi + b.hi + (lo < a.lo ? 1ull : 0ull));
}
__device__ __forceinline__ u128 u128_sub(u128 a, u128 b) {
    return u128_of(a.lo - b.lo, a.hi - b.hi - (a.lo < b.lo ? 1ull : 0ull));
}
__device__ __forceinline__ bool u128_lt(u128 a, u128 b) { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo); }
__device__ __forceinline__ u128 u128_shfl(u128 v, int src) {
    return u128_of(__shfl_sync(0xffffffffu, v.lo, src), __shfl_sync(0xffffffffu, v.hi, src));
}
__device__ __forceinline__ u128 u128_shfl_up(u128 v, int o) {
    return u128_of(__shfl_up_sync(0xffffffffu, v.lo, o), __shfl_up_sync(0xffffffffu, v.hi, o));
}
__device__ __forceinline__ u128 u128_shfl_xor(u128 v, int o) {
    return u128_of(__shfl_xor_sync(0xffffffffu, v.lo, o), __shfl_xor_sync(0xffffffffu, v.hi, o));
}
// floor(r t / 2^64) for t < 2^127: (r t.hi) + the carry of r t.lo into bit 64.
__device__ __forceinline__ u128 u128_scale(u64 r, u128 t) {
    return u128_add(u128_mul(r, t.hi), u128_of(__umul64hi(r, t.lo), 0ull));
}

// W_c of chunk c (sr, mr: the row's stats and masses; m the row max).
__device__ __forceinline__ u128 chunk_weight(const float4* sr, const u64* mr, int c, float m) {
    const u64 mc = mr[c];
    return mc == 0ull ? u128_of(0ull, 0ull) : u128_mul(mc, draw_units(sr[c].x, m));
}

#define DRAW_NONE 0x7fffffff

// Grid (rows), block LS_THREADS. z [rows, vocab] tempered logits, st [rows][chunks]
// and mass [rows][chunks] from softmax_chunk_stats_mass, seeds [rows]. Warp 0: the
// row's m and ln S (row_merge: the bits every logprob shifts by), its total weight,
// then the chunk holding T (chunks in 32-lane groups, a scan a group). Then the
// block reads that chunk again, thread t entries t LS_PER .. (t + 1) LS_PER in index
// order (their masses from the same f32 operations as the stats pass: the same
// integers), scans the threads' sums, and the thread whose span holds T walks it.
// The token's logp is (z_t - m) - ln S (sample_pick's, as training's). A row of no
// mass (every entry NaN or -inf) draws token 0.
extern "C" __global__ void __launch_bounds__(LS_THREADS) draw_pick(const float* z, const float4* st,
                                                                   const u64* mass, int vocab, int chunks,
                                                                   const u64* seeds, int* tokens,
                                                                   float* out_logp) {
    pdl_entry();
    __shared__ float s_m, s_lns, s_mc;
    __shared__ int s_c, s_tok;
    __shared__ u64 s_tlo, s_thi, s_e;
    __shared__ u64 wsum[LS_THREADS / 32];
    const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const float4* sr = st + (long)r * chunks;
    const u64* mr = mass + (long)r * chunks;
    const float* zr = z + (long)r * vocab;
    if (w == 0) {
        float m = 0.0f, lns = 0.0f;
        if (lane == 0) {
            float S, T;
            row_merge(sr, chunks, m, S, T);
            lns = logf(S);
        }
        m = __shfl_sync(0xffffffffu, m, 0);
        u128 tot = u128_of(0ull, 0ull);
        for (int c = lane; c < chunks; c += 32) tot = u128_add(tot, chunk_weight(sr, mr, c, m));
        for (int o = 16; o > 0; o >>= 1) tot = u128_add(tot, u128_shfl_xor(tot, o));
        const u128 t = u128_scale(mix64(mix64(seeds[r] ^ SEED_SALT)), tot);
        u128 base = u128_of(0ull, 0ull), tin = base;
        int cs = -1;
        for (int c0 = 0; c0 < chunks; c0 += 32) {
            const int c = c0 + lane;
            const u128 wc = c < chunks ? chunk_weight(sr, mr, c, m) : u128_of(0ull, 0ull);
            u128 p = wc;  // inclusive scan over the group's lanes
            for (int o = 1; o < 32; o <<= 1) {
                const u128 q = u128_shfl_up(p, o);
                if (lane >= o) p = u128_add(p, q);
            }
            const u128 incl = u128_add(base, p);
            const u32 over = __ballot_sync(0xffffffffu, c < chunks && u128_lt(t, incl));
            if (over) {  // the same in every lane: the loop ends for the warp
                const int l = __ffs(over) - 1;
                cs = c0 + l;
                tin = u128_shfl(u128_sub(t, u128_sub(incl, wc)), l);  // T less the chunks before
                break;
            }
            base = u128_shfl(incl, 31);
        }
        if (lane == 0) {
            s_m = m;
            s_lns = lns;
            s_c = cs;
            s_tlo = tin.lo;
            s_thi = tin.hi;
            s_tok = DRAW_NONE;
            if (cs >= 0) {
                s_mc = sr[cs].x;
                s_e = draw_units(sr[cs].x, m);
            }
        }
    }
    __syncthreads();
    const int cs = s_c;
    if (cs >= 0) {  // block-uniform
        const float mc = s_mc;
        const u64 e = s_e;
        const u128 tin = u128_of(s_tlo, s_thi);
        const int j0 = cs * LS_CHUNK + tid * LS_PER;
        float v[LS_PER];
        if ((vocab & 3) == 0 && j0 + LS_PER <= vocab) {  // 16-byte aligned rows, a whole span
#pragma unroll
            for (int i = 0; i < LS_PER; i += 4) {
                const float4 q = *reinterpret_cast<const float4*>(zr + j0 + i);
                v[i] = q.x, v[i + 1] = q.y, v[i + 2] = q.z, v[i + 3] = q.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < LS_PER; i++) v[i] = j0 + i < vocab ? zr[j0 + i] : __int_as_float(0x7fffffff);
        }
        u64 own = 0;
#pragma unroll
        for (int i = 0; i < LS_PER; i++) own += draw_units(v[i], mc);  // NaN past the row: 0
        u64 inc = own;
        for (int o = 1; o < 32; o <<= 1) {
            const u64 q = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += q;
        }
        if (lane == 31) wsum[w] = inc;
        __syncthreads();
        u64 before = inc - own;
        for (int k = 0; k < w; k++) before += wsum[k];
        // Exactly one thread's span [before e, (before + own) e) holds tin < M_c E_c.
        if (own > 0 && !u128_lt(tin, u128_mul(before, e)) && u128_lt(tin, u128_mul(before + own, e))) {
            u64 cum = before;
            int tok = DRAW_NONE;
#pragma unroll
            for (int i = 0; i < LS_PER; i++) {
                cum += draw_units(v[i], mc);
                if (tok == DRAW_NONE && u128_lt(tin, u128_mul(cum, e))) tok = j0 + i;
            }
            s_tok = tok;
        }
    }
    __syncthreads();
    if (tid == 0) {
        const int t = s_tok == DRAW_NONE ? 0 : s_tok;
        tokens[r] = t;
        out_logp[r] = (zr[t] - s_m) - s_lns;
    }
}
