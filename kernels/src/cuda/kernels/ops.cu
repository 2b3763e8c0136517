// Element-wise and row ops, forward and backward, in f32 with the CPU reference's
// order of operations (ops/embedding.rs, rmsnorm.rs, rope.rs, swiglu.rs, linear.rs).
// Compiled with --fmad=false, so a*b+c rounds twice as in Rust.

// ---- embedding -------------------------------------------------------------------
// out [n, dim] = table [vocab, dim] rows at tokens [n] (checked < vocab on the host).
extern "C" __global__ void embedding_fwd(const float* table, const int* tokens, int n, int dim, float* out) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n * dim) return;
    int r = (int)(i / dim), c = (int)(i % dim);
    out[i] = table[(long)tokens[r] * dim + c];
}

// dtable [vocab, dim] += dy rows, grouped by token: block u adds, in token order, the
// rows pos[off[u] .. off[u+1]) of dy into row tok[u] (the CPU's order, so bit-exact).
// Grid (n_uniq, ceil(dim / blockDim)).
// mask (when not null): the table's chunks (GRAD_MASK_SHIFT) that may hold nonzeros
// (grad.rs GradAcc); each value written marks its chunk.
// d0 .. d7 (the first nd of them): the gradient's held BF16 addends (the tied LM
// head's WGrad outputs, oldest first; grad.rs GradAcc::f32_scatter_mut). A row the
// scatter writes first takes them, acc = ((acc + d0) + d1) .., each __fadd_rn as
// grad_settle_multi adds them, and zeroes them there, so the rows left alone stay
// held (fuses grad_settle of the whole table before the scatter for the rows it
// writes: the same adds in the same order; a later add of the zeroed +0 leaves acc
// as it is, since acc, a sum begun at +0 in round-to-nearest, is never -0). The
// addresses come as arguments and every addend's load is issued before the adds
// and the stores (a table of addresses in memory, each load behind the last
// addend's store, which might alias it, took 0.24 ms a launch, H100).
#define EMB_HELD_MAX 8
extern "C" __global__ void embedding_bwd(const int* tok, const int* off, const int* pos, int n_uniq,
                                         const float* dy, int dim, float* dtable, u8* mask, int nd,
                                         bf16_t* d0, bf16_t* d1, bf16_t* d2, bf16_t* d3, bf16_t* d4,
                                         bf16_t* d5, bf16_t* d6, bf16_t* d7) {
    pdl_entry();
    int u = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (u >= n_uniq || c >= dim) return;
    const long at = (long)tok[u] * dim + c;
    float acc = dtable[at];
    if (nd > 0) {
        bf16_t* const d[EMB_HELD_MAX] = {d0, d1, d2, d3, d4, d5, d6, d7};
        bf16_t v[EMB_HELD_MAX];
#pragma unroll
        for (int j = 0; j < EMB_HELD_MAX; j++) v[j] = j < nd ? d[j][at] : (bf16_t)0;
#pragma unroll
        for (int j = 0; j < EMB_HELD_MAX; j++)
            if (j < nd) acc = __fadd_rn(acc, bf16_to_f32(v[j]));
#pragma unroll
        for (int j = 0; j < EMB_HELD_MAX; j++)
            if (j < nd) d[j][at] = 0;
    }
    for (int p = off[u]; p < off[u + 1]; p++) acc += dy[(long)pos[p] * dim + c];
    dtable[at] = acc;
    // One store a chunk a warp: lane 0, and a lane whose value starts a new chunk
    // (a warp's lanes hold consecutive columns of one row).
    if (mask && ((threadIdx.x & 31) == 0 || (at >> GRAD_MASK_SHIFT) != ((at - 1) >> GRAD_MASK_SHIFT)))
        mask[at >> GRAD_MASK_SHIFT] = 1;
}

