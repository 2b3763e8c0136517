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
extern "C" __global__ void token_logprobs_fwd(const float* z, int rows, int vocab, const int* targets,
                                              float* logp, float* entropy, float* lse) {
    pdl_entry();
    __shared__ float sh[32];
    const float* zr = z + (long)blockIdx.x * vocab;
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

// dz = -gl p - ge p (log p + H), plus gl at the target; grid (rows, ceil(vocab/256)).
extern "C" __global__ void token_logprobs_bwd(const float* z, int rows, int vocab, const int* targets,
                                              const float* lse, const float* entropy, const float* dlogp,
                                              const float* dentropy, float* dz) {
    pdl_entry();
    int r = blockIdx.x, j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= vocab) return;
    long i = (long)r * vocab + j;
    float gl = dlogp[r], ge = dentropy ? dentropy[r] : 0.0f;
    float lp = z[i] - lse[r];
    float p = expf(lp);
    float d = -gl * p - ge * p * (lp + entropy[r]);
    if (j == targets[r]) d += gl;
    dz[i] = d;
}
