// Log-softmax over logits z [rows, vocab] (ops/logsoftmax.rs). Every function takes
// a row's max m and ln S (S = sum_j exp(z_j - m)) from the same two kernels, so the
// logp of a token is the same bits in training (token_logprobs_fwd), in sampling
// (row_stats, sample.cu; draw_pick, draw.cu) and in log_softmax_rows, as on the CPU.
//
// The row is cut into chunks of LS_CHUNK entries, a fixed length (not the batch's
// or the GPU's), so every caller adds the same terms in the same order:
// softmax_chunk_stats reduces each chunk (its max m_c, s_c = sum exp(z - m_c) and
// t_c = sum exp(z - m_c) (z - m_c), for the entropy), one block a (row, chunk);
// softmax_row_finish merges a row's chunks in chunk order, one thread a row. One
// block a row (the old row_shift) kept 64 SMs of 132 busy at a decode batch of 64
// and read the row two or three times.

#define LS_CHUNK 8192
#define LS_THREADS 256
#define LS_PER (LS_CHUNK / LS_THREADS)  // entries a thread: j0 + t + u LS_THREADS

// The logits z are f32, or (the _z16 kernels) the BF16 values the LM head's rows GEMM
// stored (act.rs): read as f32, exactly, so every result's bits are the f32 form's.
__device__ __forceinline__ float z_at(const float* z, long i) { return z[i]; }
__device__ __forceinline__ float z_at(const bf16_t* z, long i) { return bf16_to_f32(z[i]); }
// Four entries at a 4-entry-aligned i.
__device__ __forceinline__ void z_at4(const float* z, long i, float v[4]) {
    const float4 q = *reinterpret_cast<const float4*>(z + i);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
__device__ __forceinline__ void z_at4(const bf16_t* z, long i, float v[4]) {
    bf16x4_to_f32(*reinterpret_cast<const uint2*>(z + i), v);
}

// Grid (rows, ceil(vocab / LS_CHUNK)), block LS_THREADS. Row r of the stats reads
// logits row src[r] (src null: row r), so scored rows are read in place from the
// LM head's full output. st [rows][chunks] = (m_c, s_c, t_c, 0); a chunk with no
// finite max (every entry -inf) has s_c = t_c = 0. Thread t adds its entries in u
// order, then block_sum's fixed tree. MASS (the plain draw, draw.cu): also the
// chunk's integer mass, mass [rows][chunks] = sum_j draw_units(z_j, m_c) (exact in
// any order; 0 for a chunk with no finite max).
template <typename Z, bool MASS>
__device__ __forceinline__ void softmax_chunk_stats_at(const Z* z, int vocab, const int* src, float4* st,
                                                       u64* mass) {
    __shared__ float sh[32];
    __shared__ u64 shu[32];
    const int r = blockIdx.x, c = blockIdx.y;
    const Z* zr = z + (long)(src ? src[r] : r) * vocab;
    const float ninf = -__uint_as_float(0x7f800000u);
    const int j0 = c * LS_CHUNK + threadIdx.x;
    float v[LS_PER];
#pragma unroll
    for (int u = 0; u < LS_PER; u++) {
        const int j = j0 + u * LS_THREADS;
        v[u] = j < vocab ? z_at(zr, j) : ninf;
    }
    float m = ninf;
#pragma unroll
    for (int u = 0; u < LS_PER; u++) m = fmaxf(m, v[u]);
    m = block_max(m, sh);
    float s = 0.0f, t = 0.0f;
    u64 units = 0;
    if (m != ninf) {
#pragma unroll
        for (int u = 0; u < LS_PER; u++) {
            if (j0 + u * LS_THREADS >= vocab) continue;
            const float d = v[u] - m;
            const float e = expf(d);
            s += e;
            t += e * d;
            if (MASS) units += draw_units(v[u], m);
        }
    }
    // s's and t's block sums side by side: each block_sum's tree (the same bits), one
    // barrier for both (two block_sums took four). The draw's (MASS) keeps the two
    // calls: the pair there took 72 -> 80 registers.
    if (MASS) {
        s = block_sum(s, sh);
        t = block_sum(t, sh);
    } else {
        __shared__ float sh2[2][32];
        const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
        s = warp_sum(s);
        t = warp_sum(t);
        if (lane == 0) sh2[0][w] = s, sh2[1][w] = t;
        __syncthreads();
        s = warp_sum(lane < LS_THREADS / 32 ? sh2[0][lane] : 0.0f);
        t = warp_sum(lane < LS_THREADS / 32 ? sh2[1][lane] : 0.0f);
    }
    if (MASS) units = block_sum_u64(units, shu);
    if (threadIdx.x == 0) {
        st[(long)r * gridDim.y + c] = make_float4(m, s, t, 0.0f);
        if (MASS) mass[(long)r * gridDim.y + c] = units;
    }
}
extern "C" __global__ void softmax_chunk_stats(const float* z, int vocab, const int* src, float4* st) {
    pdl_entry();
    softmax_chunk_stats_at<float, false>(z, vocab, src, st, nullptr);
}
// At most 64 registers (56: four blocks an SM, three at its 80): 1.2 GB of logits a
// 0.6B step, 0.78 -> 0.68 ms (H200, forty-ninth session).
extern "C" __global__ void __launch_bounds__(LS_THREADS, 4)
    softmax_chunk_stats_z16(const bf16_t* z, int vocab, const int* src, float4* st) {
    pdl_entry();
    softmax_chunk_stats_at<bf16_t, false>(z, vocab, src, st, nullptr);
}
extern "C" __global__ void softmax_chunk_stats_mass(const float* z, int vocab, float4* st, u64* mass) {
    pdl_entry();
    softmax_chunk_stats_at<float, true>(z, vocab, nullptr, st, mass);
}

// A row's chunk stats sr [chunks] merged in chunk order: m = max m_c, S = sum_c s_c
// exp(m_c - m), T = sum_c exp(m_c - m) (t_c + (m_c - m) s_c) (= S sum_j p_j (z_j -
// m)). Products and sums rounded one by one (no fused multiply-add): the merge's bits
// are written out here, not left to contraction. Every m and ln S the draws and the
// scored rows use comes from here (softmax_row_finish, draw_pick).
__device__ __forceinline__ void row_merge(const float4* sr, int chunks, float& m, float& S, float& T) {
    m = -__uint_as_float(0x7f800000u);
    for (int c = 0; c < chunks; c++) m = fmaxf(m, sr[c].x);
    S = 0.0f;
    T = 0.0f;
    for (int c = 0; c < chunks; c++) {
        const float4 q = sr[c];
        if (!(q.y > 0.0f)) continue;  // an all -inf chunk adds nothing
        const float dm = __fsub_rn(q.x, m);
        const float e = expf(dm);
        S = __fadd_rn(S, __fmul_rn(q.y, e));
        T = __fadd_rn(T, __fmul_rn(e, __fadd_rn(q.z, __fmul_rn(dm, q.y))));
    }
}

// One thread a row r < rows: row_merge's m, S and T; ln S; optional outputs: m_out,
// lns_out (sampling), and for the target tgt[r] of logits row src[r] (src null: r):
// logp = (z_t - m) - ln S, entropy = ln S - T / S, lse = m + ln S.
template <typename Z>
__device__ __forceinline__ void softmax_row_finish_at(const float4* st, int rows, int chunks, const Z* z, int vocab,
                                                      const int* src, const int* tgt, float* m_out, float* lns_out,
                                                      float* logp, float* entropy, float* lse) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float m, S, T;
    row_merge(st + (long)r * chunks, chunks, m, S, T);
    const float lns = logf(S);
    if (m_out) m_out[r] = m;
    if (lns_out) lns_out[r] = lns;
    if (logp) {
        const Z* zr = z + (long)(src ? src[r] : r) * vocab;
        logp[r] = (z_at(zr, tgt[r]) - m) - lns;
        entropy[r] = lns - __fdiv_rn(T, S);
        lse[r] = m + lns;
    }
}
extern "C" __global__ void softmax_row_finish(const float4* st, int rows, int chunks, const float* z, int vocab,
                                              const int* src, const int* tgt, float* m_out, float* lns_out,
                                              float* logp, float* entropy, float* lse) {
    pdl_entry();
    softmax_row_finish_at(st, rows, chunks, z, vocab, src, tgt, m_out, lns_out, logp, entropy, lse);
}
extern "C" __global__ void softmax_row_finish_z16(const float4* st, int rows, int chunks, const bf16_t* z,
                                                  int vocab, const int* src, const int* tgt, float* m_out,
                                                  float* lns_out, float* logp, float* entropy, float* lse) {
    pdl_entry();
    softmax_row_finish_at(st, rows, chunks, z, vocab, src, tgt, m_out, lns_out, logp, entropy, lse);
}

