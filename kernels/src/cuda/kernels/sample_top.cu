// Top-k / top-p sampling on the device (sample_top.rs, whose sample_top_reference is
// the specification), after sample.cu (its Gumbel noise and argmax helpers).
//
// The kept set of a row: its entries in the order (logp descending, index ascending),
// up to the first at which the count reaches top_k (0: off) or the probability mass
// reaches top_units (units of 2^-40; TOP_OFF: off). Entry j's mass is about
// min(exp(logp_j), 1) 2^40 (mass_units(float) in mass.cuh: a fixed f32 sequence the reference
// repeats), summed as integers, so that any order of adding gives the same sums. NaN is never kept. The token is sample_rows'
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

// A 64-bit mass added to a bin held as two u32 words (hi 2^32 + lo) by 32-bit
// shared atomics: lo's carry goes to hi. A 64-bit shared atomicAdd is a
// compare-and-swap loop on sm_90 (ATOMS.CAST.SPIN.64), which retries under the
// contention a flat row makes. Integer sums mod 2^64 either way: the same bits.
__device__ __forceinline__ void top_add_mass(u32* lo, u32* hi, u64 v) {
    const u32 vl = (u32)v, old = atomicAdd(lo, vl);
    const u32 h = (u32)(v >> 32) + (old + vl < old ? 1u : 0u);
    if (h) atomicAdd(hi, h);
}
__device__ __forceinline__ u64 top_mass(const u32* lo, const u32* hi, int b) {
    return ((u64)hi[b] << 32) | lo[b];
}

#define TOP_NO_BIN 0xffffffffu

// Each lane's entry (bin b, or TOP_NO_BIN; mass m) into the shared histogram (counts
// cnt, masses mlo/mhi): one 32-bit shared add a word. A flat row puts a level's
// entries in a few bins; what made that slow (3.2 ms of a 0.6B batch-64 decode step,
// H200) was the 64-bit add's compare-and-swap loop retrying under contention, not
// the conflicts themselves, which 32-bit adds resolve in the hardware. Grouping a
// warp's lanes of one bin first cost more than it saved (thirty-fourth session:
// __match_any_sync groups ran the compiler's divergent loop of reductions; ballot
// groups, three, two or one a warp slot, left the top-p rollout 5-13% slower than
// none; the adds as PTX red/atom, without the compiler's own aggregation, took 6%
// more sampling time).
__device__ __forceinline__ void top_bin_add(u32 b, u64 m, bool use_p, u32* cnt, u32* mlo, u32* mhi) {
    if (b == TOP_NO_BIN) return;
    if (use_p) top_add_mass(mlo + b, mhi + b, m);
    atomicAdd(cnt + b, 1u);
}

// Entries j .. j + 3 of row lr into x (NaN past the row); vec: the row is 16-byte
// aligned and vocab a multiple of 4, so one float4 load.
__device__ __forceinline__ void top_load4(const float* lr, int j, int vocab, bool vec, float* x) {
    const float nan = __int_as_float(0x7fffffff);
    if (vec && j < vocab) {
        const float4 v = *reinterpret_cast<const float4*>(lr + j);
        x[0] = v.x;
        x[1] = v.y;
        x[2] = v.z;
        x[3] = v.w;
        return;
    }
#pragma unroll
    for (int e = 0; e < 4; e++) x[e] = j + e < vocab ? lr[j + e] : nan;
}

// Inclusive scan of (c, m) over the warp's lanes.
__device__ __forceinline__ void top_warp_scan(u32& c, u64& m, int lane) {
    for (int o = 1; o < 32; o <<= 1) {
        const u32 oc = __shfl_up_sync(0xffffffffu, c, o);
        const u64 om = __shfl_up_sync(0xffffffffu, m, o);
        if (lane >= o) {
            c += oc;
            m += om;
        }
    }
}

