// Top-k / top-p sampling on the device (sample_top.rs, whose sample_top_reference is
// the specification), after sample.cu (its Gumbel noise and argmax helpers).
//
// The kept set of a row: its entries in the order (logp descending, index ascending),
// up to the first at which the count reaches top_k (0: off) or the probability mass
// reaches top_units (units of 2^-40; TOP_OFF: off). Entry j's mass is
// floor(min(exp(logp_j), 1) 2^40), exp in f64, summed as integers, so that any order
// of adding gives the same sums. NaN is never kept. The token is sample_rows'
// Gumbel-max over the kept entries: argmax (logp_j + G_j), the same noise, so a row
// whose kept set is the whole row draws sample_rows' token.
//
// The set is found without sorting: a radix descent over the entries' order keys
// (11, 11 and 10 bits from the top), each level a histogram of counts and masses of
// the entries under the boundary found so far, then a scan of the histogram from its
// top bin for the bin in which the count or the mass is reached; the boundary key's
// ties are kept lowest index first.

#define TOP_BINS 2048
#define TOP_OFF 0xffffffffffffffffull

// x's place in the order as an unsigned key (a larger logp has a larger key; -0 is
// +0's key); ok false for NaN.
__device__ __forceinline__ u32 top_key(float x, bool& ok) {
    u32 b = __float_as_uint(x);
    ok = !(x != x);
    if (b == 0x80000000u) b = 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// An entry's probability mass in units of 2^-40 (0 for -inf; x not NaN).
__device__ __forceinline__ u64 top_units(float x) { return (u64)(fmin(exp((double)x), 1.0) * 0x1p40); }

// The block's exclusive prefix (in thread order) of each thread's (c, m), and the
// block's totals; blockDim.x 1024. wc, wm: 32 entries of shared scratch each.
__device__ __forceinline__ void top_scan(u32 c, u64 m, u32& ec, u64& em, u32* wc, u64* wm) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    u32 ic = c;
    u64 im = m;
    for (int o = 1; o < 32; o <<= 1) {
        const u32 oc = __shfl_up_sync(0xffffffffu, ic, o);
        const u64 om = __shfl_up_sync(0xffffffffu, im, o);
        if (lane >= o) {
            ic += oc;
            im += om;
        }
    }
    if (lane == 31) {
        wc[w] = ic;
        wm[w] = im;
    }
    __syncthreads();
    if (w == 0) {
        u32 sc = wc[lane];
        u64 sm = wm[lane];
        for (int o = 1; o < 32; o <<= 1) {
            const u32 oc = __shfl_up_sync(0xffffffffu, sc, o);
            const u64 om = __shfl_up_sync(0xffffffffu, sm, o);
            if (lane >= o) {
                sc += oc;
                sm += om;
            }
        }
        wc[lane] = sc;
        wm[lane] = sm;
    }
    __syncthreads();
    ec = ic - c + (w > 0 ? wc[w - 1] : 0u);
    em = im - m + (w > 0 ? wm[w - 1] : 0ull);
    __syncthreads();  // wc, wm free again
}