// ---- rmsnorm ---------------------------------------------------------------------
// One block per row: y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps).
extern "C" __global__ void rmsnorm_fwd(const float* x, const float* w, int rows, int dim, float eps,
                                       float* y, float* rstd) {
    pdl_entry();
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

// A norm backward's dy[i]: dy's f32 value, or, when dy is null, the in-order sum of
// the BF16 arrays p0 (+ p1 (+ p2)) laid out as dy: the DGrad outputs of the
// projections that read the norm's output, as cuBLASLt wrote them. These are the
// values their linear_epilogue_bf16 launches wrote into dy (the first as is, each
// next one added with __fadd_rn(sum, next)), computed where they are read.
__device__ __forceinline__ float dy_val(const float* dy, const bf16_t* p0, const bf16_t* p1, const bf16_t* p2,
                                        long i) {
    if (dy) return dy[i];
    float v = bf16_to_f32(p0[i]);
    if (p1) v = __fadd_rn(v, bf16_to_f32(p1[i]));
    if (p2) v = __fadd_rn(v, bf16_to_f32(p2[i]));
    return v;
}

// dx = rstd * (dy*w - xh * mean(dy*w*xh)), xh = x * rstd; one block per row. In the
// low-precision flows `round` gives the BF16 value (fuses the backward's rounding) and
// `res` (when not null) is then added (fuses the residual's add_into). dx16 (when not
// null, dim a multiple of 16): dx's BF16 GEMM operand [rows][dim] as well (fuses
// pad_bf16_f32 of dx: the next projection's dy). dy null: dy is dy_val's sum of p0-p2
// (fuses the DGrad epilogues).
extern "C" __global__ void rmsnorm_bwd_dx(const float* dy, const float* x, const float* w, const float* rstd,
                                          int rows, int dim, float* dx, int round, const float* res, bf16_t* dx16,
                                          const bf16_t* p0, const bf16_t* p1, const bf16_t* p2) {
    pdl_entry();
    __shared__ float sh[32];
    int r = blockIdx.x, B = blockDim.x, t = threadIdx.x;
    long o = (long)r * dim;
    float rs = rstd[r];
    // Thread t adds c = t, t + B, ... in that order (the block size fixes the sum's
    // order), with its first RB entries' loads all issued before the adds and kept
    // for the second pass (one load at a time left it latency-bound).
    const int RB = 4;
    float gy[RB], gx[RB];
#pragma unroll
    for (int u = 0; u < RB; u++) {
        int c = t + u * B;
        gy[u] = c < dim ? dy_val(dy, p0, p1, p2, o + c) * w[c] : 0.0f;
        gx[u] = c < dim ? x[o + c] : 0.0f;
    }
    float dot = 0.0f;
#pragma unroll
    for (int u = 0; u < RB; u++)
        if (t + u * B < dim) dot += gy[u] * (gx[u] * rs);
    for (int c = t + RB * B; c < dim; c += B) dot += dy_val(dy, p0, p1, p2, o + c) * w[c] * (x[o + c] * rs);
    dot = block_sum(dot, sh);
    float mean = dot / (float)dim;
#pragma unroll
    for (int u = 0; u < RB; u++) {
        int c = t + u * B;
        if (c >= dim) continue;
        float v = rs * (gy[u] - gx[u] * rs * mean);
        v = round ? round_bf16(v) : v;
        v = res ? __fadd_rn(v, res[o + c]) : v;
        dx[o + c] = v;
        if (dx16) dx16[o + c] = f32_to_bf16(v);
    }
    for (int c = t + RB * B; c < dim; c += B) {
        float v = rs * (dy_val(dy, p0, p1, p2, o + c) * w[c] - x[o + c] * rs * mean);
        v = round ? round_bf16(v) : v;
        v = res ? __fadd_rn(v, res[o + c]) : v;
        dx[o + c] = v;
        if (dx16) dx16[o + c] = f32_to_bf16(v);
    }
}

// rmsnorm's whole backward for NORM_ROWS rows a block (fuses rmsnorm_bwd_dx and
// colsum_partial of dy * (x * rstd): one read of dy, x and the residual where there
// were two of dy and x). dim % 4 == 0, dim <= 1024 NG; every array 16-byte aligned
// (the BF16 parts 8-byte). Thread t holds columns 4(t + 256 j) .. +3, j < NG, as
// float4 loads. A row's dot: each thread's terms in (j, column) order, its warp's
// butterfly, then the eight warps' totals in warp order (every thread the same
// sum); the dot's bits do not depend on the row's block. G rows at a time (their
// loads all in flight, one block barrier for their G dots). Thread t's four column
// sums over its rows in row order go to part[block][dim]; colsum_final adds the
// blocks' sums in its fixed order. dx, round, res and dx16 as rmsnorm_bwd_dx.
#define NORM_ROWS 16
// TERMS (rmsnorm_bwd_rows1t, launches of fewer blocks than SMs): a row a block, its
// dw terms dy * (x * rstd) written to part as terms [rows][dim] in place of summed;
// norm_terms_part adds them as a NORM_ROWS block does here (the same bits).
template <int NG, int G = (NG >= 4 ? 1 : 4 / NG), bool TERMS = false>
__device__ __forceinline__ void rmsnorm_bwd_rows(const float* dy, const float* x, const float* w,
                                                 const float* rstd, int rows, int dim, float* dx, int round,
                                                 const float* res, bf16_t* dx16, const bf16_t* p0,
                                                 const bf16_t* p1, const bf16_t* p2, float* part) {
    __shared__ float red[2][8][G];
    const int t = threadIdx.x, lane = t & 31, wp = t >> 5, nq = dim >> 2;
    constexpr int SPAN = TERMS ? 1 : NORM_ROWS;  // rows a block
    const int r0 = blockIdx.x * SPAN, r1 = min(rows, r0 + SPAN);
    float4 wv[NG];
    float cs[NG][4];
#pragma unroll
    for (int j = 0; j < NG; j++) {
        const int q = t + 256 * j;
        wv[j] = q < nq ? reinterpret_cast<const float4*>(w)[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int k = 0; k < 4; k++) cs[j][k] = 0.0f;
    }
    int buf = 0;
    for (int r = r0; r < r1; r += G) {
        float dv[G][NG][4], xv[G][NG][4], rv[G][NG][4], rs[G];
#pragma unroll
        for (int i = 0; i < G; i++) {
            const bool live = r + i < r1;
            rs[i] = live ? rstd[r + i] : 0.0f;
            const long o = (long)(r + i) * dim;
#pragma unroll
            for (int j = 0; j < NG; j++) {
                const int q = t + 256 * j;
                for (int k = 0; k < 4; k++) dv[i][j][k] = xv[i][j][k] = rv[i][j][k] = 0.0f;
                if (!live || q >= nq) continue;
                const long e = o + 4 * q;
                if (dy) {
                    const float4 a = *reinterpret_cast<const float4*>(dy + e);
                    dv[i][j][0] = a.x, dv[i][j][1] = a.y, dv[i][j][2] = a.z, dv[i][j][3] = a.w;
                } else {
                    // dy_val's in-order sum of the parts.
                    bf16x4_to_f32(*reinterpret_cast<const uint2*>(p0 + e), dv[i][j]);
                    float b[4];
                    if (p1) {
                        bf16x4_to_f32(*reinterpret_cast<const uint2*>(p1 + e), b);
                        for (int k = 0; k < 4; k++) dv[i][j][k] = __fadd_rn(dv[i][j][k], b[k]);
                    }
                    if (p2) {
                        bf16x4_to_f32(*reinterpret_cast<const uint2*>(p2 + e), b);
                        for (int k = 0; k < 4; k++) dv[i][j][k] = __fadd_rn(dv[i][j][k], b[k]);
                    }
                }
                const float4 a = *reinterpret_cast<const float4*>(x + e);
                xv[i][j][0] = a.x, xv[i][j][1] = a.y, xv[i][j][2] = a.z, xv[i][j][3] = a.w;
                if (res) {
                    const float4 c = *reinterpret_cast<const float4*>(res + e);
                    rv[i][j][0] = c.x, rv[i][j][1] = c.y, rv[i][j][2] = c.z, rv[i][j][3] = c.w;
                }
            }
        }
        // The G dots: each thread's terms, its warp's butterfly, the warps in order.
        float dot[G];
#pragma unroll
        for (int i = 0; i < G; i++) {
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < NG; j++) {
                const float wj[4] = {wv[j].x, wv[j].y, wv[j].z, wv[j].w};
#pragma unroll
                for (int k = 0; k < 4; k++) s += (dv[i][j][k] * wj[k]) * (xv[i][j][k] * rs[i]);
            }
            s = warp_sum(s);
            if (lane == 0) red[buf][wp][i] = s;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < G; i++) {
            float s = red[buf][0][i];
#pragma unroll
            for (int v = 1; v < 8; v++) s += red[buf][v][i];
            dot[i] = s;
        }
        buf ^= 1;  // the next rows write the other buffer: no second barrier
#pragma unroll
        for (int i = 0; i < G; i++) {
            if (r + i >= r1) break;
            const float mean = dot[i] / (float)dim;
            const long o = (long)(r + i) * dim;
#pragma unroll
            for (int j = 0; j < NG; j++) {
                const int q = t + 256 * j;
                if (q >= nq) continue;
                const float wj[4] = {wv[j].x, wv[j].y, wv[j].z, wv[j].w};
                float d[4], tm[4];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const float gy = dv[i][j][k] * wj[k];
                    float v = rs[i] * (gy - xv[i][j][k] * rs[i] * mean);
                    v = round ? round_bf16(v) : v;
                    d[k] = res ? __fadd_rn(v, rv[i][j][k]) : v;
                    tm[k] = dv[i][j][k] * (xv[i][j][k] * rs[i]);  // colsum_add's term
                    if constexpr (!TERMS) cs[j][k] += tm[k];
                }
                if constexpr (TERMS)
                    *reinterpret_cast<float4*>(part + o + 4 * q) = make_float4(tm[0], tm[1], tm[2], tm[3]);
                if (dx) *reinterpret_cast<float4*>(dx + o + 4 * q) = make_float4(d[0], d[1], d[2], d[3]);
                if (dx16)
                    *reinterpret_cast<uint2*>(dx16 + o + 4 * q) = make_uint2(pack2_bf16(d[0], d[1]), pack2_bf16(d[2], d[3]));
            }
        }
    }
    if constexpr (!TERMS) {
#pragma unroll
        for (int j = 0; j < NG; j++) {
            const int q = t + 256 * j;
            if (q < nq)
                *reinterpret_cast<float4*>(part + (long)blockIdx.x * dim + 4 * q) =
                    make_float4(cs[j][0], cs[j][1], cs[j][2], cs[j][3]);
        }
    }
}
#define NORM_BWD_ROWS(NAME, NG)                                                                                  \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                                    \
        const float* dy, const float* x, const float* w, const float* rstd, int rows, int dim, float* dx,       \
        int round, const float* res, bf16_t* dx16, const bf16_t* p0, const bf16_t* p1, const bf16_t* p2,        \
        float* part) {                                                                                          \
        pdl_entry();                                                                                            \
        rmsnorm_bwd_rows<NG>(dy, x, w, rstd, rows, dim, dx, round, res, dx16, p0, p1, p2, part);               \
    }
