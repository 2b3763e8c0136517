// Element-wise and row ops, forward and backward, in f32 with the CPU reference's
// order of operations (ops/embedding.rs, rmsnorm.rs, rope.rs, swiglu.rs, linear.rs).
// Compiled with --fmad=false, so a*b+c rounds twice as in Rust.

// ---- embedding -------------------------------------------------------------------
// out [n, dim] = table [vocab, dim] rows at tokens [n] (checked < vocab on the host).
extern "C" __global__ void embedding_fwd(const float* table, const int* tokens, int n, int dim, float* out) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n * dim) return;
    int r = (int)(i / dim), c = (int)(i % dim);
    out[i] = table[(long)tokens[r] * dim + c];
}

// dtable [vocab, dim] += dy rows, grouped by token: block u adds, in token order, the
// rows pos[off[u] .. off[u+1]) of dy into row tok[u] (the CPU's order, so bit-exact).
// Grid (n_uniq, ceil(dim / blockDim)).
extern "C" __global__ void embedding_bwd(const int* tok, const int* off, const int* pos, int n_uniq,
                                         const float* dy, int dim, float* dtable) {
    int u = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (u >= n_uniq || c >= dim) return;
    float* row = dtable + (long)tok[u] * dim;
    float acc = row[c];
    for (int p = off[u]; p < off[u + 1]; p++) acc += dy[(long)pos[p] * dim + c];
    row[c] = acc;
}

// ---- rmsnorm ---------------------------------------------------------------------
// One block per row: y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps).
extern "C" __global__ void rmsnorm_fwd(const float* x, const float* w, int rows, int dim, float eps,
                                       float* y, float* rstd) {
    __shared__ float sh[32];
    int r = blockIdx.x;
    const float* xr = x + (long)r * dim;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += xr[c] * xr[c];
    ss = block_sum(ss, sh);
    float rs = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int c = threadIdx.x; c < dim; c += blockDim.x) y[(long)r * dim + c] = w[c] * (xr[c] * rs);
    if (threadIdx.x == 0) rstd[r] = rs;
}

// dx = rstd * (dy*w - xh * mean(dy*w*xh)), xh = x * rstd; one block per row.
extern "C" __global__ void rmsnorm_bwd_dx(const float* dy, const float* x, const float* w, const float* rstd,
                                          int rows, int dim, float* dx) {
    __shared__ float sh[32];
    int r = blockIdx.x;
    long o = (long)r * dim;
    float rs = rstd[r];
    float dot = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) dot += dy[o + c] * w[c] * (x[o + c] * rs);
    dot = block_sum(dot, sh);
    float mean = dot / (float)dim;
    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        dx[o + c] = rs * (dy[o + c] * w[c] - x[o + c] * rs * mean);
}

// Column sums in a fixed order: part[chunk][c] = sum over the chunk's rows of
// a[r, c] (times x[r, c] * rstd[r] when x is given: rmsnorm's dw), then
// out[c] (+)= sum over chunks, optionally rounded to BF16.
extern "C" __global__ void colsum_partial(const float* a, const float* x, const float* rstd, int rows,
                                          int cols, int chunk, float* part) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, ch = blockIdx.y;
    if (c >= cols) return;
    int r1 = min(rows, (ch + 1) * chunk);
    float s = 0.0f;
    for (int r = ch * chunk; r < r1; r++) {
        long i = (long)r * cols + c;
        s += x ? a[i] * (x[i] * rstd[r]) : a[i];
    }
    part[(long)ch * cols + c] = s;
}
extern "C" __global__ void colsum_final(const float* part, int chunks, int cols, int accumulate, int round,
                                        float* out) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (int ch = 0; ch < chunks; ch++) s += part[(long)ch * cols + c];
    if (accumulate) s = out[c] + s;
    out[c] = round ? round_bf16(s) : s;
}

// ---- rope ------------------------------------------------------------------------
// In place on x [rows, n_heads * hd]: pairs (j, j + hd/2) of each head rotated by the
// table's angle at pos[r]; sign -1 is the backward (the inverse rotation).
extern "C" __global__ void rope(float* x, const int* pos, const float* cos_t, const float* sin_t, int rows,
                                int n_heads, int hd, float sign) {
    int half = hd / 2;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)rows * n_heads * half) return;
    int j = (int)(i % half);
    long rh = i / half;
    int r = (int)(rh / n_heads);
    long base = rh * hd;
    long t = (long)pos[r] * half + j;
    float c = cos_t[t], s = sign * sin_t[t];
    float u = x[base + j], v = x[base + j + half];
    x[base + j] = u * c - v * s;
    x[base + j + half] = v * c + u * s;
}

// ---- swiglu ----------------------------------------------------------------------
__device__ __forceinline__ float sigmoid(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}
extern "C" __global__ void swiglu_fwd(const float* gate, const float* up, long n, float* h) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i];
    h[i] = g * sigmoid(g) * up[i];
}
extern "C" __global__ void swiglu_bwd(const float* dh, const float* gate, const float* up, long n,
                                      float* dgate, float* dup) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float d = dh[i], g = gate[i], u = up[i], s = sigmoid(g);
    dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
    dup[i] = d * g * s;
}

// ---- linear epilogue ---------------------------------------------------------------
// y [rows, cols] = d (stride ldd) + bias, rounded to BF16 when `round` (the
// low-precision GEMMs: f32 accumulation, BF16 output, as linear.rs). A split-K
// decode GEMM leaves `splits` slices of d, `sstride` apart, added here in order.
// acc: y += the result (one f32 add, as add_into): WGrad adds into the step's
// gradient without a dW buffer of its own.
extern "C" __global__ void linear_epilogue(const float* d, long ldd, int splits, long sstride, const float* bias,
                                           int rows, int cols, int round, int acc, float* y) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)rows * cols) return;
    int r = (int)(i / cols), c = (int)(i % cols);
    float v = d[(long)r * ldd + c];
    for (int s = 1; s < splits; s++) v += d[s * sstride + (long)r * ldd + c];
    if (bias) v += bias[c];
    v = round ? round_bf16(v) : v;
    y[i] = acc ? __fadd_rn(y[i], v) : v;
}
