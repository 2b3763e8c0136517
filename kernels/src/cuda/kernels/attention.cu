// Grouped-query causal attention for short sequences (ops/attention.rs), one block
// per (query row, head), scores of the row in shared memory. The same kernel serves
// the training forward (rows of packed sequences) and decode against a KV cache:
// each row says where its keys start and how many it sees, so a row's result
// depends on nothing else in the batch.
//
// Per row r: keys/values are rows kv0[r] .. kv0[r] + len[r] of k, v [*, nkv*hd], or
// (pt not null: a paged KV cache) key j is row pt[kv0[r] + j / pg] * pg + j % pg;
// probs (optional) of head h are written at poff[r] + h * pstride[r] + j.
// q, out: [rows, nh*hd]. Dot products run over d in order, and out_d over j in
// order, as attend_row does; only the softmax sum is a tree.

extern "C" __global__ void attn_fwd(const float* q, const float* k, const float* v, const int* kv0,
                                    const int* pt, int pg, const int* len, const long long* poff,
                                    const int* pstride, int nh, int nkv, int hd, float scale, float* out,
                                    float* probs) {
    pdl_entry();
    extern __shared__ float sm[];  // [hd] q, then [len] scores
    __shared__ float red[32];
    int r = blockIdx.x, h = blockIdx.y, n = len[r];
    int qw = nh * hd, kvw = nkv * hd;
    float* qs = sm;
    float* s = sm + hd;
    const float* qh = q + (long)r * qw + (long)h * hd;
    const int k0 = kv0[r];
    const long hoff = (long)(h / (nh / nkv)) * hd;
    // Key j's cache row times the row width (plus the head's offset).
    auto at = [&](int j) -> long {
        const long row = pt ? (long)pt[k0 + j / pg] * pg + j % pg : (long)k0 + j;
        return row * kvw + hoff;
    };
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qh[d];
    __syncthreads();
    float m = -__uint_as_float(0x7f800000u);
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float* kj = k + at(j);
        float dot = 0.0f;
        for (int d = 0; d < hd; d++) dot += qs[d] * kj[d];
        s[j] = dot * scale;
        m = fmaxf(m, s[j]);
    }
    m = block_max(m, red);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float e = expf(s[j] - m);
        s[j] = e;
        sum += e;
    }
    sum = block_sum(sum, red);
    for (int j = threadIdx.x; j < n; j += blockDim.x) s[j] = s[j] / sum;
    __syncthreads();
    if (probs) {
        float* pr = probs + poff[r] + (long)h * pstride[r];
        for (int j = threadIdx.x; j < n; j += blockDim.x) pr[j] = s[j];
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int j = 0; j < n; j++) o += s[j] * v[at(j) + d];
        out[(long)r * qw + (long)h * hd + d] = o;
    }
}

// Backward, part 1: one block per (query row, head). With g = dout row:
// dp_j = g . v_j, ds_j = p_j (dp_j - sum_i p_i dp_i) * scale (kept in `ds`, laid
// out as probs), dq = sum_j ds_j k_j.
extern "C" __global__ void attn_bwd_q(const float* dout, const float* q, const float* k, const float* v,
                                      const float* probs, const int* kv0, const int* len,
                                      const long long* poff, const int* pstride, int nh, int nkv, int hd,
                                      float scale, float* ds, float* dq) {
    pdl_entry();
    extern __shared__ float sm[];  // [hd] g, then [len] ds
    __shared__ float red[32];
    int r = blockIdx.x, h = blockIdx.y, n = len[r];
    int qw = nh * hd, kvw = nkv * hd;
    float* gs = sm;
    float* d_s = sm + hd;
    long qo = (long)r * qw + (long)h * hd;
    long kvoff = (long)kv0[r] * kvw + (long)(h / (nh / nkv)) * hd;
    const float* p = probs + poff[r] + (long)h * pstride[r];
    for (int d = threadIdx.x; d < hd; d += blockDim.x) gs[d] = dout[qo + d];
    __syncthreads();
    float pdp = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float* vj = v + kvoff + (long)j * kvw;
        float dp = 0.0f;
        for (int d = 0; d < hd; d++) dp += gs[d] * vj[d];
        d_s[j] = dp;
        pdp += p[j] * dp;
    }
    pdp = block_sum(pdp, red);
    float* dsr = ds + poff[r] + (long)h * pstride[r];
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float x = p[j] * (d_s[j] - pdp) * scale;
        d_s[j] = x;
        dsr[j] = x;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
        for (int j = 0; j < n; j++) a += d_s[j] * k[kvoff + (long)j * kvw + d];
        dq[qo + d] = a;
    }
}

// Backward, part 2: one block per (key row, kv head). Key row c of a sequence is
// seen by the query rows c .. end[c] - 1 of the same sequence (self-attention,
// kv0 = the sequence's first row); dk_c = sum ds q, dv_c = sum p g, summed over
// query rows in order and, within a row, over the heads of the group in order
// (the CPU's loop order).
extern "C" __global__ void attn_bwd_kv(const float* dout, const float* q, const float* probs,
                                       const float* ds, const int* kv0, const int* end,
                                       const long long* poff, const int* pstride, int nh, int nkv, int hd,
                                       float* dk, float* dv) {
    pdl_entry();
    int c = blockIdx.x, kh = blockIdx.y;
    int group = nh / nkv, qw = nh * hd, kvw = nkv * hd;
    int j = c - kv0[c];
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float ak = 0.0f, av = 0.0f;
        for (int t = c; t < end[c]; t++) {
            for (int h = kh * group; h < (kh + 1) * group; h++) {
                long pi = poff[t] + (long)h * pstride[t] + j;
                long qo = (long)t * qw + (long)h * hd + d;
                av += probs[pi] * dout[qo];
                ak += ds[pi] * q[qo];
            }
        }
        dk[(long)c * kvw + (long)kh * hd + d] = ak;
        dv[(long)c * kvw + (long)kh * hd + d] = av;
    }
}