NORM_BWD_ROWS(rmsnorm_bwd_rows1, 1)
NORM_BWD_ROWS(rmsnorm_bwd_rows2, 2)
NORM_BWD_ROWS(rmsnorm_bwd_rows4, 4)
NORM_BWD_ROWS(rmsnorm_bwd_rows8, 8)
// Eight rows' loads in flight (G) at widths up to 1,024, for launches of fewer blocks
// than SMs (a GRPO group's 256 rows: 16 blocks, each a chain of its 16 rows' loads
// four at a time): the same sums in the same order, so the same bits. 226 registers,
// one block an SM (G = 16 spilled 500 bytes).
#define NORM_BWD_ROWS_G(NAME, NG, G)                                                                             \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                                    \
        const float* dy, const float* x, const float* w, const float* rstd, int rows, int dim, float* dx,       \
        int round, const float* res, bf16_t* dx16, const bf16_t* p0, const bf16_t* p1, const bf16_t* p2,        \
        float* part) {                                                                                          \
        pdl_entry();                                                                                            \
        rmsnorm_bwd_rows<NG, G>(dy, x, w, rstd, rows, dim, dx, round, res, dx16, p0, p1, p2, part);            \
    }
NORM_BWD_ROWS_G(rmsnorm_bwd_rows1g8, 1, 8)
// A row a block, the dw terms written (TERMS above): for launches of fewer NORM_ROWS
// blocks than SMs (a GRPO micro-batch's 256 rows were 16 blocks, each a chain of its
// 16 rows), then norm_terms_part.
extern "C" __global__ void __launch_bounds__(256)
    rmsnorm_bwd_rows1t(const float* dy, const float* x, const float* w, const float* rstd, int rows, int dim,
                       float* dx, int round, const float* res, bf16_t* dx16, const bf16_t* p0, const bf16_t* p1,
                       const bf16_t* p2, float* terms) {
    pdl_entry();
    rmsnorm_bwd_rows<1, 1, true>(dy, x, w, rstd, rows, dim, dx, round, res, dx16, p0, p1, p2, terms);
}
// rmsnorm_bwd_rows1's part[block][dim] from rmsnorm_bwd_rows1t's terms [rows][dim]:
// thread t's four columns 4t .. 4t + 3 (dim <= 1,024) summed over block b's
// NORM_ROWS rows in row order from 0, as that kernel's thread t sums them (the
// same bits); the rows' loads all in flight first. Grid ceil(rows / NORM_ROWS),
// block 256. (Fused into colsum_final, a warp a column reading the terms a row
// apart, it ran 0.5 ms slower over a GRPO-shaped step's 456 launches, H100.)
extern "C" __global__ void __launch_bounds__(256)
    norm_terms_part(const float* terms, int rows, int dim, float* part) {
    pdl_entry();
    const int q = threadIdx.x, r0 = blockIdx.x * NORM_ROWS, r1 = min(rows, r0 + NORM_ROWS);
    if (4 * q >= dim) return;
    float4 v[NORM_ROWS];
#pragma unroll
    for (int i = 0; i < NORM_ROWS; i++)
        if (r0 + i < r1) v[i] = *reinterpret_cast<const float4*>(terms + (long)(r0 + i) * dim + 4 * q);
    float cs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < NORM_ROWS; i++) {
        if (r0 + i >= r1) break;
        cs[0] += v[i].x, cs[1] += v[i].y, cs[2] += v[i].z, cs[3] += v[i].w;
    }
    *reinterpret_cast<float4*>(part + (long)blockIdx.x * dim + 4 * q) = make_float4(cs[0], cs[1], cs[2], cs[3]);
}

// rmsnorm_bwd_dx for rows of exactly 128 (the q/k norms' heads): one warp a row,
// eight rows a block (a block a row left the SMs scheduling tiny blocks). Lane l
// holds columns l + 32u; each u's butterfly is the 128-thread launch's warp u sum
// (of 0 + its value, as that thread's dot starts at 0), and the four totals are
// added as that launch's block_sum adds them (each + 0 first, then (t0 + t2) +
// (t1 + t3)): the same bits, signed zeros included. norm_bwd_row128 is one row's
// dx before the rounding, from the lane's dy and x values (shared with
// qk_norm_rope_bwd, so both give these bits).
__device__ __forceinline__ void norm_bwd_row128(const float (&dyv)[4], const float (&xv)[4], const float* w, float rs,
                                                int lane, float (&out)[4]) {
    float gy[4], tot[4];
#pragma unroll
    for (int u = 0; u < 4; u++) gy[u] = dyv[u] * w[lane + 32 * u];
#pragma unroll
    for (int u = 0; u < 4; u++) tot[u] = warp_sum(0.0f + gy[u] * (xv[u] * rs)) + 0.0f;
    const float dot = (tot[0] + tot[2]) + (tot[1] + tot[3]);
    const float mean = dot / 128.0f;
#pragma unroll
    for (int u = 0; u < 4; u++) out[u] = rs * (gy[u] - xv[u] * rs * mean);
}
// Takes rmsnorm_bwd_dx's arguments (dim is 128).
extern "C" __global__ void rmsnorm_bwd_dx128(const float* dy, const float* x, const float* w, const float* rstd,
                                             int rows, int dim, float* dx, int round, const float* res,
                                             bf16_t* dx16, const bf16_t* p0, const bf16_t* p1, const bf16_t* p2) {
    pdl_entry();
    const int lane = threadIdx.x & 31, r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const long o = (long)r * 128;
    const float rs = rstd[r];
    float dyv[4], xv[4], v[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        dyv[u] = dy_val(dy, p0, p1, p2, o + lane + 32 * u);
        xv[u] = x[o + lane + 32 * u];
    }
    norm_bwd_row128(dyv, xv, w, rs, lane, v);
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int c = lane + 32 * u;
        float d = round ? round_bf16(v[u]) : v[u];
        d = res ? __fadd_rn(d, res[o + c]) : d;
        dx[o + c] = d;
        if (dx16) dx16[o + c] = f32_to_bf16(d);
    }
}

// One pair (j, j + hd/2) of RoPE: (u c - v s, v c + u s), rounded to BF16 when
// `round` (the rope kernel and qk_norm_rope_bwd share it, so their bits agree).
__device__ __forceinline__ void rope_pair(float u, float v, float c, float s, int round, float& a, float& b) {
    a = u * c - v * s;
    b = v * c + u * s;
    if (round) {
        a = round_bf16(a);
        b = round_bf16(b);
    }
}

// One term of a column sum: a (times x * rs for rmsnorm's dw), added to s.
__device__ __forceinline__ void colsum_add(float& s, float a, float x, float rs, bool scaled) {
    s += scaled ? a * (x * rs) : a;
}

