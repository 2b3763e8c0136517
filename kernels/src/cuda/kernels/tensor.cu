// Plain f32 tensor ops for the GPU trainer (tensor.rs): element-wise updates, row
// gather/scatter, and a deterministic sum of squares. Intrinsics (__fadd_rn, ...)
// make each op one IEEE operation, the same as the Rust `a + b` it replaces.

// ---- element-wise (grid ceil(n / 256) x 256) -------------------------------------
extern "C" __global__ void add_into(float* acc, const float* x, long n) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] = __fadd_rn(acc[i], x[i]);
}
extern "C" __global__ void div_scalar(float* x, long n, float s) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fdiv_rn(x[i], s);
}
// Round to BF16 (nearest even) and back, as bf16::round_slice.
extern "C" __global__ void round_bf16_inplace(float* x, long n) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = round_bf16(x[i]);
}
// y = x's BF16 values in f32 (exact): act.rs `Act::to_f32`.
extern "C" __global__ void bf16_widen(const bf16_t* x, long n, float* y) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = bf16_to_f32(x[i]);
}
extern "C" __global__ void fill_f32(float* x, long n, float v) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

// ---- rows (indices checked on the host) -------------------------------------------
// out [nrows, cols] = x rows at rows[j].
extern "C" __global__ void gather_rows(const float* x, const long* rows, long nrows, long cols, float* out) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nrows * cols) return;
    long j = i / cols, c = i % cols;
    out[i] = x[rows[j] * cols + c];
}
// dst rows at rows[j] = src row srows[j] (srows null: row j) (rows distinct, checked on the host).
extern "C" __global__ void scatter_rows(float* dst, const long* rows, const long* srows, long nrows, long cols,
                                        const float* src) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nrows * cols) return;
    long j = i / cols, c = i % cols;
    dst[rows[j] * cols + c] = src[(srows ? srows[j] : j) * cols + c];
}

// ---- row maps (row_map.rs; indices checked on the host) ---------------------------
// out row j = x row idx[j] as 32-bit words (f32 values, or BF16 values in pairs),
// a zero row where idx[j] < 0. A copy: the bits are x's.
extern "C" __global__ void gather_words(const unsigned* x, const long* idx, long nrows, long words,
                                        unsigned* out) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nrows * words) return;
    long j = i / words, c = i % words;
    long r = idx[j];
    out[i] = r < 0 ? 0u : x[r * words + c];
}
// out row j = x rows idx[off[j]], idx[off[j] + 1], ..., idx[off[j + 1] - 1] added in
// that order (one __fadd_rn each, as Rust's `a + b`), rounded to BF16 when `round`.
extern "C" __global__ void gather_sum_rows(const float* x, const long* off, const long* idx, long nrows,
                                           long cols, int round, float* out) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nrows * cols) return;
    long j = i / cols, c = i % cols;
    long a = off[j], b = off[j + 1];
    float s = x[idx[a] * cols + c];
    for (long t = a + 1; t < b; ++t) s = __fadd_rn(s, x[idx[t] * cols + c]);
    out[i] = round ? round_bf16(s) : s;
}