// The block's exclusive prefix (in thread order) of each thread's (c, m), and the
// block's totals; blockDim.x 1024. wc, wm: 32 entries of shared scratch each.
__device__ __forceinline__ void top_scan(u32 c, u64 m, u32& ec, u64& em, u32* wc, u64* wm) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    u32 ic = c;
    u64 im = m;
    top_warp_scan(ic, im, lane);
    if (lane == 31) {
        wc[w] = ic;
        wm[w] = im;
    }
    __syncthreads();
    if (w == 0) {  // the warps' sums, scanned by warp 0
        u32 sc = wc[lane];
        u64 sm = wm[lane];
        top_warp_scan(sc, sm, lane);
        wc[lane] = sc;
        wm[lane] = sm;
    }
    __syncthreads();
    ec = ic - c + (w > 0 ? wc[w - 1] : 0u);
    em = im - m + (w > 0 ? wm[w - 1] : 0ull);
    __syncthreads();  // wc, wm free again
}

// ---- A row split over a cluster of blocks (sm_90) --------------------------------
// Launched without a cluster a block is a cluster of one: rank 0 of 1.
__device__ __forceinline__ u32 top_cta_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ u32 top_cta_count() {
    u32 n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
}
// Every thread of the cluster's blocks arrives; shared writes before it are seen
// by every block's reads after it (a __syncthreads for one block).
__device__ __forceinline__ void top_cluster_sync(u32 ncta) {
    if (ncta == 1) {
        __syncthreads();
        return;
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The shared::cluster address of shared variable p in block `rank` of the cluster.
__device__ __forceinline__ u32 top_remote(const void* p, u32 rank) {
    u32 a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_addr(p)), "r"(rank));
    return a;
}
__device__ __forceinline__ u32 top_ld32(const void* p, u32 rank) {
    u32 v;
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(top_remote(p, rank)) : "memory");
    return v;
}
__device__ __forceinline__ u64 top_ld64(const void* p, u32 rank) {
    u64 v;
    asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(top_remote(p, rank)) : "memory");
    return v;
}
__device__ __forceinline__ void top_st32(void* p, u32 rank, u32 v) {
    asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(top_remote(p, rank)), "r"(v) : "memory");
}
// Bin b's count and mass summed over the cluster's blocks (rank order; integer sums).
__device__ __forceinline__ void top_bin_sum(const u32* cnt, const u32* mlo, const u32* mhi, int b, u32 ncta, u32& c,
                                            u64& m) {
    if (ncta == 1) {  // launched without a cluster: this block's own bins
        c = cnt[b];
        m = top_mass(mlo, mhi, b);
        return;
    }
    c = 0u;
    m = 0ull;
    for (u32 q = 0; q < ncta; q++) {
        c += top_ld32(cnt + b, q);
        m += ((u64)top_ld32(mhi + b, q) << 32) | top_ld32(mlo + b, q);
    }
}