// The backward of Qwen3's q (or k) norm and RoPE for heads of 128, in one pass
// (fuses rope's backward of dy in place, rmsnorm_bwd_dx128 and colsum_partial of
// the rotated dy, in their orders: the same bits). dy, x (the norm's input), dx
// [rows = tokens * n_heads, 128]; row r is token r / n_heads, its angles at
// pos[token] in cos_t, sin_t [*, 64]. Grid ceil(rows / 256), block 256: block ch
// takes the 256-row chunk ch, warp g its rows g, g + 8, .. in order (a row a
// step: rotate, dx, then the row's dw terms into the lane's four column sums),
// then the eight warps' sums in warp order into part[ch][128], as colsum_partial.
// dx16 (when not null): dx's BF16 GEMM operand [tokens][n_heads * 128] as well (fuses
// pad_bf16_f32 of dx: the q or k projection's dy) at row stride ld16 (n_heads * 128,
// or q + k + v's where it is a column slice of q/k/v's stacked dy); dx null: that
// operand alone.
// qk_norm_rope_bwd runs q's chunks and k's in one launch (blocks [0, q_chunks) q's
// chunk blockIdx.x, the rest k's chunk blockIdx.x - q_chunks): each block does what
// the single launch's block of that chunk does, so the same bits; k's 128 chunks
// (0.6B, 8 x 512) alone left one block an SM, the pair ~3.
// The eight warps' column sums cs (lane l: columns l + 32u) of chunk ch into
// part[ch][128], in warp order (colsum_partial's): the last step of both
// qk_norm_rope_bwd_at and qk_terms_part_at, so the two give the same bits.
__device__ __forceinline__ void qk_warps_part(const float (&cs)[4], float (*sh)[129], float* part, int ch) {
    const int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
#pragma unroll
    for (int u = 0; u < 4; u++) sh[g][lane + 32 * u] = cs[u];
    __syncthreads();
    if (g != 0) return;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int c = lane + 32 * u;
        float t = sh[0][c];
#pragma unroll
        for (int k = 1; k < 8; k++) t += sh[k][c];
        part[(long)ch * 128 + c] = t;
    }
}
// TERMS (the _t kernels, launches of fewer blocks than SMs): block ch takes rows
// 8 ch .. 8 ch + 7, a row a warp, and writes each row's dw terms dy' * (x * rstd) to
// part as terms [rows][128] in place of summing them; qk_terms_part sums them as a
// 256-row chunk's block does here (the same adds in the same order: the same bits).
template <typename TX, int QR, bool TERMS = false>
__device__ __forceinline__ void qk_norm_rope_bwd_at(const float* dy, const TX* x, const float* w,
                                                    const float* rstd, const int* pos, const float* cos_t,
                                                    const float* sin_t, int rows, int n_heads, int round, float* dx,
                                                    float* part, bf16_t* dx16, long ld16, int ch) {
    __shared__ float sh[8][129];
    const int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
    constexpr int SPAN = TERMS ? 8 : 256;  // rows a block
    const int r1 = min(rows, (ch + 1) * SPAN);
    float cs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // QR rows' loads in flight (rows r, r + 8, .., r + 8 (QR - 1)), then the rows in
    // order: one row at a time left the kernel waiting on each row's loads.
    // QR 8 was 4% slower at 8 x 512 (H100, twenty-second session) and 20% slower in
    // the GRPO-shaped step's 24-block launches (H100, fifty-first session).
    // BF16 x: a row's 64 words, lane l's words l and 32 + l (columns 2l, 2l + 1 and
    // 64 + 2l, 65 + 2l), then shuffled into the f32 kernel's layout (lane l: columns
    // l + 32u) before the row's arithmetic, so every sum keeps its order: the same
    // bits. (Two-byte loads at that layout made the kernel 20% slower, H100.)
    // The QR rows' positions are loaded first, and every row's loads are issued
    // without a branch (a row past the chunk loads the chunk's last row again, and
    // is not used): with each row's loads behind its own `ri < r1` test, a row's
    // cos/sin loads waited on its position's load before the next row's were
    // issued (ncu, fifty-sixth session: the pos[token] * 64 products among the
    // hottest lines). Only the loads move: the same bits.
    constexpr bool X16 = sizeof(TX) == 2;
    for (int r = ch * SPAN + g; r < r1; r += 8 * QR) {
        float d[QR][4], xv[QR][4], cv[QR][2], sv[QR][2], rs[QR];
        u32 xw[QR][2];
        long tt[QR];
#pragma unroll
        for (int i = 0; i < QR; i++) tt[i] = (long)pos[min(r + 8 * i, r1 - 1) / n_heads] * 64;
#pragma unroll
        for (int i = 0; i < QR; i++) {
            const int ri = min(r + 8 * i, r1 - 1);
            const long o = (long)ri * 128;
            const long t = tt[i];
            rs[i] = rstd[ri];
#pragma unroll
            for (int u = 0; u < 4; u++) d[i][u] = dy[o + lane + 32 * u];
            if constexpr (X16) {
                const u32* xr = reinterpret_cast<const u32*>(x + o);
                xw[i][0] = xr[lane];
                xw[i][1] = xr[32 + lane];
            } else {
#pragma unroll
                for (int u = 0; u < 4; u++) xv[i][u] = to_f32(x[o + lane + 32 * u]);
            }
#pragma unroll
            for (int u = 0; u < 2; u++) {
                cv[i][u] = cos_t[t + lane + 32 * u];
                sv[i][u] = -1.0f * sin_t[t + lane + 32 * u];
            }
        }
#pragma unroll
        for (int i = 0; i < QR; i++) {
            const int ri = r + 8 * i;
            if (ri >= r1) break;  // warp-uniform
            const long o = (long)ri * 128;
            const long o16 = (long)(ri / n_heads) * ld16 + (ri % n_heads) * 128;
            if constexpr (X16) {
                // Column c = l + 32u sits in word (c mod 64) / 2 of half c / 64, at
                // bits 16 (c & 1) of lane ((l + 32u) mod 64) / 2's word.
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const u32 w = __shfl_sync(0xffffffffu, xw[i][u >> 1], ((lane + 32 * (u & 1)) >> 1));
                    xv[i][u] = __uint_as_float((lane & 1) ? (w & 0xffff0000u) : (w << 16));
                }
            }
            float dyv[4], v[4];
            // Lane l's pairs: columns (l, l + 64) and (l + 32, l + 96), i.e. u and u + 2.
#pragma unroll
            for (int u = 0; u < 2; u++) rope_pair(d[i][u], d[i][u + 2], cv[i][u], sv[i][u], round, dyv[u], dyv[u + 2]);
            norm_bwd_row128(dyv, xv[i], w, rs[i], lane, v);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const float d = round ? round_bf16(v[u]) : v[u];
                if (dx) dx[o + lane + 32 * u] = d;
                if (dx16) dx16[o16 + lane + 32 * u] = f32_to_bf16(d);
                if constexpr (TERMS)
                    part[o + lane + 32 * u] = dyv[u] * (xv[i][u] * rs[i]);  // colsum_add's term
                else
                    colsum_add(cs[u], dyv[u], xv[i][u], rs[i], true);
            }
        }
    }
    if constexpr (!TERMS) qk_warps_part(cs, sh, part, ch);
}
// q's arguments, then k's, then the shared ones. Grid q_chunks + ceil(k rows / 256),
// block 256; for one of them alone, grid q_chunks (k's arguments are not read).
// _x16: x (q and k before their norms) as the BF16 values the forward stored.
// QR: rows in flight a warp (qk_norm_rope_bwd_at). _o3: three blocks an SM (at
// most 80 registers: QR 3 with BF16 x; 2 with f32 x, which spilled at 3). At two
// (96-105 registers) a 0.6B 8 x 512 launch's 384 blocks ran as 264, then a
// half-empty wave of 120 (H100: 1.86 -> 1.49 ms a step). Launches of at most two
// blocks an SM keep QR 4: QR 3 was 8% slower in the GRPO-shaped step's 24-block
// launches. The same rows, sums and order, so the same bits.
#define QK_NORM_ROPE_BWD(NAME, TX, QR, BOUNDS, TERMS)                                                          \
    extern "C" __global__ void BOUNDS NAME(const float* dy_q, const TX* x_q, const float* w_q,                   \
                                           const float* rstd_q, int rows_q, int nh_q, float* dx_q, float* part_q, \
                                           bf16_t* dx16_q, long ld16_q, const float* dy_k, const TX* x_k,        \
                                           const float* w_k, const float* rstd_k, int rows_k, int nh_k,          \
                                           float* dx_k, float* part_k, bf16_t* dx16_k, long ld16_k,              \
                                           const int* pos, const float* cos_t, const float* sin_t, int round,    \
                                           int q_chunks) {                                                       \
        pdl_entry();                                                                                            \
        const int b = blockIdx.x;                                                                               \
        if (b < q_chunks)                                                                                       \
            qk_norm_rope_bwd_at<TX, QR, TERMS>(dy_q, x_q, w_q, rstd_q, pos, cos_t, sin_t, rows_q, nh_q, round,  \
                                               dx_q, part_q, dx16_q, ld16_q, b);                                \
        else                                                                                                    \
            qk_norm_rope_bwd_at<TX, QR, TERMS>(dy_k, x_k, w_k, rstd_k, pos, cos_t, sin_t, rows_k, nh_k, round,  \
                                               dx_k, part_k, dx16_k, ld16_k, b - q_chunks);                     \
    }