// Grid (rows), block 1024. logp [rows, vocab]: log-softmax rows (tempered), whose
// masses sum to about 2^40; seeds [rows]; top_k 0 or >= 1; top_units TOP_OFF or >= 1.
extern "C" __global__ void __launch_bounds__(1024) sample_top(const float* logp, int rows, int vocab,
                                                              const u64* seeds, int top_k, u64 top_units_,
                                                              int* tokens, float* out_logp) {
    pdl_entry();
    __shared__ u32 cnt[TOP_BINS];
    __shared__ u64 mass[TOP_BINS];
    __shared__ u32 wc[32];
    __shared__ u64 wm[32];
    __shared__ u32 s_bin, s_found, s_ac;
    __shared__ u64 s_am;
    __shared__ int s_tie;
    __shared__ double sh_s[32];
    __shared__ int sh_i[32];
    const int r = blockIdx.x, tid = threadIdx.x;
    const float* lr = logp + (long)r * vocab;
    const bool use_k = top_k > 0, use_p = top_units_ != TOP_OFF;
    // Above the boundary bin found so far: the count and mass of the entries there.
    u32 prefix = 0, ac = 0;
    u64 am = 0;
    bool all = !use_k && !use_p;
    auto reached = [&](u32 c, u64 m) { return (use_k && ac + c >= (u32)top_k) || (use_p && am + m >= top_units_); };
    for (int lvl = 0; lvl < 3 && !all; lvl++) {
        const int sh = lvl == 0 ? 21 : lvl == 1 ? 10 : 0, bits = lvl == 2 ? 10 : 11, nb = 1 << bits;
        for (int i = tid; i < nb; i += blockDim.x) {
            cnt[i] = 0u;
            mass[i] = 0ull;
        }
        if (tid == 0) s_found = 0u;
        __syncthreads();
        // A warp's lanes whose entries share a bin add once, by their lowest lane
        // (__match_any_sync): their count, and their masses' sum as two halves of
        // 20 and 21 bits (a mass is at most 2^40; 32 of either half fit a u32) through
        // __reduce_add_sync. The same sums as one add an entry; but a flat row puts a
        // level's entries in one or two bins, where same-address shared atomics one
        // entry at a time took 3.2 ms of a 0.6B batch-64 decode step (H200).
        const int lane = tid & 31;
        for (int jb = tid - lane; jb < vocab; jb += blockDim.x) {
            const int j = jb + lane;
            u32 b = 0xffffffffu;  // no bin
            u64 m = 0ull;
            if (j < vocab) {
                const float x = lr[j];
                bool ok;
                const u32 k = top_key(x, ok);
                if (ok && (lvl == 0 || (k >> (sh + bits)) == prefix)) {
                    b = (k >> sh) & (u32)(nb - 1);
                    if (use_p) m = top_units(x);
                }
            }
            const u32 peers = __match_any_sync(0xffffffffu, b);
            if (b == 0xffffffffu) continue;
            const bool leader = __ffs(peers) - 1 == lane;
            if (use_p) {
                const u32 lo = __reduce_add_sync(peers, (u32)(m & 0xfffffull));
                const u32 hi = __reduce_add_sync(peers, (u32)(m >> 20));
                if (leader) atomicAdd((unsigned long long*)&mass[b], ((unsigned long long)hi << 20) + lo);
            }
            if (leader) atomicAdd(&cnt[b], (u32)__popc(peers));
        }
        __syncthreads();
        // Thread t holds the bins at descending places 2t and 2t + 1 (bins nb-1-2t, nb-2-2t).
        const int b0 = nb - 1 - 2 * tid, b1 = b0 - 1;
        const u32 c0 = b0 >= 0 ? cnt[b0] : 0u, c1 = b1 >= 0 ? cnt[b1] : 0u;
        const u64 m0 = b0 >= 0 ? mass[b0] : 0ull, m1 = b1 >= 0 ? mass[b1] : 0ull;
        u32 ec;
        u64 em;
        top_scan(c0 + c1, m0 + m1, ec, em, wc, wm);
        // `reached` only grows down the bins: one bin is the first to reach it.
        const bool before = reached(ec, em), at0 = reached(ec + c0, em + m0), at1 = reached(ec + c0 + c1, em + m0 + m1);
        if (b0 >= 0 && at0 && !before) {
            s_bin = (u32)b0;
            s_ac = ac + ec;
            s_am = am + em;
            s_found = 1u;
        } else if (b1 >= 0 && at1 && !at0) {
            s_bin = (u32)b1;
            s_ac = ac + ec + c0;
            s_am = am + em + m0;
            s_found = 1u;
        }
        __syncthreads();
        if (!s_found) {  // the whole row short of both (only at the top level): keep it all
            all = true;
            break;
        }
        prefix = (prefix << bits) | s_bin;
        ac = s_ac;
        am = s_am;
        __syncthreads();  // every thread has read s_* before the next level resets s_found
    }
    // The boundary key's ties: the first n by index are kept.
    int tie = -1;
    if (!all) {
        const u32 ct = cnt[s_bin];
        const u64 mt = mass[s_bin] / ct;
        u32 n = ct;
        if (use_k && ac + ct >= (u32)top_k) n = min(n, (u32)top_k - ac);
        if (use_p && am + (u64)ct * mt >= top_units_) n = min(n, (u32)((top_units_ - am + mt - 1) / mt));
        // Thread t's run of the row: [t len, (t + 1) len); its ties counted, then the
        // run that holds the n-th tie finds it.
        const int len = (vocab + blockDim.x - 1) / blockDim.x, j0 = min(vocab, tid * len), j1 = min(vocab, j0 + len);
        u32 mine = 0;
        for (int j = j0; j < j1; j++) {
            bool ok;
            mine += top_key(lr[j], ok) == prefix && ok;
        }
        u32 before;
        u64 unused;
        top_scan(mine, 0ull, before, unused, wc, wm);
        if (before < n && n <= before + mine) {
            u32 seen = before;
            for (int j = j0; j < j1; j++) {
                bool ok;
                if (top_key(lr[j], ok) == prefix && ok && ++seen == n) {
                    s_tie = j;
                    break;
                }
            }
        }
        __syncthreads();
        tie = s_tie;
    }
    const u64 key = mix64(seeds[r] ^ SEED_SALT);
    const float ninf = -__int_as_float(0x7f800000);
    double bs = NEG_INF;
    int bi = NO_INDEX;
    score_entries(
        tid, vocab, blockDim.x,
        [&](int j) {
            const float x = lr[j];
            bool ok;
            const u32 k = top_key(x, ok);
            return ok && (all || k > prefix || (k == prefix && j <= tie)) ? x : ninf;
        },
        false, key, bs, bi);
    block_argmax(bs, bi, sh_s, sh_i);
    if (tid == 0) {
        const int t = bi == NO_INDEX ? 0 : bi;
        tokens[r] = t;
        out_logp[r] = lr[t];
    }
}
