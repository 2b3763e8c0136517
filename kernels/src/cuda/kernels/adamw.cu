// One AdamW step per element (adamw.rs), bit-exact with adamw_reference: every
// operation is an explicit round-to-nearest intrinsic, so nothing is contracted.
// f32 for the moments and the parameter, f64 for the update, rounded once to f32.
__device__ __forceinline__ void adamw_elem(float* p, const float* g, float* m, float* v, long i, double lr,
                                           float b1, float b2, double eps, double bc1, double bc2,
                                           float wd_factor, int decay, float grad_scale) {
    float gi = __fmul_rn(g[i], grad_scale);
    float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(__fsub_rn(1.0f, b1), gi));
    float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, b2), gi), gi));
    m[i] = mi;
    v[i] = vi;
    double mhat = __ddiv_rn((double)mi, bc1);
    double vhat = __ddiv_rn((double)vi, bc2);
    float pi = p[i];
    if (decay) pi = __fmul_rn(pi, wd_factor);
    double upd = __ddiv_rn(__dmul_rn(lr, mhat), __dadd_rn(__dsqrt_rn(vhat), eps));
    p[i] = __fsub_rn(pi, __double2float_rn(upd));
}
extern "C" __global__ void adamw_step(float* p, const float* g, float* m, float* v, long n, double lr,
                                      float b1, float b2, double eps, double bc1, double bc2, float wd_factor,
                                      int decay, float grad_scale) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    adamw_elem(p, g, m, v, i, lr, b1, b2, eps, bc1, bc2, wd_factor, decay, grad_scale);
}

// The block's tensor in a multi-tensor launch: the last t < T with first[t] <= block
// (first[] ascending: each tensor's first block).
__device__ __forceinline__ int tensor_of(const long long* tab, int stride, int T, long block) {
    int lo = 0, hi = T - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (tab[(long)mid * stride + 5] <= block) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// adamw_step over T tensors in one launch (the same per-element operations, so the
// same bits): tab[t] = {p, g, m, v, n, first block, decay} as 7 int64; 256-thread
// blocks, tensor t's element i in block first + i / 256.
extern "C" __global__ void adamw_multi(const long long* tab, int T, double lr, float b1, float b2, double eps,
                                       double bc1, double bc2, float wd_factor, float grad_scale) {
    pdl_entry();
    __shared__ int st;
    if (threadIdx.x == 0) st = tensor_of(tab, 7, T, blockIdx.x);
    __syncthreads();
    const long long* e = tab + (long)st * 7;
    long i = ((long)blockIdx.x - e[5]) * blockDim.x + threadIdx.x;
    if (i >= e[4]) return;
    adamw_elem((float*)e[0], (const float*)e[1], (float*)e[2], (float*)e[3], i, lr, b1, b2, eps, bc1, bc2,
               wd_factor, (int)e[6], grad_scale);
}