QK_NORM_ROPE_BWD(qk_norm_rope_bwd, float, 4, , false)
QK_NORM_ROPE_BWD(qk_norm_rope_bwd_x16, bf16_t, 4, , false)
QK_NORM_ROPE_BWD(qk_norm_rope_bwd_o3, float, 2, __launch_bounds__(256, 3), false)
QK_NORM_ROPE_BWD(qk_norm_rope_bwd_x16_o3, bf16_t, 3, __launch_bounds__(256, 3), false)
QK_NORM_ROPE_BWD(qk_norm_rope_bwd_t, float, 1, , true)
QK_NORM_ROPE_BWD(qk_norm_rope_bwd_x16_t, bf16_t, 1, , true)

// The 256-row chunks' dw column sums of qk_norm_rope_bwd from the _t kernels' terms
// [rows][128] (q's, then k's): block ch (q's chunks first, q_chunks of them) as
// qk_norm_rope_bwd_at's block ch sums them: warp g its rows g, g + 8, .. in order
// from 0 (lane l columns l + 32u), then the eight warps in warp order into
// part[ch][128]. The loads of eight rows in flight before their adds. Block 256.
__device__ __forceinline__ void qk_terms_part_at(const float* terms, int rows, float* part, int ch) {
    __shared__ float sh[8][129];
    const int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
    const int r1 = min(rows, (ch + 1) * 256);
    float cs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int r = ch * 256 + g; r < r1; r += 64) {
        float t[8][4];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int u = 0; u < 4; u++)
                t[i][u] = r + 8 * i < r1 ? terms[(long)(r + 8 * i) * 128 + lane + 32 * u] : 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if (r + 8 * i >= r1) break;  // warp-uniform
#pragma unroll
            for (int u = 0; u < 4; u++) cs[u] += t[i][u];
        }
    }
    qk_warps_part(cs, sh, part, ch);
}
extern "C" __global__ void qk_terms_part(const float* terms_q, int rows_q, float* part_q, const float* terms_k,
                                         int rows_k, float* part_k, int q_chunks) {
    pdl_entry();
    const int b = blockIdx.x;
    if (b < q_chunks)
        qk_terms_part_at(terms_q, rows_q, part_q, b);
    else
        qk_terms_part_at(terms_k, rows_k, part_k, b - q_chunks);
}

// Column sums in a fixed order (the shape's, not the GPU's): part[chunk][c] = the
// sum over the chunk's rows of a[r, c] (times x[r, c] * rstd[r] when x is given:
// rmsnorm's dw), then out[c] (+)= the sum over chunks, optionally rounded to BF16.
// colsum_partial: grid (ceil(cols / 32), chunks), block 256; lane = column, warp g
// adds rows g, g + 8, .. of the chunk in that order, then warp 0 adds the eight
// warps' sums in warp order. (A thread a column over 64 rows, and one thread a
// column over all chunks, kept the 128-wide q/k norms' 1,024 chunks latency-bound.)
// a null: a is dy_val's sum of p0-p2 (a norm's dw from its projections' DGrad outputs).
extern "C" __global__ void colsum_partial(const float* a, const float* x, const float* rstd, int rows,
                                          int cols, int chunk, float* part, const bf16_t* p0, const bf16_t* p1,
                                          const bf16_t* p2) {
    pdl_entry();
    __shared__ float sh[8][33];
    const int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
    const int c = blockIdx.x * 32 + lane, ch = blockIdx.y;
    const int r1 = min(rows, (ch + 1) * chunk);
    float s = 0.0f;
    if (c < cols) {
        int r = ch * chunk + g;
        // Four rows' loads in flight, added in row order.
        for (; r + 24 < r1; r += 32) {
            float v[4];
            float xs[4], rs[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const long i = (long)(r + 8 * u) * cols + c;
                v[u] = dy_val(a, p0, p1, p2, i);
                xs[u] = x ? x[i] : 0.0f;
                rs[u] = x ? rstd[r + 8 * u] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 4; u++) colsum_add(s, v[u], xs[u], rs[u], x != nullptr);
        }
        for (; r < r1; r += 8) {
            const long i = (long)r * cols + c;
            colsum_add(s, dy_val(a, p0, p1, p2, i), x ? x[i] : 0.0f, x ? rstd[r] : 0.0f, x != nullptr);
        }
    }
    sh[g][lane] = s;
    __syncthreads();
    if (g != 0 || c >= cols) return;
    float t = sh[0][lane];
#pragma unroll
    for (int w = 1; w < 8; w++) t += sh[w][lane];
    part[(long)ch * cols + c] = t;
}
// colsum_final: a warp a column (grid ceil(cols / 8), block 256); lane l adds chunks
// l, l + 32, .. in order, then warp_sum's fixed tree. accumulate: out[c] + the
// (rounded) sum (fuses tensor.cu's add_into of the result into a gradient).
__device__ __forceinline__ void colsum_final_at(const float* part, int chunks, int cols, int accumulate, int round,
                                                float* out) {
    const int lane = threadIdx.x & 31, c = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (c >= cols) return;
    float s = 0.0f;
    for (int ch = lane; ch < chunks; ch += 32) s += part[(long)ch * cols + c];
    s = warp_sum(s);
    if (lane != 0) return;
    s = round ? round_bf16(s) : s;
    out[c] = accumulate ? __fadd_rn(out[c], s) : s;
}
extern "C" __global__ void colsum_final(const float* part, int chunks, int cols, int accumulate, int round,
                                        float* out) {
    pdl_entry();
    colsum_final_at(part, chunks, cols, accumulate, round, out);
}
// Two colsum_finals of one width in one launch (grid (ceil(cols / 8), 2): blockIdx.y
// picks a, b), each block as that launch's: q's and k's norm weights.
extern "C" __global__ void colsum_final2(const float* part_a, int chunks_a, float* out_a, const float* part_b,
                                         int chunks_b, float* out_b, int cols, int accumulate, int round) {
    pdl_entry();
    if (blockIdx.y == 0)
        colsum_final_at(part_a, chunks_a, cols, accumulate, round, out_a);
    else
        colsum_final_at(part_b, chunks_b, cols, accumulate, round, out_b);
}

// ---- rope ------------------------------------------------------------------------
// In place on x [rows, n_heads * hd]: pairs (j, j + hd/2) of each head rotated by the
// table's angle at pos[r]; sign -1 is the backward (the inverse rotation).
extern "C" __global__ void rope(float* x, const int* pos, const float* cos_t, const float* sin_t, int rows,
                                int n_heads, int hd, float sign, int round) {
    pdl_entry();
    int half = hd / 2;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)rows * n_heads * half) return;
    int j = (int)(i % half);
    long rh = i / half;
    int r = (int)(rh / n_heads);
    long base = rh * hd;
    long t = (long)pos[r] * half + j;
    float c = cos_t[t], s = sign * sin_t[t];
    float a, b;
    // round: the backward's rounding of its gradient to BF16, fused.
    rope_pair(x[base + j], x[base + j + half], c, s, round, a, b);
    x[base + j] = a;
    x[base + j + half] = b;
}

// ---- Qwen3's q/k norms with RoPE ----------------------------------------------------
// (qk_norm_rope_warp, one warp's head, is in common.cuh: the decode attention,
// flash.cu's fa_dec2_qkv, runs it too.)