// Grid (rows x cluster size), block 1024, in clusters of 1 or more blocks a row
// (sample_top.rs picks 2 where two blocks a row still fit the GPU at once): block
// `rank` of a row's cluster takes the slice [rank len, (rank + 1) len) of the row;
// the blocks' histograms are summed through distributed shared memory, each block
// scanning the same sums (so all find the same boundary), the ties' chunks counted
// in rank order, and rank 0 takes the best of the blocks' draws (beats: the same
// winner as one block's argmax). logp [rows, vocab]: log-softmax rows (tempered), whose
// masses sum to about 2^40; seeds [rows]; top_k 0 or >= 1; top_units TOP_OFF or >= 1.
extern "C" __global__ void __launch_bounds__(1024) sample_top(const float* logp, int rows, int vocab,
                                                              const u64* seeds, int top_k, u64 top_units_,
                                                              int* tokens, float* out_logp) {
    pdl_entry();
    __shared__ u32 cnt[TOP_BINS];
    __shared__ u32 mlo[TOP_BINS], mhi[TOP_BINS];  // a bin's mass: mhi 2^32 + mlo
    __shared__ u32 wc[32];
    __shared__ u64 wm[32];
    __shared__ u32 s_bin, s_found, s_ac, s_cb, s_blk;
    __shared__ u64 s_am, s_mb, s_best;
    __shared__ int s_tie, s_bi;
    __shared__ double sh_s[32];
    __shared__ int sh_i[32];
    const u32 ncta = top_cta_count(), rank = top_cta_rank();
    const int r = blockIdx.x / ncta, tid = threadIdx.x;
    const float* lr = logp + (long)r * vocab;
    const bool use_k = top_k > 0, use_p = top_units_ != TOP_OFF;
    const int lane = tid & 31, w = tid >> 5, nw = blockDim.x >> 5;
    const bool vec = (vocab & 3) == 0 && (((u64)lr) & 15) == 0;
    // This block's slice of the row (starts at multiples of 4: float4 loads).
    const int slen = ((vocab + (int)ncta - 1) / (int)ncta + 3) / 4 * 4;
    const int s0 = min(vocab, (int)rank * slen), s1 = min(vocab, s0 + slen);
    // Above the boundary bin found so far: the count and mass of the entries there.
    u32 prefix = 0, ac = 0;
    u64 am = 0;
    bool all = !use_k && !use_p;
    auto reached = [&](u32 c, u64 m) { return (use_k && ac + c >= (u32)top_k) || (use_p && am + m >= top_units_); };
    for (int lvl = 0; lvl < 3 && !all; lvl++) {
        const int sh = lvl == 0 ? 21 : lvl == 1 ? 10 : 0, bits = lvl == 2 ? 10 : 11, nb = 1 << bits;
        for (int i = tid; i < nb; i += blockDim.x) {
            cnt[i] = 0u;
            mlo[i] = 0u;
            mhi[i] = 0u;
        }
        if (tid == 0) s_found = 0u;
        __syncthreads();
        // Each lane takes 8 entries a pass, two float4 loads issued before any is
        // binned (a pass of one entry a lane had one load a warp in flight: a row on
        // one SM ran at ~5 bytes a cycle); top_bin_add adds them.
        for (int j0 = s0 + 4 * (tid - lane); j0 < s1; j0 += 8 * blockDim.x) {  // warp-uniform
            float x[8];
            top_load4(lr, j0 + 4 * lane, s1, vec, x);
            top_load4(lr, j0 + 4 * (int)blockDim.x + 4 * lane, s1, vec, x + 4);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                u32 b = TOP_NO_BIN;  // NaN, past the row, or outside the prefix
                u64 m = 0ull;
                bool ok;
                const u32 k = top_key(x[e], ok);
                if (ok && (lvl == 0 || (k >> (sh + bits)) == prefix)) {
                    b = (k >> sh) & (u32)(nb - 1);
                    if (use_p) m = mass_units(x[e]);
                }
                top_bin_add(b, m, use_p, cnt, mlo, mhi);
            }
        }
        top_cluster_sync(ncta);  // every block's histogram whole
        // Thread t holds the bins at descending places 2t and 2t + 1 (bins nb-1-2t, nb-2-2t),
        // summed over the cluster's blocks.
        const int b0 = nb - 1 - 2 * tid, b1 = b0 - 1;
        u32 c0 = 0u, c1 = 0u;
        u64 m0 = 0ull, m1 = 0ull;
        if (b0 >= 0) top_bin_sum(cnt, mlo, mhi, b0, ncta, c0, m0);
        if (b1 >= 0) top_bin_sum(cnt, mlo, mhi, b1, ncta, c1, m1);
        u32 ec;
        u64 em;
        top_scan(c0 + c1, m0 + m1, ec, em, wc, wm);
        // `reached` only grows down the bins: one bin is the first to reach it.
        const bool before = reached(ec, em), at0 = reached(ec + c0, em + m0), at1 = reached(ec + c0 + c1, em + m0 + m1);
        if (b0 >= 0 && at0 && !before) {
            s_bin = (u32)b0;
            s_ac = ac + ec;
            s_am = am + em;
            s_cb = c0;
            s_mb = m0;
            s_found = 1u;
        } else if (b1 >= 0 && at1 && !at0) {
            s_bin = (u32)b1;
            s_ac = ac + ec + c0;
            s_am = am + em + m0;
            s_cb = c1;
            s_mb = m1;
            s_found = 1u;
        }
        // Every block done reading the others' histograms (the next level clears them).
        top_cluster_sync(ncta);
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
        const u32 ct = s_cb;  // the boundary key's entries in the whole row
        const u64 mt = s_mb / ct;
        u32 n = ct;
        if (use_k && ac + ct >= (u32)top_k) n = min(n, (u32)top_k - ac);
        if (use_p && am + (u64)ct * mt >= top_units_) n = min(n, (u32)((top_units_ - am + mt - 1) / mt));
        // Warp w's chunk of the row, [c0, c1): its ties counted a lane at a time
        // (coalesced), the chunks' counts scanned in order, then the warp whose chunk
        // holds the n-th tie walks it 32 entries at a time (ballots, index order).
        // All of them kept (n == ct, as for a continuous row): no pass at all.
        if (n == ct) {
            if (tid == 0) s_tie = 0x7fffffff;
        } else {
            const int chunk = ((s1 - s0 + nw - 1) / nw + 31) / 32 * 32;
            const int c0 = min(s1, s0 + w * chunk), c1 = min(s1, c0 + chunk);
            u32 mine = 0;
#pragma unroll 4
            for (int j = c0 + lane; j < c1; j += 32) {
                bool ok;
                mine += top_key(lr[j], ok) == prefix && ok;
            }
            mine = __reduce_add_sync(0xffffffffu, mine);
            u32 before;
            u64 unused;
            top_scan(lane == 0 ? mine : 0u, 0ull, before, unused, wc, wm);
            before = __shfl_sync(0xffffffffu, before, 0);
            // The blocks before this one in the row (rank order) hold the first ties.
            if (w == nw - 1 && lane == 0) s_blk = before + mine;
            top_cluster_sync(ncta);
            for (u32 q = 0; q < rank; q++) before += top_ld32(&s_blk, q);
            if (before < n && n <= before + mine) {  // warp-uniform
                u32 seen = before;
                for (int jb = c0; jb < c1; jb += 32) {
                    const int j = jb + lane;
                    bool ok = false;
                    const bool t = j < c1 && top_key(lr[j], ok) == prefix && ok;
                    const u32 bal = __ballot_sync(0xffffffffu, t);
                    const u32 c = __popc(bal);
                    if (seen + c >= n) {
                        // The (n - seen)-th set bit of bal, lowest first.
                        const u32 want = n - seen;
                        const u32 below = __popc(bal & ((1u << lane) - 1u));
                        if (t && below + 1 == want) {
                            s_tie = j;
                            for (u32 q = 0; q < ncta; q++)
                                if (q != rank) top_st32(&s_tie, q, (u32)j);
                        }
                        break;
                    }
                    seen += c;
                }
            }
        }
        top_cluster_sync(ncta);  // s_tie written in every block
        tie = s_tie;
    }
    const u64 key = mix64(seeds[r] ^ SEED_SALT);
    const float ninf = -__int_as_float(0x7f800000);
    double bs = NEG_INF;
    int bi = NO_INDEX;
    score_entries(
        s0 + tid, s1, blockDim.x,
        [&](int j) {
            const float x = lr[j];
            bool ok;
            const u32 k = top_key(x, ok);
            return ok && (all || k > prefix || (k == prefix && j <= tie)) ? x : ninf;
        },
        false, key, bs, bi);
    block_argmax(bs, bi, sh_s, sh_i);
    if (tid == 0) {
        s_best = (u64)__double_as_longlong(bs);
        s_bi = bi;
    }
    top_cluster_sync(ncta);
    if (rank == 0 && tid == 0) {
        for (u32 q = 1; q < ncta; q++) {
            const double qs = __longlong_as_double((long long)top_ld64(&s_best, q));
            const int qi = (int)top_ld32(&s_bi, q);
            if (beats(qs, qi, bs, bi)) {
                bs = qs;
                bi = qi;
            }
        }
        const int t = bi == NO_INDEX ? 0 : bi;
        tokens[r] = t;
        out_logp[r] = lr[t];
    }
    // A block's shared memory must outlive rank 0's reads of it.
    if (ncta > 1) top_cluster_sync(ncta);
}
