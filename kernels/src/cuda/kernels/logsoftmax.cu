// Log-softmax over logits z [rows, vocab] (ops/logsoftmax.rs), one block per row.
// Every function takes max and ln S from row_shift, so the logp of a token equals
// the log_softmax_rows entry bit for bit, as on the CPU.

// m = max_j z_j, ln S = ln sum_j exp(z_j - m). Needs all threads of the block; the
// block size fixes the sum's order (every caller launches 512). Thread t adds the
// entries j = t, t + B, t + 2B, ... in that order; it reads RS of them before using
// any (RS loads in flight a thread: one block streams a 151936-entry row, so one at
// a time left it latency-bound), which does not change the order.
#define RS 8
__device__ void row_shift(const float* z, int vocab, float* sh, float* m_out, float* lns_out) {
    const int B = blockDim.x;
    const float ninf = -__uint_as_float(0x7f800000u);
    float m = ninf;
    for (int j0 = threadIdx.x; j0 < vocab; j0 += RS * B) {
        float v[RS];
#pragma unroll
        for (int u = 0; u < RS; u++) v[u] = j0 + u * B < vocab ? z[j0 + u * B] : ninf;
#pragma unroll
        for (int u = 0; u < RS; u++) m = fmaxf(m, v[u]);
    }
    m = block_max(m, sh);
    float s = 0.0f;
    for (int j0 = threadIdx.x; j0 < vocab; j0 += RS * B) {
        float v[RS];
#pragma unroll
        for (int u = 0; u < RS; u++) v[u] = j0 + u * B < vocab ? z[j0 + u * B] : 0.0f;
#pragma unroll
        for (int u = 0; u < RS; u++)
            if (j0 + u * B < vocab) s += expf(v[u] - m);
    }
    s = block_sum(s, sh);
    *m_out = m;
    *lns_out = logf(s);
}

// m [rows] and ln S [rows] of row_shift (for sample_chunks, which reads them).
extern "C" __global__ void row_stats(const float* z, int rows, int vocab, float* m, float* lns) {
    pdl_entry();
    __shared__ float sh[32];
    float mm, ll;
    row_shift(z + (long)blockIdx.x * vocab, vocab, sh, &mm, &ll);
    if (threadIdx.x == 0) {
        m[blockIdx.x] = mm;
        lns[blockIdx.x] = ll;
    }
}

// logp = (z_t - m) - ln S, entropy = ln S - sum_j p_j (z_j - m), lse = m + ln S.
// Row r of the results scores logits row src[r] (src null: row r), so the scored
// rows are read in place from the LM head's full output (no gathered copy).
extern "C" __global__ void token_logprobs_fwd(const float* z, int rows, int vocab, const int* src,
                                              const int* targets, float* logp, float* entropy, float* lse) {
    pdl_entry();
    __shared__ float sh[32];
    const float* zr = z + (long)(src ? src[blockIdx.x] : blockIdx.x) * vocab;
    float m, lns;
    row_shift(zr, vocab, sh, &m, &lns);
    float pz = 0.0f;
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) {
        float zs = zr[j] - m;
        pz += expf(zs - lns) * zs;
    }
    pz = block_sum(pz, sh);
    if (threadIdx.x == 0) {
        int r = blockIdx.x;
        logp[r] = (zr[targets[r]] - m) - lns;
        entropy[r] = lns - pz;
        lse[r] = m + lns;
    }
}

// out [rows, vocab] = log-probabilities (for sampling).
extern "C" __global__ void log_softmax_rows(const float* z, int rows, int vocab, float* out) {
    pdl_entry();
    __shared__ float sh[32];
    long o = (long)blockIdx.x * vocab;
    float m, lns;
    row_shift(z + o, vocab, sh, &m, &lns);
    for (int j = threadIdx.x; j < vocab; j += blockDim.x) out[o + j] = (z[o + j] - m) - lns;
}

// dz = (-gl p - ge p (log p + H), plus gl at the target) * scale; grid (out_rows,
// ceil(vocab/1024)), four entries a thread. Output row o is logits row o; its
// per-row inputs (targets, lse, entropy, dlogp, dentropy) are at c = slot[o] (slot
// null: c = o), and a row with c < 0 is not scored: its dz is 0. Fuses the gathered
// backward's scatter into zeros and the temperature's 1/T (__fmul_rn; scale 1 is exact).
extern "C" __global__ void token_logprobs_bwd(const float* z, int out_rows, int vocab, const int* slot,
                                              const int* targets, const float* lse, const float* entropy,
                                              const float* dlogp, const float* dentropy, float scale,
                                              float* dz) {
    pdl_entry();
    int o = blockIdx.x, j0 = (blockIdx.y * blockDim.x + threadIdx.x) * 4;
    if (j0 >= vocab) return;
    long base = (long)o * vocab;
    int c = slot ? slot[o] : o;
    int n = min(4, vocab - j0);
    // float4 when the four entries are whole and 16-byte aligned (vocab % 4 == 0).
    bool vec = n == 4 && ((base + j0) & 3) == 0;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (c < 0) {
        if (vec) *reinterpret_cast<float4*>(dz + base + j0) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        else
            for (int u = 0; u < n; u++) dz[base + j0 + u] = 0.0f;
        return;
    }
    float gl = dlogp[c], ge = dentropy ? dentropy[c] : 0.0f, l = lse[c], h = entropy[c];
    int t = targets[c];
    if (vec) {
        float4 q = *reinterpret_cast<const float4*>(z + base + j0);
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
        for (int u = 0; u < n; u++) v[u] = z[base + j0 + u];
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
        float lp = v[u] - l;
        float p = expf(lp);
        float d = -gl * p - ge * p * (lp + h);
        if (j0 + u == t) d += gl;
        v[u] = __fmul_rn(d, scale);
    }
    if (vec) *reinterpret_cast<float4*>(dz + base + j0) = make_float4(v[0], v[1], v[2], v[3]);
    else
        for (int u = 0; u < n; u++) dz[base + j0 + u] = v[u];
}