// ---- sum of squares in f64, fixed order --------------------------------------------
// Pass 1: block b of a grid of `blocks` (a function of n only) sums x[i]^2 over
// i = b*256 + t + k*blocks*256 per thread, then a fixed tree over the block, into
// part[b]. Pass 2: one block of 1024 sums part[0 .. blocks) the same way and adds the
// total to acc[slot]. No atomics: the result is the same bits on every run.
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// blockDim.x a multiple of 32, at most 1024; `sh` holds 32 doubles.
__device__ double block_sum_d(double v, double* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0;
    return warp_sum_d(v);
}
// x: the f32 values, or with pend a gradient's (grad_val: x null reads as +0);
// mask (not null): x's chunks (GRAD_MASK_SHIFT) marked 0 hold +0 and are not read.
__device__ __forceinline__ void sumsq_part(const float* x, const bf16_t* pend, long n, long nblocks, long b,
                                           double* sh, double* out, const u8* mask = nullptr) {
    long stride = nblocks * blockDim.x;
    double s = 0.0;
    for (long i = b * blockDim.x + threadIdx.x; i < n; i += stride) {
        double d = (double)grad_val(mask && !mask[i >> GRAD_MASK_SHIFT] ? nullptr : x, pend, i);
        s = __dadd_rn(s, __dmul_rn(d, d));
    }
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0) *out = s;
}
__device__ __forceinline__ void sumsq_fin(const double* part, int blocks, double* sh, double* acc) {
    double s = 0.0;
    for (int b = threadIdx.x; b < blocks; b += blockDim.x) s = __dadd_rn(s, part[b]);
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0) *acc = __dadd_rn(*acc, s);
}
extern "C" __global__ void sumsq_partial(const float* x, long n, double* part) {
    pdl_entry();
    __shared__ double sh[32];
    sumsq_part(x, nullptr, n, gridDim.x, blockIdx.x, sh, part + blockIdx.x);
}
extern "C" __global__ void sumsq_final(const double* part, int blocks, double* acc, long slot) {
    pdl_entry();
    __shared__ double sh[32];
    sumsq_fin(part, blocks, sh, acc + slot);
}
// sumsq_partial / sumsq_final over T tensors in two launches, each tensor's blocks
// and sums exactly as its own launches would do: tab[t] = {x, pend, n, blocks, first
// block, mask} as 6 int64 (first ascending; x null and pend: a gradient not yet
// written, pend not null: its BF16 WGrad output still to add, grad_val; mask not
// null: x's chunks that may hold nonzeros, the others read as the +0 they hold);
// part has one double per block in all.
extern "C" __global__ void sumsq_partial_multi(const long long* tab, int T, double* part) {
    pdl_entry();
    __shared__ double sh[32];
    __shared__ int st;
    if (threadIdx.x == 0) st = tensor_of(tab, 6, 4, T, blockIdx.x);
    __syncthreads();
    const long long* e = tab + (long)st * 6;
    sumsq_part((const float*)e[0], (const bf16_t*)e[1], e[2], e[3], (long)blockIdx.x - e[4], sh,
               part + blockIdx.x, (const u8*)e[5]);
}
// Block t: acc[t] += the sum of tensor t's partials.
extern "C" __global__ void sumsq_final_multi(const long long* tab, const double* part, double* acc) {
    pdl_entry();
    __shared__ double sh[32];
    const long long* e = tab + (long)blockIdx.x * 6;
    sumsq_fin(part + e[4], (int)e[3], sh, acc + blockIdx.x);
}

// The gradient clip, on the device (rl::optim::AdamW::step's host arithmetic, the
// same f64 operations in the same order, so the same bits): the global norm
// sqrt(acc[0] + acc[1] + ...) over the n per-tensor sums of squares, and the scale
// AdamW multiplies the gradient by, clip / norm when clip > 0 and norm > clip, else
// 1 (a NaN norm: 1, as on the host), rounded to f32. One thread; AdamW reads
// *scale, so no host round trip sits between the norm and the step.
extern "C" __global__ void grad_clip_scale(const double* acc, int n, double clip, double* norm, float* scale) {
    pdl_entry();
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double s = 0.0;
    for (int i = 0; i < n; i++) s += acc[i];
    const double r = sqrt(s);
    *norm = r;
    *scale = (float)(clip > 0.0 && r > clip ? clip / r : 1.0);
}

// A masked gradient back to zero (grad.rs GradAcc::f32_mut in place of a memset):
// every chunk (2^GRAD_MASK_SHIFT values) of acc [n] marked in mask [ceil(n / chunk)] zeroed and
// unmarked. Grid ceil(chunks / 256), block 256: lane l of warp w checks chunk
// 32 (8 block + w) + l, then the warp zeroes each marked chunk of its 32 together.
extern "C" __global__ void grad_mask_clear(float* acc, u8* mask, long n) {
    pdl_entry();
    constexpr long CHUNK = 1L << GRAD_MASK_SHIFT;
    const long chunks = (n + CHUNK - 1) >> GRAD_MASK_SHIFT;
    const int lane = threadIdx.x & 31;
    const long c0 = ((long)blockIdx.x * 8 + (threadIdx.x >> 5)) * 32;
    const long c = c0 + lane;
    const bool marked = c < chunks && mask[c];
    unsigned todo = __ballot_sync(0xffffffffu, marked);
    if (marked) mask[c] = 0;
    while (todo) {
        const int k = __ffs(todo) - 1;
        todo &= todo - 1;
        const long i0 = (c0 + k) << GRAD_MASK_SHIFT, i1 = min(i0 + CHUNK, n);
        if (i1 - i0 == CHUNK && ((u64)acc & 15) == 0) {
            for (long i = i0 + 4 * lane; i < i1; i += 128)
                *reinterpret_cast<float4*>(acc + i) = make_float4(0.f, 0.f, 0.f, 0.f);
        } else {
            for (long i = i0 + lane; i < i1; i += 32) acc[i] = 0.0f;
        }
    }
}

