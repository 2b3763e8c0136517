// One AdamW step per element (adamw.rs), bit-exact with adamw_reference: every
// operation is an explicit round-to-nearest intrinsic, so nothing is contracted.
// f32 for the moments and the parameter, f64 for the update, rounded once to f32.
extern "C" __global__ void adamw_step(float* p, const float* g, float* m, float* v, long n, double lr,
                                      float b1, float b2, double eps, double bc1, double bc2, float wd_factor,
                                      int decay, float grad_scale) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
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