// Fuses rmsnorm_fwd over each head's hd values (q_norm on q, k_norm on k), then rope
// (sign +1) on the normed heads. Grid (rows, ceil((nh + nkv) / (8 QKNR_HEADS))),
// block 256: warp w makes heads w, w + 8, .. (up to QKNR_HEADS of them; heads nh..
// are k's), all their loads issued before the first is normed (one head a warp left
// the warps' few bytes in flight a latency apart); lane l holds columns l + 32i (i <
// hd/32), so a RoPE pair (j, j + hd/2) sits in one lane (hd a multiple of 64, at
// most 256). A lane adds its squares in i order, then warp_sum: an order of its own
// (not rmsnorm_fwd's), the same for every caller of the layer stack. q, k, qr, kr:
// the outputs [rows, heads * hd] and the norms' rstd [rows * heads]; q16, k16: the
// outputs' BF16 copies (fuses fa_to_bf16_x3 of q and k). Either form may be null.
#define QKNR_HEADS 4
// W (_x16w, BF16 heads of 128): a head's 64 words loaded as lane l's words l and
// 32 + l, then moved to the lane layout above by four shuffles (qk_norm_rope_bwd_at's
// X16 load): the same values, so the same bits; two-byte loads cost the backward 20%.
template <int HD, typename TI, bool W = false>
__device__ __forceinline__ void qk_norm_rope_at(const TI* q_pre, const TI* k_pre, const float* qw,
                                                const float* kw, int nh, int nkv, float eps, const int* pos,
                                                const float* cos_t, const float* sin_t, float* q, float* k,
                                                float* qr, float* kr, bf16_t* q16, bf16_t* k16) {
    static_assert(!W || (HD == 128 && sizeof(TI) == 2), "word loads: BF16 heads of 128");
    constexpr int n = HD / 32;
    const int r = blockIdx.x, h0 = blockIdx.y * 8 * QKNR_HEADS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    float v[QKNR_HEADS][8];
    u32 xw[QKNR_HEADS][2];
#pragma unroll
    for (int e = 0; e < QKNR_HEADS; e++) {
        const int head = h0 + 8 * e;
        const bool isq = head < nh;
        const int hh = isq ? head : head - nh, heads = isq ? nh : nkv;
        const TI* src = (isq ? q_pre : k_pre) + ((long)r * heads + hh) * HD;
        if (head >= nh + nkv) continue;  // warp-uniform
        if constexpr (W) {
            const u32* s32 = reinterpret_cast<const u32*>(src);
            xw[e][0] = s32[lane];
            xw[e][1] = s32[32 + lane];
        } else {
#pragma unroll
            for (int i = 0; i < n; i++) v[e][i] = to_f32(src[lane + 32 * i]);
        }
    }
    const long t0 = (long)pos[r] * (HD / 2);
#pragma unroll
    for (int e = 0; e < QKNR_HEADS; e++) {
        const int head = h0 + 8 * e;
        if (head >= nh + nkv) continue;  // warp-uniform
        const bool isq = head < nh;
        const int hh = isq ? head : head - nh, heads = isq ? nh : nkv;
        const long o = ((long)r * heads + hh) * HD;
        NormRope nr;
        norm_rope_load(nr, HD, isq ? qw : kw, t0, cos_t, sin_t);
        float* dst = isq ? q : k;
        bf16_t* dst16 = isq ? q16 : k16;
        float hv[8];
        if constexpr (W) {
            // Column c = l + 32u: word ((l + 32 (u & 1)) >> 1) of half u >> 1, bits 16 (l & 1).
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const u32 w = __shfl_sync(0xffffffffu, xw[e][u >> 1], (lane + 32 * (u & 1)) >> 1);
                hv[u] = __uint_as_float((lane & 1) ? (w & 0xffff0000u) : (w << 16));
            }
        } else {
#pragma unroll
            for (int i = 0; i < n; i++) hv[i] = v[e][i];
        }
        qk_norm_rope_warp(hv, HD, eps, nr, dst ? dst + o : nullptr, dst16 ? dst16 + o : nullptr,
                          (isq ? qr : kr) + (long)r * heads + hh);
    }
}
// qk_norm_rope_{64,128,192,256}: one kernel a head_dim (the head's loop bounds
// known to the compiler, so a warp's heads stay in registers); the grid's x is the
// rows. _x16: q_pre, k_pre as the BF16 values the q and k projections stored (the
// low-precision flows round them to BF16: the same numbers, half the bytes).
#define QK_NORM_ROPE(NAME, HD, TI)                                                                              \
    extern "C" __global__ void NAME(const TI* q_pre, const TI* k_pre, const float* qw, const float* kw,        \
                                    int nh, int nkv, float eps, const int* pos, const float* cos_t,             \
                                    const float* sin_t, float* q, float* k, float* qr, float* kr, bf16_t* q16,  \
                                    bf16_t* k16) {                                                               \
        pdl_entry();                                                                                            \
        qk_norm_rope_at<HD, TI>(q_pre, k_pre, qw, kw, nh, nkv, eps, pos, cos_t, sin_t, q, k, qr, kr, q16, k16); \
    }
QK_NORM_ROPE(qk_norm_rope_64, 64, float)
QK_NORM_ROPE(qk_norm_rope_128, 128, float)
QK_NORM_ROPE(qk_norm_rope_192, 192, float)
QK_NORM_ROPE(qk_norm_rope_256, 256, float)
QK_NORM_ROPE(qk_norm_rope_64_x16, 64, bf16_t)
QK_NORM_ROPE(qk_norm_rope_128_x16, 128, bf16_t)
QK_NORM_ROPE(qk_norm_rope_192_x16, 192, bf16_t)
QK_NORM_ROPE(qk_norm_rope_256_x16, 256, bf16_t)
extern "C" __global__ void qk_norm_rope_128_x16w(const bf16_t* q_pre, const bf16_t* k_pre, const float* qw,
                                                 const float* kw, int nh, int nkv, float eps, const int* pos,
                                                 const float* cos_t, const float* sin_t, float* q, float* k,
                                                 float* qr, float* kr, bf16_t* q16, bf16_t* k16) {
    pdl_entry();
    qk_norm_rope_at<128, bf16_t, true>(q_pre, k_pre, qw, kw, nh, nkv, eps, pos, cos_t, sin_t, q, k, qr, kr, q16,
                                       k16);
}

// The q, k, v projections' epilogues (split-K partials, no bias) with qk_norm_rope
// (fuses linear_epilogue_group of a decode step and qk_norm_rope, the norms' rstd
// not kept). Grid (rows, ceil((nh + 2 nkv) / 8)), block 256: one warp per head
// (qkv_sk_head), heads nh.. k's, nh + nkv.. v's (the epilogue only); qk_norm_rope's
// lane layout, so its sum order.
extern "C" __global__ void qkv_sk_norm_rope(SkIn qi, SkIn ki, SkIn vi, const float* qw, const float* kw,
                                            int rows, int nh, int nkv, int hd, float eps, const int* pos,
                                            const float* cos_t, const float* sin_t, float* q, float* k,
                                            float* v_out) {
    pdl_entry();
    const int r = blockIdx.x, head = blockIdx.y * 8 + (threadIdx.x >> 5);
    if (head >= nh + 2 * nkv) return;
    const int kind = head < nh ? 0 : head < nh + nkv ? 1 : 2;
    const int hh = kind == 0 ? head : kind == 1 ? head - nh : head - nh - nkv, heads = kind == 0 ? nh : nkv;
    float* dst = (kind == 0 ? q : kind == 1 ? k : v_out) + ((long)r * heads + hh) * hd;
    qkv_sk_head(qi, ki, vi, kind, r, hh, heads * hd, hd, eps, qw, kw, pos[r], cos_t, sin_t, dst, nullptr);
}