// out [rows, vocab] = (z - m) - ln S (for sampling), m and ln S from softmax_row_finish;
// grid (rows, ceil(vocab / 1024)), block 256.
extern "C" __global__ void log_softmax_rows(const float* z, int vocab, const float* m, const float* lns,
                                            float* out) {
    pdl_entry();
    const int r = blockIdx.x;
    const float mr = m[r], lr = lns[r];
    const long o = (long)r * vocab;
    for (int j = blockIdx.y * 1024 + threadIdx.x; j < min(vocab, (int)(blockIdx.y + 1) * 1024); j += 256)
        out[o + j] = (z[o + j] - mr) - lr;
}

// dz = (-gl p - ge p (log p + H), plus gl at the target) * scale; grid (out_rows,
// ceil(ld / TLB_SPAN)), 256 threads, TLB_QUADS quads of four entries a thread: entries
// j0 + 1024 k .. +3, k < TLB_QUADS, j0 = blockIdx.y TLB_SPAN + 4 threadIdx.x. Output
// row o is logits row o; its per-row inputs (targets, lse, entropy, dlogp, dentropy)
// are at c = slot[o] (slot null: c = o), and a row with c < 0 is not scored: its dz
// is 0. Fuses the gathered backward's scatter into zeros and the temperature's 1/T
// (__fmul_rn; scale 1 is exact).
// dzb null: dz [out_rows, vocab] f32, ld = vocab; z and dz may be one buffer (the
// in-place backward): each thread reads its entries' logits before it writes their
// gradients, and touches no other. dzb not null: dz as the LM head's BF16 GEMM
// operand instead, [out_rows][ld] with ld = vocab padded to 16 and zero padding
// (fuses to_bf16_padded of dz: the same bits).
// _z16: z as the BF16 values the LM head stored (never in place).
// A thread's quads' logits are all loaded before the first is used, then the row's
// statistics: one quad a thread (four entries) paid the slot's and five statistics'
// loads and their address arithmetic for every four values, with one 8-byte load
// of logits in flight (1.17 ms a 0.6B bf16 step against 0.83 ms of bytes, H100,
// forty-sixth session).
#define TLB_QUADS 4
#define TLB_SPAN (1024 * TLB_QUADS)
template <typename Z>
__device__ __forceinline__ void token_logprobs_bwd_at(const Z* z, int out_rows, int vocab, const int* slot,
                                                      const int* targets, const float* lse, const float* entropy,
                                                      const float* dlogp, const float* dentropy, float scale,
                                                      float* dz, bf16_t* dzb, int ld) {
    const int o = blockIdx.x, jb = blockIdx.y * TLB_SPAN + threadIdx.x * 4;
    if (jb >= ld) return;
    const long base = (long)o * vocab;
    const int c = slot ? slot[o] : o;
    float v[TLB_QUADS][4];
    // Entry j0 + u is in the row when j0 + u < vocab (the rest: BF16 padding). The
    // tests are written on j0 and vocab, not on a clamped count: CUDA 13.0's JIT
    // turned max(0, min(4, vocab - j0)) == 4 into a predicate that was true for a
    // row's last, partial quad, which then took the float4 path and overwrote the
    // next row's first entries (cuda_parity, [7, 1003], nineteenth session).
    // A quad is read whole (16 or 8 bytes) when its four entries are in the row and
    // aligned (vocab % 4 == 0), else entry by entry (load_few: 0 past the row).
    Raw4<Z> raw[TLB_QUADS];
    const bool on = c >= 0;
#pragma unroll
    for (int k = 0; k < TLB_QUADS; k++) {
        const int j0 = jb + 1024 * k;
        raw[k].q = {};
        if (on && j0 + 4 <= vocab && ((base + j0) & 3) == 0) raw[k].load(z + base + j0);
    }
#pragma unroll
    for (int k = 0; k < TLB_QUADS; k++) {
        const int j0 = jb + 1024 * k;
        if (on && j0 < vocab && !(j0 + 4 <= vocab && ((base + j0) & 3) == 0)) raw[k].load_few(z + base, j0, vocab);
    }
    const float gl = on ? dlogp[c] : 0.0f, ge = on && dentropy ? dentropy[c] : 0.0f;
    const float l = on ? lse[c] : 0.0f, h = on ? entropy[c] : 0.0f;
    const int t = on ? targets[c] : -1;
#pragma unroll
    for (int k = 0; k < TLB_QUADS; k++) {
        const int j0 = jb + 1024 * k;
        raw[k].widen(v[k]);
#pragma unroll
        for (int u = 0; u < 4; u++)
            v[k][u] = on && j0 + u < vocab ? logprob_grad(v[k][u], l, h, gl, ge, j0 + u == t, scale) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < TLB_QUADS; k++) {
        const int j0 = jb + 1024 * k;
        if (j0 >= ld) break;
        if (dzb) {  // ld and j0 are multiples of 4: one 8-byte store
            uint2 w = make_uint2((u32)f32_to_bf16(v[k][0]) | ((u32)f32_to_bf16(v[k][1]) << 16),
                                 (u32)f32_to_bf16(v[k][2]) | ((u32)f32_to_bf16(v[k][3]) << 16));
            *reinterpret_cast<uint2*>(dzb + (long)o * ld + j0) = w;
        } else if (j0 + 4 <= vocab && ((base + j0) & 3) == 0) {
            *reinterpret_cast<float4*>(dz + base + j0) = make_float4(v[k][0], v[k][1], v[k][2], v[k][3]);
        } else {
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (j0 + u < vocab) dz[base + j0 + u] = v[k][u];
        }
    }
}
extern "C" __global__ void token_logprobs_bwd(const float* z, int out_rows, int vocab, const int* slot,
                                              const int* targets, const float* lse, const float* entropy,
                                              const float* dlogp, const float* dentropy, float scale,
                                              float* dz, bf16_t* dzb, int ld) {
    pdl_entry();
    token_logprobs_bwd_at(z, out_rows, vocab, slot, targets, lse, entropy, dlogp, dentropy, scale, dz, dzb, ld);
}
extern "C" __global__ void token_logprobs_bwd_z16(const bf16_t* z, int out_rows, int vocab, const int* slot,
                                                  const int* targets, const float* lse, const float* entropy,
                                                  const float* dlogp, const float* dentropy, float scale,
                                                  float* dz, bf16_t* dzb, int ld) {
    pdl_entry();
    token_logprobs_bwd_at(z, out_rows, vocab, slot, targets, lse, entropy, dlogp, dentropy, scale, dz, dzb, ld);
}
