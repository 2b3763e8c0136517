// The GRPO policy loss of each scored token (policy_loss.rs), in f64, operation
// for operation the host's rl::loss::token_loss (jet-backend), so a GPU pass needs
// no host round trip between its forward and its backward. NVRTC compiles with
// --fmad=false: every product and sum rounds on its own, as in Rust. Only exp may
// differ: CUDA's double exp is within 1 ulp, as is the host's libm, and each is
// nearly always the correctly rounded value.
//
// Grid ceil(n / 256) x 256, one thread a token. Token i of this launch reads
// logp[i], entropy[i] (the scored rows of token_logprobs_forward_at, f32) and the
// per-token inputs at k = at + i (f64 arrays over the whole pass); it writes
// dlogp[i], dentropy[i] (the backward's inputs, f32, as the host's `as f32`) and
// the statistics loss[k], kl[k], clipped[k].
//   logp_old: null = the token's own logp (ratio 1).
//   logp_ref: null = no KL term (as kl_coef == 0).
//   tis: 0 = no truncated importance weight (w = 1), else w = min(exp(old - rollout), tis_cap).
extern "C" __global__ void policy_loss(const float* logp, const float* entropy, long n, long at,
                                       const double* logp_old, const double* logp_rollout,
                                       const double* logp_ref, const double* advantage, double clip_low,
                                       double clip_high, int tis, double tis_cap, double kl_coef,
                                       double entropy_coef, double inv_n, float* dlogp, float* dentropy,
                                       double* loss, double* kl, u8* clipped) {
    pdl_entry();
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long k = at + i;
    const double lp = (double)logp[i];
    const double old = logp_old ? logp_old[k] : lp;
    const double r = exp(lp - old);
    const double a = advantage[k];
    // r.clamp(1 - clip_low, 1 + clip_high) as Rust's clamp: NaN stays NaN.
    double rc = r;
    const double lo = 1.0 - clip_low, hi = 1.0 + clip_high;
    if (rc < lo) rc = lo;
    if (rc > hi) rc = hi;
    const double s1 = r * a, s2 = rc * a;
    // The clipped term is active when strictly smaller; its gradient is 0 where r
    // is outside the clip range.
    const bool clip = s2 < s1;
    double s, ds;
    if (clip) {
        s = s2;
        ds = rc == r ? a * r : 0.0;
    } else {
        s = s1;
        ds = a * r;
    }
    // fmin as f64::min: a NaN operand yields the other.
    const double w = tis ? fmin(exp(old - logp_rollout[k]), tis_cap) : 1.0;
    double l = -w * s;
    double d = -w * ds;
    double x_kl = 0.0;
    if (logp_ref && kl_coef != 0.0) {
        // k3: exp(ref - logp) - (ref - logp) - 1; d/dlogp = 1 - exp(ref - logp).
        const double x = logp_ref[k] - lp;
        const double e = exp(x);
        x_kl = e - x - 1.0;
        l += kl_coef * x_kl;
        d += kl_coef * (1.0 - e);
    }
    l -= entropy_coef * (double)entropy[i];
    loss[k] = l * inv_n;
    kl[k] = x_kl;
    clipped[k] = clip ? 1 : 0;
    dlogp[i] = (float)(d * inv_n);
    dentropy[i] = (float)(-entropy_coef * inv_n);
}