// An exhaustive check kernel's thread count of misses into bad[0]: the warp's sum,
// one atomic a warp (quot_usual_is_quot, bf16_cvt_is_f32_to_bf16,
// sigmoid_div_is_ieee; ops.rs count_mismatches).
__device__ __forceinline__ void add_misses(unsigned long long n, unsigned long long* bad) {
    n = __reduce_add_sync(0xffffffffu, (u32)n);
    if ((threadIdx.x & 31) == 0 && n) atomicAdd(bad, n);
}

// The amax bit patterns a in {0} and [start, start + count) (those >= 0x18000000
// and < 0x7f800000 are quot_usual's domain) where quot_usual(a)'s scale, reciprocal
// or fast flag differ from quot(e4m3_scale(a))'s, added into bad[0]: the proof
// behind the quantizers' branch-free scales (ops.rs `quot_usual_mismatches`).
extern "C" __global__ void quot_usual_is_quot(long long start, long long count, unsigned long long* bad) {
    pdl_entry();
    unsigned long long n = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i <= count; i += (long long)gridDim.x * blockDim.x) {
        const u32 a = i == count ? 0u : (u32)(start + i);  // the last index checks a = 0
        const Quot u = quot_usual(a), q = quot(e4m3_scale(a));
        n += __float_as_uint(u.s) != __float_as_uint(q.s) || __float_as_uint(u.r) != __float_as_uint(q.r) ||
             u.fast != q.fast;
    }
    add_misses(n, bad);
}

// The f32 bit patterns in [start, start + count) where the hardware BF16 conversions
// (pack_bf16x2's cvt.rn.bf16x2.f32, both halves, and round_bf16_hw's cvt.rn.bf16.f32)
// differ from f32_to_bf16 (half's bf16::from_f32), NaN inputs counted only if a
// result is not NaN: the proof behind ROWS_HW_PACK (gemm_wg.cu) and SWIGLU_HW_BF16
// (quantize.cu), run over all 2^32 inputs by ops.rs `bf16_cvt_mismatches`.
extern "C" __global__ void bf16_cvt_is_f32_to_bf16(long long start, long long count, unsigned long long* bad) {
    pdl_entry();
    unsigned long long n = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (long long)gridDim.x * blockDim.x) {
        const float x = __uint_as_float((u32)(start + i)), y = -x;  // y: the high half's input
        const u32 p = pack_bf16x2(x, y), lo = p & 0xffffu, hi = p >> 16;
        const u32 r = __float_as_uint(round_bf16_hw(x)) >> 16;
        if (isnan(x)) {
            n += !isnan(bf16_to_f32((bf16_t)lo)) || !isnan(bf16_to_f32((bf16_t)hi)) || !isnan(bf16_to_f32((bf16_t)r));
        } else {
            n += lo != f32_to_bf16(x) || hi != f32_to_bf16(y) || r != f32_to_bf16(x);
        }
    }
    add_misses(n, bad);
}

// ---- swiglu ----------------------------------------------------------------------
// The f32 bit patterns in [start, start + count) where sigmoid (div_unit, common.cuh)
// and sigmoid_ieee differ (NaNs count as equal), added into bad[0]: the proof behind
// div_unit, run over all 2^32 inputs by ops.rs `sigmoid_mismatches`.
extern "C" __global__ void sigmoid_div_is_ieee(long long start, long long count, unsigned long long* bad) {
    pdl_entry();
    unsigned long long n = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (long long)gridDim.x * blockDim.x) {
        const float x = __uint_as_float((u32)(start + i));
        const float a = sigmoid(x), b = sigmoid_ieee(x);
        n += (__float_as_uint(a) != __float_as_uint(b)) && !(isnan(a) && isnan(b));
    }
    add_misses(n, bad);
}
extern "C" __global__ void swiglu_fwd(const float* gate, const float* up, long n, float* h) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i];
    h[i] = g * sigmoid(g) * up[i];
}
// round: the gradients' BF16 rounding of the low-precision flows, fused.
extern "C" __global__ void swiglu_bwd(const float* dh, const float* gate, const float* up, long n,
                                      float* dgate, float* dup, int round) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float dg, du;
    swiglu_grads(dh[i], gate[i], up[i], dg, du);
    dgate[i] = round ? round_bf16(dg) : dg;
    dup[i] = round ? round_bf16(du) : du;
}

// swiglu_bwd's rounded dgate, dup as the BF16 GEMM operands of the gate and up
// backward: [rows][ldb] BF16 (ldb = cols padded to 16, zero padding; fuses
// to_bf16_padded of swiglu_bwd's outputs, whose values are already BF16: the same
// bits). dh [rows, cols] f32 (ldh = cols) or, in _dh16, the down projection's DGrad
// output as cuBLASLt wrote it in BF16 (row stride ldh; fuses its linear_epilogue_bf16,
// whose f32 values are these: the same bits). Four outputs a thread (ldb is a multiple
// of 16, so they share a row; 16-byte loads and 8-byte stores where aligned): grid
// ceil(rows * ldb / 1024), 256 threads. Outputs at row stride ldo (a multiple of 16,
// >= ldb): ldb for their own buffers, 2 * cols where dgate and dup are the column
// halves of one stacked [rows][2 * cols] operand (one BF16 WGrad / DGrad of both).
template <typename DH, typename G>
__device__ __forceinline__ void swiglu_bwd_bf16_at(const DH* dh, long ldh, const G* gate, const G* up,
                                                   int rows, int cols, int ldb, long ldo, bf16_t* dgate,
                                                   bf16_t* dup) {
    const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= (long)rows * ldb) return;
    const int c = (int)(i % ldb);
    const long r = i / ldb;
    const long o = r * ldo + c;
    const bool vec = ((cols | ldh) & 3) == 0 && (((u64)dh | (u64)gate | (u64)up) & 15) == 0;
    float d[4], gv[4], uv[4], dg[4], du[4];
    // The three loads in flight before the first is used (load4 widened each in its
    // own branch: three memory round trips a thread).
    const Raw4<DH> rd = load_raw4(dh + r * ldh, c, cols, vec);
    const Raw4<G> rg = load_raw4(gate + r * cols, c, cols, vec), ru = load_raw4(up + r * cols, c, cols, vec);
    rd.widen(d);
    rg.widen(gv);
    ru.widen(uv);
    for (int j = 0; j < 4; j++) {
        dg[j] = du[j] = 0.0f;  // padding columns
        if (c + j < cols) swiglu_grads(d[j], gv[j], uv[j], dg[j], du[j]);
    }
    const uint2 pg = make_uint2(pack2_bf16(dg[0], dg[1]), pack2_bf16(dg[2], dg[3]));
    const uint2 pu = make_uint2(pack2_bf16(du[0], du[1]), pack2_bf16(du[2], du[3]));
    if (((u64)dgate | (u64)dup) & 7) {
        for (int j = 0; j < 4; j++) {
            dgate[o + j] = f32_to_bf16(dg[j]);
            dup[o + j] = f32_to_bf16(du[j]);
        }
    } else {
        *reinterpret_cast<uint2*>(dgate + o) = pg;
        *reinterpret_cast<uint2*>(dup + o) = pu;
    }
}
extern "C" __global__ void swiglu_bwd_bf16(const float* dh, const float* gate, const float* up, int rows, int cols,
                                           int ldb, long ldo, bf16_t* dgate, bf16_t* dup) {
    pdl_entry();
    swiglu_bwd_bf16_at(dh, cols, gate, up, rows, cols, ldb, ldo, dgate, dup);
}
extern "C" __global__ void swiglu_bwd_bf16_dh16(const bf16_t* dh, long ldh, const float* gate, const float* up,
                                                int rows, int cols, int ldb, long ldo, bf16_t* dgate, bf16_t* dup) {
    pdl_entry();
    swiglu_bwd_bf16_at(dh, ldh, gate, up, rows, cols, ldb, ldo, dgate, dup);
}
// gate, up as the BF16 values the rows GEMM stored (the same numbers).
extern "C" __global__ void swiglu_bwd_bf16_dh16_gu16(const bf16_t* dh, long ldh, const bf16_t* gate,
                                                     const bf16_t* up, int rows, int cols, int ldb, long ldo,
                                                     bf16_t* dgate, bf16_t* dup) {
    pdl_entry();
    swiglu_bwd_bf16_at(dh, ldh, gate, up, rows, cols, ldb, ldo, dgate, dup);
}