// y[i] = grad_val(acc, d, i) for i < n: a GradAcc's pending BF16 WGrad output added
// into its f32 accumulator (acc null: written as +0 + dW), the values the WGrad
// epilogue (linear_epilogue_bf16 into the zeroed or running accumulator) writes; y
// may be acc. Four values a thread (16-byte f32, 8-byte BF16 accesses where aligned),
// grid ceil(n / 1024) x 256.
__device__ __forceinline__ void grad_settle_at(const float* acc, const bf16_t* d, long n, float* y, long block) {
    const long i0 = (block * blockDim.x + threadIdx.x) * 4;
    if (i0 >= n) return;
    if (i0 + 3 >= n || (((u64)acc | (u64)y) & 15) != 0 || ((u64)d & 7) != 0) {
        for (long i = i0; i < min(i0 + 4, n); i++) y[i] = grad_val(acc, d, i);
        return;
    }
    float v[4];
    grad_val4(acc, d, i0, v);
    *reinterpret_cast<float4*>(y + i0) = make_float4(v[0], v[1], v[2], v[3]);
}
extern "C" __global__ void grad_settle(const float* acc, const bf16_t* d, long n, float* y) {
    pdl_entry();
    grad_settle_at(acc, d, n, y, blockIdx.x);
}
// grad_settle of T gradients in one launch, each with up to SETTLE_MAX held addends
// (micro-batches' WGrad outputs, settled before the next backward pass or, all but the
// last, before AdamW reads): y[i] = ((acc[i] + d0[i]) + d1[i]) + .., each add an
// __fadd_rn as one grad_settle an addend does, so the same bits as settling them one
// launch each, with the f32 gradient read and written once. tab[t] = {acc (null: +0),
// n, blocks, first block, y, nd, d[0] .. d[SETTLE_MAX - 1]} as int64 (grad.rs's
// SETTLE_ROW), first ascending; grid the blocks in all, block 256; four values a
// thread (16-byte f32, 8-byte BF16 accesses where every pointer is aligned).
#define SETTLE_MAX 8
extern "C" __global__ void grad_settle_multi(const long long* tab, int T) {
    pdl_entry();
    constexpr int ROW = 6 + SETTLE_MAX;
    __shared__ int st;
    if (threadIdx.x == 0) st = tensor_of(tab, ROW, 3, T, blockIdx.x);
    __syncthreads();
    const long long* e = tab + (long)st * ROW;
    const float* acc = (const float*)e[0];
    const long n = e[1];
    float* y = (float*)e[4];
    const int nd = (int)e[5];
    const long long* d = e + 6;
    const long i0 = (((long)blockIdx.x - e[3]) * blockDim.x + threadIdx.x) * 4;
    if (i0 >= n) return;
    bool vec = i0 + 3 < n && (((u64)acc | (u64)y) & 15) == 0;
#pragma unroll
    for (int j = 0; j < SETTLE_MAX; j++)
        if (j < nd) vec = vec && (((u64)d[j]) & 7) == 0;
    if (!vec) {
        for (long i = i0; i < min(i0 + 4, n); i++) {
            float v = grad_val(acc, (const bf16_t*)d[0], i);
            for (int j = 1; j < nd; j++) v = __fadd_rn(v, bf16_to_f32(((const bf16_t*)d[j])[i]));
            y[i] = v;
        }
        return;
    }
    // Every addend's four values loaded before the first add.
    uint2 raw[SETTLE_MAX];
#pragma unroll
    for (int j = 1; j < SETTLE_MAX; j++)
        if (j < nd) raw[j] = *reinterpret_cast<const uint2*>((const bf16_t*)d[j] + i0);
    float v[4];
    grad_val4(acc, (const bf16_t*)d[0], i0, v);
#pragma unroll
    for (int j = 1; j < SETTLE_MAX; j++) {
        if (j >= nd) break;
        float f[4];
        bf16x4_to_f32(raw[j], f);
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = __fadd_rn(v[u], f[u]);
    }
    *reinterpret_cast<float4*>(y + i0) = make_float4(v[0], v[1], v[2], v[3]);
}