// ---- linear epilogue ---------------------------------------------------------------
// y [rows, cols] = d (stride ldd) + bias, rounded to BF16 when `round` (the
// low-precision GEMMs: f32 accumulation, BF16 output, as linear.rs). A split-K
// decode GEMM leaves `splits` slices of d, `sstride` apart, added here in order.
// add (when not null; [rows, cols]): y = add + the result (one f32 add, as add_into):
// WGrad adds into the step's gradient (add = y) without a dW buffer of its own, and
// the o and down projections add the residual (fuses the layer's add_into).
// Block `blk` (256 threads) of it: outputs blk * 1024 + 4 * threadIdx.x ...
// y16 (not null, round set, no add): y's values as BF16 in place of y (exact: they
// are BF16 values), for a forward that keeps its output in that form (a GRPO
// micro-batch's split-K k and v projections, as the rows kernel's BF16 output).
__device__ __forceinline__ void linear_epilogue_at(const float* d, long ldd, int splits, long sstride,
                                                   const float* bias, int rows, int cols, int round, const float* add,
                                                   float* y, int blk, bf16_t* y16 = nullptr) {
    // Four consecutive outputs a thread, loaded as float4 when every row and slice
    // keeps them 16-byte aligned; each value's adds are in the same order either way.
    long i0 = ((long)blk * blockDim.x + threadIdx.x) * 4, n = (long)rows * cols;
    if (i0 >= n) return;
    bool vec = ((cols | ldd | sstride) & 3) == 0 &&
               (((unsigned long long)d | (unsigned long long)y | (unsigned long long)add |
                 (unsigned long long)bias) & 15) == 0;
    if (!vec) {
        for (long i = i0; i < min(i0 + 4, n); i++) {
            int r = (int)(i / cols), c = (int)(i % cols);
            const float* dr = d + (long)r * ldd + c;
            float v = dr[0];
            for (int s = 1; s < splits; s++) v += dr[s * sstride];
            const float e = epi_value(v, bias, bias ? bias[c] : 0.0f, round, add, add ? add[i] : 0.0f);
            if (y16)
                y16[i] = f32_to_bf16(e);
            else
                y[i] = e;
        }
        return;
    }
    int r = (int)(i0 / cols), c = (int)(i0 % cols);
    const float* dr = d + (long)r * ldd + c;
    float4 v = *reinterpret_cast<const float4*>(dr);
    // Slices 4 at a time, all four loads issued before the adds (one load at a time
    // left the decode epilogue latency-bound).
    int s = 1;
    for (; s + 3 < splits; s += 4) {
        float4 t[4];
#pragma unroll
        for (int u = 0; u < 4; u++) t[u] = *reinterpret_cast<const float4*>(dr + (s + u) * sstride);
#pragma unroll
        for (int u = 0; u < 4; u++) v.x += t[u].x, v.y += t[u].y, v.z += t[u].z, v.w += t[u].w;
    }
    for (; s < splits; s++) {
        float4 t = *reinterpret_cast<const float4*>(dr + s * sstride);
        v.x += t.x, v.y += t.y, v.z += t.z, v.w += t.w;
    }
    const float4 b = bias ? *reinterpret_cast<const float4*>(bias + c) : make_float4(0, 0, 0, 0);
    const float4 a = add ? *reinterpret_cast<const float4*>(add + i0) : make_float4(0, 0, 0, 0);
    const float4 e =
        make_float4(epi_value(v.x, bias, b.x, round, add, a.x), epi_value(v.y, bias, b.y, round, add, a.y),
                    epi_value(v.z, bias, b.z, round, add, a.z), epi_value(v.w, bias, b.w, round, add, a.w));
    if (y16)
        *reinterpret_cast<uint2*>(y16 + i0) = make_uint2(pack2_bf16(e.x, e.y), pack2_bf16(e.z, e.w));
    else
        *reinterpret_cast<float4*>(y + i0) = e;
}

extern "C" __global__ void linear_epilogue(const float* d, long ldd, int splits, long sstride, const float* bias,
                                           int rows, int cols, int round, const float* add, float* y, bf16_t* y16) {
    pdl_entry();
    linear_epilogue_at(d, ldd, splits, sstride, bias, rows, cols, round, add, y, blockIdx.x, y16);
}

// linear_epilogue of a BF16 GEMM output (the backward's DGrad and WGrad: cuBLASLt
// rounds its f32 accumulation to BF16, linear_epilogue's round_bf16): y [rows, cols]
// = d (BF16, row stride ldd), plus add when not null (one f32 add, as epi_value). No
// bias, one slice. Four outputs a thread (8-byte loads when aligned), 1024 a block.
extern "C" __global__ void linear_epilogue_bf16(const bf16_t* d, long ldd, int rows, int cols, const float* add,
                                                float* y) {
    pdl_entry();
    const long i0 = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 4, n = (long)rows * cols;
    if (i0 >= n) return;
    const bool vec = ((cols | ldd) & 3) == 0 && ((u64)d & 7) == 0 && (((u64)y | (u64)add) & 15) == 0;
    if (!vec) {
        for (long i = i0; i < min(i0 + 4, n); i++) {
            const int r = (int)(i / cols), c = (int)(i % cols);
            const float v = bf16_to_f32(d[(long)r * ldd + c]);
            y[i] = epi_value(v, false, 0.0f, 0, add, add ? add[i] : 0.0f);
        }
        return;
    }
    const int r = (int)(i0 / cols), c = (int)(i0 % cols);
    float v[4];
    bf16x4_to_f32(*reinterpret_cast<const uint2*>(d + (long)r * ldd + c), v);
    const float4 a = add ? *reinterpret_cast<const float4*>(add + i0) : make_float4(0, 0, 0, 0);
    *reinterpret_cast<float4*>(y + i0) =
        make_float4(epi_value(v[0], false, 0.0f, 0, add, a.x), epi_value(v[1], false, 0.0f, 0, add, a.y),
                    epi_value(v[2], false, 0.0f, 0, add, a.z), epi_value(v[3], false, 0.0f, 0, add, a.w));
}

// linear_epilogue for up to three outputs of the same rows (the q, k, v or gate, up
// projections of a decode step) in one launch: problem i takes the next blocks
// (1024 outputs a block) after problem i - 1's. linear.rs `EpiGroup` lays it out.
struct EpiProb {
    const float* d;
    const float* bias;
    const float* add;
    float* y;
    long ldd, sstride;
    int splits, cols, blocks, pad_;
};
struct EpiGroup {
    EpiProb pr[3];
    int rows, round, count, pad_;
};
extern "C" __global__ void linear_epilogue_group(EpiGroup g) {
    pdl_entry();
    int b = blockIdx.x;
    EpiProb P = g.pr[0];
    if (g.count > 1 && b >= g.pr[0].blocks) {
        b -= g.pr[0].blocks;
        P = g.pr[1];
        if (g.count > 2 && b >= g.pr[1].blocks) {
            b -= g.pr[1].blocks;
            P = g.pr[2];
        }
    }
    linear_epilogue_at(P.d, P.ldd, P.splits, P.sstride, P.bias, g.rows, P.cols, g.round, P.add, P.y, b);
}
