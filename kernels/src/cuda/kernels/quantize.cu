// E4M3 quantization, bit-exact with fp8::Fp8Matrix::quantize, written straight into
// the layouts cuBLASLt reads (and the decode GEMV too):
//
//   row1x128  x [rows, cols]  -> codes [rows_pad][cols_pad], scales VEC128 [L][rows_pad]
//   col128x1  x [rows, cols]  -> codes^T [cols_pad][rows_pad], scales VEC128 [ceil(rows/128)][cols_pad]
//   block128  w [rows, cols]  -> codes [rows_pad][cols_pad], scales BLK [ceil(rows/128)][lds]
//                                and optionally codes^T [cols_pad][rows_pad], scales^T [ceil(cols/128)][lds_t]
//
// L = ceil(cols/128); *_pad are multiples of 16; lds = roundup(L, 4) (cuBLASLt's BLK128x128
// layout pads the K stride to 4). Padding holds code 0; a padding-only group has scale 1.
// Inputs are f32 or bf16 (`_bf16` kernels), with a row stride ldx.

// Each warp quantizes GPW consecutive (row, group) pairs, all loads first (more bytes
// in flight); for each, lane l holds columns g*128 + 4l .. 4l+3.
#define GPW 4
template <typename T, bool SW = false>
__device__ void row1x128(const T* x, long ldx, int rows, int cols, int rows_pad, int cols_pad,
                         u8* codes, float* scales) {
    int L = (cols + 127) / 128;
    long total = (long)rows_pad * L;
    long w0 = (((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5) * GPW;
    int lane = threadIdx.x & 31;
    if (w0 >= total) return;
    bool vec = (ldx & 3) == 0 && ((u64)x & 15) == 0;
    float v[GPW][4];
#pragma unroll
    for (int i = 0; i < GPW; i++) {
        long idx = w0 + i;
        int r = (int)(idx / L), c = (int)(idx % L) * 128 + lane * 4;
        for (int j = 0; j < 4; j++) v[i][j] = 0.0f;
        if (idx < total && r < rows) load4(x + (long)r * ldx, c, cols, vec, v[i]);
    }
    // The groups' maxima, then (all usual, warp-uniform; not the SW check) their
    // codes without branches (dual_tile's quot_usual), else through e4m3_scale and quot.
    u32 gm[GPW];
    bool usual = !SW;
#pragma unroll
    for (int i = 0; i < GPW; i++) {
        u32 m = 0;
        for (int j = 0; j < 4; j++) m = max_abs_bits(m, v[i][j]);
        gm[i] = __reduce_max_sync(0xffffffffu, m);
        usual = usual && usual_amax(gm[i]);
    }
#pragma unroll
    for (int i = 0; i < GPW; i++) {
        long idx = w0 + i;
        if (idx >= total) break;  // warp-uniform
        int r = (int)(idx / L), g = (int)(idx % L), c = g * 128 + lane * 4;
        const Quot d = usual ? quot_usual(gm[i]) : quot(e4m3_scale(gm[i]));
        const u32 q = usual ? encode4_fast(v[i], d) : encode4<SW>(v[i], d);
        if (c < cols_pad) *reinterpret_cast<u32*>(codes + (long)r * cols_pad + c) = q;
        if (lane == 0) scales[(long)g * rows_pad + r] = d.s;
    }
}

extern "C" __global__ void quant_row1x128_f32(const float* x, long ldx, int rows, int cols, int rows_pad,
                                              int cols_pad, u8* codes, float* scales) {
    pdl_entry();
    row1x128(x, ldx, rows, cols, rows_pad, cols_pad, codes, scales);
}
extern "C" __global__ void quant_row1x128_f32_sw(const float* x, long ldx, int rows, int cols, int rows_pad,
                                                 int cols_pad, u8* codes, float* scales) {
    pdl_entry();
    row1x128<float, true>(x, ldx, rows, cols, rows_pad, cols_pad, codes, scales);
}
extern "C" __global__ void quant_row1x128_bf16(const bf16_t* x, long ldx, int rows, int cols, int rows_pad,
                                               int cols_pad, u8* codes, float* scales) {
    pdl_entry();
    row1x128(x, ldx, rows, cols, rows_pad, cols_pad, codes, scales);
}

// Both groupings of one f32 matrix in one pass: row1x128's codes and scales (codes !=
// null, bit for bit that kernel's) and the col128x1 layout (codes_t, scales_t; see the
// top of this file): dY, read by DGrad in 1x128 groups and by WGrad in 128x1; with
// codes null, the 128x1 groups alone (X for WGrad). One block of 512 threads per
// 128 x 128 tile, grid (ceil(cols_pad/128), ceil(rows/128)), two blocks an SM (at
// most 64 registers: occupancy hides the loads). Warp w holds rows 8w .. +8 of the
// tile in registers (lane l: columns 4l .. +3, all eight 16-byte loads in flight)
// and quantizes each row's group as row1x128 does; each thread's maxima of its four
// columns over its 8 rows meet the other warps' in shared memory (8 KiB), each
// thread encodes its 8 x 4 block's codes^T from the same registers into a shared
// tile, and the tile goes out a column's 128 bytes at a time.
// Each scale and its reciprocal is made once: a row's by one lane of its warp (then
// shuffled to the others), a column's by one of threads 0 .. 127 (then read from
// shared memory). Every thread making all of its eight rows' and four columns' (and
// reducing the 16 warps' column maxima itself) cost ~6 instructions a value; these
// kernels are bound by their instructions (ncu, forty-fifth session).
// The shared memory of one dual_tile: each warp's column maxima, each column's
// scale, reciprocal and whether its amax is usual, the tile's codes^T.
struct DualShared {
    u32 colmax[16][128];  // [warp][column]: the maxima of the warp's 8 rows
    float cs[128], cr[128];
    int cu[128];
    u32 tcodes[128][33];  // codes^T of the tile: [column][row / 4], for whole-line stores
};

// Both groupings of the 128 x 128 tile (g, ty) (column and row tile) whose values v
// the block's 512 threads hold (warp w rows 8w .. +8 of the tile, lane l columns 4l
// .. +3, zero outside [rows, cols]); codes null: the 128x1 groups alone. ldc, ldst:
// the 1x128 codes' and the 128x1 scales' row strides, cols_pad unless the operand is
// a column slice of a wider one (the stacked dy of projections that share x, for one
// DGrad or WGrad GEMM of all of them: codes, scales, codes_t and scales_t then point
// at the slice's first column).
__device__ __forceinline__ void dual_tile(const float (&v)[8][4], int g, int ty, int rows_pad, int cols_pad,
                                          u8* codes, float* scales, int ldc, u8* codes_t, float* scales_t,
                                          int ldst, DualShared& sh) {
    const int t = threadIdx.x, lane = t & 31, w = t >> 5;
    const int c = g * 128 + lane * 4, r0 = ty * 128 + w * 8;
    if (codes) {  // row1x128
        // The eight rows' maxima (every lane), then row lane & 7's scale and
        // reciprocal in lane lane & 7 (all usual: warp-uniform) and shuffled to the
        // others, its codes without branches; else each row through e4m3_scale and
        // quot (NaN, inf, tiny), as before.
        u32 rm[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 m = 0;
            for (int j = 0; j < 4; j++) m = max_abs_bits(m, v[i][j]);
            rm[i] = __reduce_max_sync(0xffffffffu, m);
        }
        // rm[lane & 7] by a tree of selects (a chain of equality tests became an
        // indexed array in local memory).
        const bool b0 = lane & 1, b1 = lane & 2, b2 = lane & 4;
        const u32 p0 = b0 ? rm[1] : rm[0], p1 = b0 ? rm[3] : rm[2], p2 = b0 ? rm[5] : rm[4], p3 = b0 ? rm[7] : rm[6];
        const u32 mine = b2 ? (b1 ? p3 : p2) : (b1 ? p1 : p0);
        if (__all_sync(0xffffffffu, usual_amax(mine))) {
            const Quot dm = quot_usual(mine);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int r = r0 + i;
                const Quot d = {__shfl_sync(0xffffffffu, dm.s, i), __shfl_sync(0xffffffffu, dm.r, i), true};
                const u32 q = encode4_fast(v[i], d);
                if (r < rows_pad && c < cols_pad) *reinterpret_cast<u32*>(codes + (long)r * ldc + c) = q;
                if (r < rows_pad && lane == 0) scales[(long)g * rows_pad + r] = d.s;
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int r = r0 + i;
                const Quot d = quot(e4m3_scale(rm[i]));
                const u32 q = encode4(v[i], d);
                if (r < rows_pad && c < cols_pad) *reinterpret_cast<u32*>(codes + (long)r * ldc + c) = q;
                if (r < rows_pad && lane == 0) scales[(long)g * rows_pad + r] = d.s;
            }
        }
    }
    u32 cm[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++) cm[j] = max_abs_bits(cm[j], v[i][j]);
    *reinterpret_cast<uint4*>(&sh.colmax[w][lane * 4]) = make_uint4(cm[0], cm[1], cm[2], cm[3]);
    __syncthreads();
    if (t < 128) {  // column t's amax over the 16 warps (max is exact: any order), its scale
        u32 a = sh.colmax[0][t];
#pragma unroll
        for (int k = 1; k < 16; k++) a = max(a, sh.colmax[k][t]);
        const bool u = usual_amax(a);
        const Quot d = u ? quot_usual(a) : quot(e4m3_scale(a));
        sh.cs[t] = d.s, sh.cr[t] = d.r, sh.cu[t] = u;
        if (g * 128 + t < cols_pad) scales_t[(long)ty * ldst + g * 128 + t] = d.s;
    }
    __syncthreads();
    const float4 s4 = *reinterpret_cast<const float4*>(&sh.cs[lane * 4]);
    const float4 r4 = *reinterpret_cast<const float4*>(&sh.cr[lane * 4]);
    const int4 u4 = *reinterpret_cast<const int4*>(&sh.cu[lane * 4]);
    const float ss[4] = {s4.x, s4.y, s4.z, s4.w}, rr[4] = {r4.x, r4.y, r4.z, r4.w};
    const bool usual = u4.x && u4.y && u4.z && u4.w;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        // quot's fast flag of the scale (quot_usual's are all fast).
        const Quot d = {ss[j], rr[j], usual || (ss[j] >= 0x1p-88f && ss[j] <= 0x1p125f)};
        const float f0[4] = {v[0][j], v[1][j], v[2][j], v[3][j]}, f1[4] = {v[4][j], v[5][j], v[6][j], v[7][j]};
        sh.tcodes[lane * 4 + j][2 * w] = usual ? encode4_fast(f0, d) : encode4(f0, d);
        sh.tcodes[lane * 4 + j][2 * w + 1] = usual ? encode4_fast(f1, d) : encode4(f1, d);
    }
    __syncthreads();
    // codes^T out: a column's 128 bytes from 8 threads, 16 each (8-byte stores from
    // the registers' layout used 12 of each 32-byte sector).
    const int rt = ty * 128;
    for (int k = t; k < 128 * 8; k += 512) {
        const int lc = k >> 3, part = k & 7;
        if (g * 128 + lc >= cols_pad || rt + part * 16 >= rows_pad) continue;  // rows_pad % 16 == 0
        const u32* q = &sh.tcodes[lc][part * 4];
        *reinterpret_cast<uint4*>(codes_t + (long)(g * 128 + lc) * rows_pad + rt + part * 16) =
            make_uint4(q[0], q[1], q[2], q[3]);
    }
}

// Tile (g, ty) of x [rows, cols] (row stride ldx; f32, or BF16 values widened
// exactly) in dual_tile's register layout, zero outside: all eight loads a thread
// (16 bytes each, 8 for BF16) in flight before the first is used (load_rows4).
template <typename T>
__device__ __forceinline__ void dual_load(const T* x, long ldx, int rows, int cols, int g, int ty,
                                          float (&v)[8][4]) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int c = g * 128 + lane * 4, r0 = ty * 128 + w * 8;
    const bool vec = (ldx & 3) == 0 && ((u64)x & (4 * sizeof(T) - 1)) == 0;
    bool on[8];
#pragma unroll
    for (int i = 0; i < 8; i++) on[i] = r0 + i < rows;
    Raw4<T> raw[8];
    load_rows4(raw, x + (long)r0 * ldx, ldx, c, cols, vec, on);
    widen_rows4(raw, v);
}

extern "C" __global__ void __launch_bounds__(512, 2)
    quant_dual_f32(const float* x, long ldx, int rows, int cols, int rows_pad, int cols_pad, u8* codes,
                   float* scales, u8* codes_t, float* scales_t) {
    pdl_entry();
    __shared__ DualShared sh;
    float v[8][4];
    dual_load(x, ldx, rows, cols, blockIdx.x, blockIdx.y, v);
    dual_tile(v, blockIdx.x, blockIdx.y, rows_pad, cols_pad, codes, scales, cols_pad, codes_t, scales_t, cols_pad, sh);
}

// quant_dual_f32 over T matrices in one launch (the matrices a step of the backward
// quantizes together, e.g. a layer's four WGrad inputs: one launch of several waves
// in place of small launches of about one; the same tiles, so the same bits): tab[t]
// = {x, rows, cols, rows_pad, cols_pad, codes, scales, codes_t, scales_t, first
// block, form, w, rstd, ldst} as 14 int64, x row-contiguous; codes 0: the 128x1
// groups alone; ldst the 128x1 scales' row stride (dual_tile). form | DUAL_ROWS_STACKED:
// the 1x128 codes' row stride is ldst too (both operands column slices of stacked
// ones as wide), else cols_pad (a flag, not a 15th entry: the f32 kernel spilled
// with one more value live). Block b of matrix t
// is its tile (b % ceil(cols_pad / 128), b / ceil(cols_pad / 128)). The form of
// the values:
//   DUAL_F32  x f32;
//   DUAL_BF16 x BF16 (a gradient its producer rounded and stored as BF16: the same
//             values as its f32 copy, so the same codes);
//   DUAL_NORM rmsnorm_operand's y = w[c] * (x[r][c] * rstd[r]) of the f32 x it
//             normed, w and its rstd (the same operations on the same values: y's
//             bits, which the forward then need not write).
#define DUAL_TAB 14
#define DUAL_ROWS_STACKED 4
#define DUAL_F32 0
#define DUAL_BF16 1
#define DUAL_NORM 2
// FORMS: which forms the kernel's code holds (bit 1 BF16, bit 2 f32 and NORM).
// quant_dual_multi (both) spilled 24 / 40 bytes of its 64 registers; a launch of one
// kind takes the kernel of that kind (_bf16, _f32: no spills, ptxas). The same
// operations on the same values, so the same bits.
template <int FORMS>
__device__ __forceinline__ void quant_dual_multi_at(const long long* tab, int T) {
    __shared__ DualShared sh;
    __shared__ int st;
    if (threadIdx.x == 0) st = tensor_of(tab, DUAL_TAB, 9, T, blockIdx.x);
    __syncthreads();
    const long long* e = tab + (long)st * DUAL_TAB;
    const int rows = (int)e[1], cols = (int)e[2], cols_pad = (int)e[4], nx = (cols_pad + 127) / 128;
    const long b = (long)blockIdx.x - e[9];
    const int g = (int)(b % nx), ty = (int)(b / nx);
    float v[8][4];
    const int form = (int)e[10] & 3;
    if (FORMS == 1 || ((FORMS & 1) && form == DUAL_BF16)) {
        dual_load((const bf16_t*)e[0], cols, rows, cols, g, ty, v);
    } else {
        dual_load((const float*)e[0], cols, rows, cols, g, ty, v);
        if (form == DUAL_NORM) {
            // rmsnorm_operand_at's y of the loaded x (zero outside stays zero).
            const float* w = (const float*)e[11];
            const float* rstd = (const float*)e[12];
            const int c = g * 128 + (threadIdx.x & 31) * 4, r0 = ty * 128 + (threadIdx.x >> 5) * 8;
            float wv[4];
            load4(w, c, cols, (cols & 3) == 0 && ((u64)w & 15) == 0, wv);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const float rs = r0 + i < rows ? rstd[r0 + i] : 0.0f;
                for (int j = 0; j < 4; j++) v[i][j] = r0 + i < rows && c + j < cols ? wv[j] * (v[i][j] * rs) : 0.0f;
            }
        }
    }
    const int ldst = (int)e[13], ldc = (e[10] & DUAL_ROWS_STACKED) ? ldst : cols_pad;
    dual_tile(v, g, ty, (int)e[3], cols_pad, (u8*)e[5], (float*)e[6], ldc, (u8*)e[7], (float*)e[8], ldst, sh);
}
extern "C" __global__ void __launch_bounds__(512, 2) quant_dual_multi(const long long* tab, int T) {
    pdl_entry();
    quant_dual_multi_at<3>(tab, T);
}
extern "C" __global__ void __launch_bounds__(512, 2) quant_dual_multi_bf16(const long long* tab, int T) {
    pdl_entry();
    quant_dual_multi_at<1>(tab, T);
}
extern "C" __global__ void __launch_bounds__(512, 2) quant_dual_multi_f32(const long long* tab, int T) {
    pdl_entry();
    quant_dual_multi_at<2>(tab, T);
}

// SwiGLU's backward with both FP8 groupings of its two outputs (fuses ops.cu's
// swiglu_bwd, rounded, and quant_dual_f32 of dgate and of dup: the same values, so the
// same codes): gate, up [rows, cols] f32, dh f32 or (the _dh16 kernel) BF16, row
// stride ldh; the gate projection's dy operands (gc, gs: 1x128; gct, gst: 128x1) and
// the up projection's (uc .. ust), layouts as quant_dual_f32's but the 128x1 scales'
// row stride ldst and the 1x128 codes' ldc (cols_pad, or 2 cols_pad where gate's and
// up's operands are the two halves of one stacked operand, gate's then up's, for one
// WGrad or DGrad of both). Grid
// (ceil(cols_pad/128), ceil(rows/128)), 512 threads, SWIGLU_BWD_FP8_SMEM bytes of
// dynamic shared memory, two blocks an SM: a block computes both gradients of its
// tile (one sigmoid a value), holds dgate in registers as quant_dual_f32 holds its
// tile and parks dup, rounded to a BF16 value (so 16 bits hold it exactly), in
// shared memory, each thread its own 32 values; it quantizes dgate, then reads dup
// back and quantizes it. (Before: a block a (tile, output), the up block loading dh
// and gate again and making the sigmoid again: 2.24 ms a 0.6B step against 1.25 for
// the bf16 flow's swiglu_bwd_bf16, forty-seventh session; one block a tile: 2.11 ms,
// forty-eighth session, H100. Holding both outputs in registers took 128 registers,
// one block an SM, and ran 1.4x slower.)
// Prepared, not yet run on a GPU (JET_NVRTC_DEFINES=SWIGLU_HW_BF16=1; off, so the
// default SASS is the measured one): dgate's BF16 rounding (cvt.rn.bf16.f32, one
// instruction a value) and dup's BF16 pairs (cvt.rn.bf16x2.f32, one a pair) by the
// hardware conversions in place of
// f32_to_bf16 (~7 integer instructions a value; this kernel is bound by its
// instructions). The values are round_bf16's but for a NaN's payload, and the
// codes and scales depend on a NaN only through its being one (dual_tile: a NaN
// amax gives e4m3_scale's one NaN, a NaN value E4M3_NAN), so the outputs are the
// same bits, NaN included. bench/results/s62/call3.sh times it.
#ifndef SWIGLU_HW_BF16
#define SWIGLU_HW_BF16 0
#endif
struct SwigluBwdFp8Smem {
    DualShared sh;
    uint2 dup[8][512];  // [row of the thread's 8][thread]: four BF16 values
};
static_assert(sizeof(SwigluBwdFp8Smem) == 59392, "quantize.rs SWIGLU_BWD_FP8_SMEM");
template <typename DH, typename G>
__device__ __forceinline__ void swiglu_bwd_fp8_at(const DH* dh, long ldh, const G* gate, const G* up,
                                                  int rows, int cols, int rows_pad, int cols_pad, u8* gc, float* gs,
                                                  u8* gct, float* gst, u8* uc, float* us, u8* uct, float* ust,
                                                  long ldst, long ldc) {
    extern __shared__ __align__(16) unsigned char swiglu_sm[];
    SwigluBwdFp8Smem& sm = *reinterpret_cast<SwigluBwdFp8Smem*>(swiglu_sm);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int tx = blockIdx.x, c = tx * 128 + lane * 4, r0 = blockIdx.y * 128 + w * 8;
    const bool vec = ((cols | ldh) & 3) == 0 && (((u64)gate | (u64)up) & 15) == 0 && ((u64)dh & 15) == 0;
    float v[8][4];
    // NB rows at a time: their dh, gate and up loads all in flight before the
    // first is used (load_rows4; eight rows' would not fit 64 registers): four
    // with BF16 inputs, two with f32 gate and up.
    constexpr int NB = sizeof(DH) + 2 * sizeof(G) <= 6 ? 4 : 2;
#pragma unroll
    for (int h = 0; h < 8; h += NB) {
        bool on[NB];
#pragma unroll
        for (int i = 0; i < NB; i++) on[i] = r0 + h + i < rows;
        Raw4<DH> rd[NB];
        Raw4<G> rg[NB], ru[NB];
        const long off = (long)(r0 + h) * cols;
        load_rows4(rd, dh + (long)(r0 + h) * ldh, ldh, c, cols, vec, on);
        load_rows4(rg, gate + off, cols, c, cols, vec, on);
        load_rows4(ru, up + off, cols, c, cols, vec, on);
        float d[NB][4], gv[NB][4], uv[NB][4];
        widen_rows4(rd, d);
        widen_rows4(rg, gv);
        widen_rows4(ru, uv);
        // Zero inputs give zero gradients (sigmoid(0) = 1/2, finite), so the padding
        // quantizes as quant_dual_f32's zero loads.
#pragma unroll
        for (int i = 0; i < NB; i++) {
            float du[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float s = sigmoid(gv[i][j]);  // swiglu_grads' two gradients
                v[h + i][j] = round_bf16_as<SWIGLU_HW_BF16>(swiglu_dgate(d[i][j], gv[i][j], uv[i][j], s));
                du[j] = swiglu_dup(d[i][j], gv[i][j], s);
            }
            sm.dup[h + i][threadIdx.x] = make_uint2(pack2_bf16_as<SWIGLU_HW_BF16>(du[0], du[1]),
                                                    pack2_bf16_as<SWIGLU_HW_BF16>(du[2], du[3]));
        }
    }
    dual_tile(v, tx, blockIdx.y, rows_pad, cols_pad, gc, gs, ldc, gct, gst, ldst, sm.sh);
    // dup back (the thread's own stores: no barrier), widened exactly: round_bf16's values.
#pragma unroll
    for (int i = 0; i < 8; i++) bf16x4_to_f32(sm.dup[i][threadIdx.x], v[i]);
    dual_tile(v, tx, blockIdx.y, rows_pad, cols_pad, uc, us, ldc, uct, ust, ldst, sm.sh);
}
extern "C" __global__ void __launch_bounds__(512, 2)
    swiglu_bwd_fp8(const float* dh, const float* gate, const float* up, int rows, int cols, int rows_pad,
                   int cols_pad, u8* gc, float* gs, u8* gct, float* gst, u8* uc, float* us, u8* uct,
                   float* ust, long ldst, long ldc) {
    pdl_entry();
    swiglu_bwd_fp8_at(dh, cols, gate, up, rows, cols, rows_pad, cols_pad, gc, gs, gct, gst, uc, us, uct, ust, ldst, ldc);
}
// dh as the down projection's BF16 DGrad output, row stride ldh (fuses its
// linear_epilogue_bf16: the same values).
extern "C" __global__ void __launch_bounds__(512, 2)
    swiglu_bwd_fp8_dh16(const bf16_t* dh, long ldh, const float* gate, const float* up, int rows, int cols,
                        int rows_pad, int cols_pad, u8* gc, float* gs, u8* gct, float* gst, u8* uc, float* us,
                        u8* uct, float* ust, long ldst, long ldc) {
    pdl_entry();
    swiglu_bwd_fp8_at(dh, ldh, gate, up, rows, cols, rows_pad, cols_pad, gc, gs, gct, gst, uc, us, uct, ust, ldst, ldc);
}
// gate, up as the BF16 values the rows GEMM stored (the same numbers).
extern "C" __global__ void __launch_bounds__(512, 2)
    swiglu_bwd_fp8_dh16_gu16(const bf16_t* dh, long ldh, const bf16_t* gate, const bf16_t* up, int rows, int cols,
                             int rows_pad, int cols_pad, u8* gc, float* gs, u8* gct, float* gst, u8* uc, float* us,
                             u8* uct, float* ust, long ldst, long ldc) {
    pdl_entry();
    swiglu_bwd_fp8_at(dh, ldh, gate, up, rows, cols, rows_pad, cols_pad, gc, gs, gct, gst, uc, us, uct, ust, ldst, ldc);
}

// token_logprobs_bwd's dz with both FP8 groupings, the LM head's dy operands (fuses
// logsoftmax.cu's token_logprobs_bwd and quant_dual_f32 of its output: the same
// values, so the same codes; no f32 dz written): token_logprobs_bwd's arguments but
// dz, then quant_dual_f32's outputs for [out_rows, vocab]. quant_dual_f32's grid and
// block; a row with slot < 0 (not scored) is 0, as the padding.
// _z16: z as the BF16 values the LM head stored (load4 widens them exactly). It ran
// 0.32 ms slower a 0.6B step than the f32 form (half the bytes in flight a thread,
// 32 bytes of spills; H100, twentieth session): the forward's savings cover it.
template <typename Z>
__device__ __forceinline__ void token_logprobs_bwd_fp8_at(const Z* z, int out_rows, int vocab, const int* slot,
                                                          const int* targets, const float* lse,
                                                          const float* entropy, const float* dlogp,
                                                          const float* dentropy, float scale, int rows_pad,
                                                          int cols_pad, u8* codes, float* scales, u8* codes_t,
                                                          float* scales_t) {
    __shared__ DualShared sh;
    // The tile's rows' statistics (gl, ge, lse, entropy; target), each loaded once
    // by one of threads 0 .. 127 and read by the 32 lanes of its warp from here
    // (every lane loading its eight rows' five values took ~4 instructions a value).
    __shared__ float4 stat[128];
    __shared__ int tgt[128];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int c = blockIdx.x * 128 + lane * 4, r0 = blockIdx.y * 128 + w * 8;
    const bool vec = (vocab & 3) == 0 && ((u64)z & 15) == 0;
    float v[8][4];
    // The eight rows' slots, then their logits, each set of loads in flight together
    // (one row's slot, logits and statistics after another's kept 16 dependent trips
    // to memory a thread in flight one at a time), then the gradients.
    int cs[8];
#pragma unroll
    for (int i = 0; i < 8; i++) cs[i] = r0 + i < out_rows ? (slot ? slot[r0 + i] : r0 + i) : -1;  // warp-uniform
    bool on[8];
#pragma unroll
    for (int i = 0; i < 8; i++) on[i] = cs[i] >= 0;
    // Thread t < 128: row t's statistics, loaded before the logits and stored after
    // them (zeros and target -1 for a row not scored, whose values are 0 anyway).
    float4 st = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int tg = -1;
    if (threadIdx.x < 128) {
        const int r = blockIdx.y * 128 + threadIdx.x;
        const int k = r < out_rows ? (slot ? slot[r] : r) : -1;
        if (k >= 0) st = make_float4(dlogp[k], dentropy ? dentropy[k] : 0.0f, lse[k], entropy[k]), tg = targets[k];
    }
    // All eight rows' BF16 loads at once; f32's four at a time (registers).
    load_rows4_by<sizeof(Z) == 2 ? 8 : 4>(v, z + (long)r0 * vocab, vocab, c, vocab, vec, on);
    if (threadIdx.x < 128) stat[threadIdx.x] = st, tgt[threadIdx.x] = tg;
    __syncthreads();
    // Every value through logprob_grad, then 0 selected where the row is not scored
    // or the column is past the vocabulary: no branch a value or a row, so a
    // thread's 32 exponentials interleave (as dual_tile's quot_usual).
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const float4 s = stat[w * 8 + i];  // zeros where the row is not scored
        const int t = tgt[w * 8 + i];
        for (int j = 0; j < 4; j++) {
            const float g = logprob_grad(v[i][j], s.z, s.w, s.x, s.y, c + j == t, scale);
            v[i][j] = on[i] && c + j < vocab ? g : 0.0f;
        }
    }
    dual_tile(v, blockIdx.x, blockIdx.y, rows_pad, cols_pad, codes, scales, cols_pad, codes_t, scales_t, cols_pad, sh);
}
extern "C" __global__ void __launch_bounds__(512, 2)
    token_logprobs_bwd_fp8(const float* z, int out_rows, int vocab, const int* slot, const int* targets,
                           const float* lse, const float* entropy, const float* dlogp, const float* dentropy,
                           float scale, int rows_pad, int cols_pad, u8* codes, float* scales, u8* codes_t,
                           float* scales_t) {
    pdl_entry();
    token_logprobs_bwd_fp8_at(z, out_rows, vocab, slot, targets, lse, entropy, dlogp, dentropy, scale, rows_pad,
                              cols_pad, codes, scales, codes_t, scales_t);
}
extern "C" __global__ void __launch_bounds__(512, 2)
    token_logprobs_bwd_fp8_z16(const bf16_t* z, int out_rows, int vocab, const int* slot, const int* targets,
                               const float* lse, const float* entropy, const float* dlogp, const float* dentropy,
                               float scale, int rows_pad, int cols_pad, u8* codes, float* scales, u8* codes_t,
                               float* scales_t) {
    pdl_entry();
    token_logprobs_bwd_fp8_at(z, out_rows, vocab, slot, targets, lse, entropy, dlogp, dentropy, scale, rows_pad,
                              cols_pad, codes, scales, codes_t, scales_t);
}

// quant_block128's tile: block128_encode of the weight's values at block (kb, nb),
// loaded in its layout (one pass: two blocks an SM, so one block's loads overlap the
// other's encoding).
__device__ __forceinline__ void block128_tile(const float* w, long ldw, int rows, int cols, int rows_pad,
                                              int cols_pad, u8* codes, float* scales, int lds, u8* codes_t,
                                              float* scales_t, int lds_t, long ldct, int zlim_t, int kb, int nb) {
    const int t = threadIdx.x;
    const int cq = t & 31, c = kb * 128 + cq * 4;
    const bool vec = (ldw & 3) == 0 && ((u64)w & 15) == 0;
    float v[8][4];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int r = nb * 128 + (t >> 5) + 16 * i;
        for (int j = 0; j < 4; j++) v[i][j] = 0.0f;
        if (r < rows) load4(w + (long)r * ldw, c, cols, vec, v[i]);
    }
    block128_encode(v, rows, cols, rows_pad, cols_pad, codes, scales, lds, codes_t, scales_t, lds_t, ldct, zlim_t, kb,
                    nb);
}

// Grid (ceil(cols/128), ceil(rows/128)).
extern "C" __global__ void __launch_bounds__(512, 2)
    quant_block128_f32(const float* w, long ldw, int rows, int cols, int rows_pad, int cols_pad, u8* codes,
                       float* scales, int lds, u8* codes_t, float* scales_t, int lds_t) {
    pdl_entry();
    block128_tile(w, ldw, rows, cols, rows_pad, cols_pad, codes, scales, lds, codes_t, scales_t, lds_t, rows_pad,
                  lds_t, blockIdx.x, blockIdx.y);
}

// quant_block128_f32 over T weights in one launch (a model's, prepared at once: one
// launch of many blocks instead of one small launch a weight; the same blocks, so
// the same bits): tab[t] = {w, rows, cols, rows_pad, cols_pad, codes, scales, lds,
// codes_t, scales_t, lds_t, first block, ldct, zlim_t} as 14 int64 (w row-contiguous,
// ldw = cols; codes_t and scales_t 0 for none; ldct the codes^T row stride and zlim_t
// the scales^T columns whose padding is zeroed: rows_pad and lds_t, or where W^T is
// a column slice of a stacked W^T (block128_encode) the stacked one's stride and the
// slice's own block count, so no slice writes another's scales); block b of weight t
// is its block (b % cb, b / cb).
extern "C" __global__ void __launch_bounds__(512, 2) quant_block128_multi(const long long* tab, int T) {
    pdl_entry();
    __shared__ int st;
    if (threadIdx.x == 0) st = tensor_of(tab, 14, 11, T, blockIdx.x);
    __syncthreads();
    const long long* e = tab + (long)st * 14;
    const int rows = (int)e[1], cols = (int)e[2], cb = (cols + 127) / 128;
    const long b = (long)blockIdx.x - e[11];
    block128_tile((const float*)e[0], cols, rows, cols, (int)e[3], (int)e[4], (u8*)e[5], (float*)e[6], (int)e[7],
                  (u8*)e[8], (float*)e[9], (int)e[10], (long)e[12], (int)e[13], (int)(b % cb), (int)(b / cb));
}

// y [rows_pad][cols_pad] bf16 = x [rows, cols] rounded to nearest even, zero padding.
extern "C" __global__ void pad_bf16_f32(const float* x, long ldx, int rows, int cols, int rows_pad,
                                        int cols_pad, bf16_t* y) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)rows_pad * cols_pad) return;
    int r = (int)(i / cols_pad), c = (int)(i % cols_pad);
    y[i] = (r < rows && c < cols) ? f32_to_bf16(x[(long)r * ldx + c]) : (bf16_t)0;
}

// The same four columns a thread (16-byte loads, 8-byte stores); for cols_pad and
// ldx multiples of 4 (the caller checks). Same rounding, bit for bit.
extern "C" __global__ void pad_bf16_f32_x4(const float* x, long ldx, int rows, int cols, int rows_pad,
                                           int cols_pad, bf16_t* y) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    int q = cols_pad / 4;
    if (i >= (long)rows_pad * q) return;
    int r = (int)(i / q), c = (int)(i % q) * 4;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    if (r < rows) {
        const float* xr = x + (long)r * ldx + c;
        if (c + 3 < cols) {
            float4 t = *(const float4*)xr;
            v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
        } else {
            for (int j = 0; j < 4; j++) v[j] = c + j < cols ? xr[j] : 0.f;
        }
    }
    *(uint2*)(y + (long)r * cols_pad + c) = make_uint2(pack2_bf16(v[0], v[1]), pack2_bf16(v[2], v[3]));
}

// Fill with deterministic pseudo-random values in [-amp, amp) (tests and timings).
extern "C" __global__ void fill_random_f32(float* y, long n, u32 seed, float amp) {
    pdl_entry();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u32 h = (u32)i * 0x9e3779b9u ^ seed;
    h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
    y[i] = ((float)(h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * amp;
}

// ---- rmsnorm with its GEMM operand ------------------------------------------------
// Fuses ops.cu's rmsnorm_fwd (y = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps))
// with the operand the next GEMM reads of y: quant_row1x128_f32 (codes != null) or
// pad_bf16_f32 (yb != null, [rows_pad][cols_pad]). One block per row of rows_pad
// (rows past `rows` write only padding: code 0, scale 1, BF16 0); warp w takes the
// 128-column groups w, w + nw, ... (at most RN_G a warp), lane l the columns
// g*128 + 4l .. +3, the layout of row1x128. A thread adds its squares in column
// order, then block_sum: an order of its own (not rmsnorm_fwd's), the same for
// every caller of the layer stack, rollout and training alike. Block 32 * min(L, 32).
// Launch bounds 1024: dim 4096 takes 1024 threads, so at most 64 registers a thread.
#define RN_G 8
// The body, over how a thread gets its four inputs at (r, c): `load(r, c, v)`
// (zero past `dim`; called only for real rows and groups), and G groups a warp at
// most. G does not change the sums: a thread's groups past L add 0 to its sum.
template <int G, class Load>
__device__ __forceinline__ void rmsnorm_operand_at(Load load, const float* w, int rows, int dim, float eps,
                                                   float* y, float* rstd, int rows_pad, int cols_pad, u8* codes,
                                                   float* scales, bf16_t* yb) {
    __shared__ float sh[32];
    const int r = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int L = (dim + 127) / 128;
    const bool real = r < rows;
    if (L > G * nw) __trap();  // a launcher's bug: groups past G a warp would go unread
    const bool vec = (dim & 3) == 0 && (((u64)y | (u64)w) & 15) == 0;  // y's stores 16 bytes a lane
    // The weight of the warp's first group loaded with the inputs, so both take one
    // trip to memory: loaded after the sum it was a second trip on the decode step's
    // norms' path (thirty-second session). Further groups (rows of more than 32
    // warps of 128) after the sum, as before.
    float w0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (warp < L) load4(w, warp * 128 + lane * 4, dim, vec, w0);
    float v[G][4];
    // All G groups' loads, then their squares in the same order (the same sum): with
    // each group's squares after its own load, every load waited out its round trip
    // before the next was issued.
#pragma unroll
    for (int i = 0; i < G; i++) {
        int g = warp + i * nw, c = g * 128 + lane * 4;
        for (int j = 0; j < 4; j++) v[i][j] = 0.0f;
        if (real && g < L) load(r, c, v[i]);
    }
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < G; i++)
        for (int j = 0; j < 4; j++) ss += v[i][j] * v[i][j];
    ss = block_sum(ss, sh);
    const float rs = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int i = 0; i < G; i++) {
        int g = warp + i * nw, c = g * 128 + lane * 4;
        if (g >= L) break;  // warp-uniform
        float wv[4] = {w0[0], w0[1], w0[2], w0[3]};
        if (i > 0) load4(w, c, dim, vec, wv);
        for (int j = 0; j < 4; j++) v[i][j] = real && c + j < dim ? wv[j] * (v[i][j] * rs) : 0.0f;
        if (real && y) store4(y + (long)r * dim, c, dim, vec, v[i]);  // y null: the operand alone
        store_operand4(v[i], r, g, c, lane, rows_pad, cols_pad, codes, scales, yb);
    }
    if (threadIdx.x == 0 && real) rstd[r] = rs;
}

extern "C" __global__ void __launch_bounds__(1024)
    rmsnorm_operand(const float* x, const float* w, int rows, int dim, float eps, float* y, float* rstd,
                    int rows_pad, int cols_pad, u8* codes, float* scales, bf16_t* yb) {
    pdl_entry();
    const bool vec = (dim & 3) == 0;
    auto load = [&](int r, int c, float v[4]) { load4(x + (long)r * dim, c, dim, vec, v); };
    rmsnorm_operand_at<RN_G>(load, w, rows, dim, eps, y, rstd, rows_pad, cols_pad, codes, scales, yb);
}

// rmsnorm_operand with a warp a row, eight rows a block, for rows of at most eight
// groups (dim <= 1,024): the block-a-row launch holds one row of 4 KB in flight per
// 256 threads, so its SMs wait on memory with little in flight. Lane l holds what
// thread 32w + l of the block-a-row launch (nw = L warps) holds, for each w < L, and
// repeats its sums: each w's squares in column order from 0, each w's butterfly,
// then the butterfly of the L warp sums with zeros past them (block_sum's second
// stage): the same rstd, so the same y and operand, bit for bit. Grid
// ceil(rows_pad / 8), block 256.
extern "C" __global__ void __launch_bounds__(256)
    rmsnorm_operand_rows(const float* x, const float* w, int rows, int dim, float eps, float* y, float* rstd,
                         int rows_pad, int cols_pad, u8* codes, float* scales, bf16_t* yb) {
    pdl_entry();
    const int lane = threadIdx.x & 31, r = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= rows_pad) return;  // warp-uniform; no block barrier follows
    const int L = (dim + 127) / 128;
    if (L > 8) __trap();  // a launcher's bug
    const bool real = r < rows;
    const bool vec = (dim & 3) == 0 && (((u64)y | (u64)w) & 15) == 0;
    float v[8][4];
    float tot = 0.0f;
#pragma unroll
    for (int g = 0; g < 8; g++) {
        const int c = g * 128 + lane * 4;
        for (int j = 0; j < 4; j++) v[g][j] = 0.0f;
        if (real && g < L) load4(x + (long)r * dim, c, dim, (dim & 3) == 0, v[g]);
    }
#pragma unroll
    for (int g = 0; g < 8; g++) {
        if (g >= L) break;
        float ss = 0.0f;
        for (int j = 0; j < 4; j++) ss += v[g][j] * v[g][j];
        ss = warp_sum(ss);
        if (lane == g) tot = ss;
    }
    const float ss = warp_sum(tot);
    const float rs = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int g = 0; g < 8; g++) {
        if (g >= L) break;
        const int c = g * 128 + lane * 4;
        float wv[4];
        load4(w, c, dim, vec, wv);
        for (int j = 0; j < 4; j++) v[g][j] = real && c + j < dim ? wv[j] * (v[g][j] * rs) : 0.0f;
        if (real && y) store4(y + (long)r * dim, c, dim, vec, v[g]);
        store_operand4(v[g], r, g, c, lane, rows_pad, cols_pad, codes, scales, yb);
    }
    if (lane == 0 && real) rstd[r] = rs;
}

// rmsnorm_operand of a split-K GEMM's output plus the residual (fuses
// linear_epilogue with res, writing the residual stream `x.out`, and
// rmsnorm_operand; the same block layout and sum order). Two groups a warp (dim
// 8192 at most; linear/fused.rs RN_SK_G): eight and the slices' loads would not
// fit 64 registers.
#define RN_SK_G 2
extern "C" __global__ void __launch_bounds__(1024)
    rmsnorm_sk_operand(SkIn x, const float* w, int rows, int dim, float eps, float* y, float* rstd,
                       int rows_pad, int cols_pad, u8* codes, float* scales, bf16_t* yb) {
    pdl_entry();
    // Batches of 4 slices: 8 spill 24 bytes under the 64 registers (and ran no faster).
    auto load = [&](int r, int c, float v[4]) { sk_epi4<4>(x, r, c, dim, v); };
    rmsnorm_operand_at<RN_SK_G>(load, w, rows, dim, eps, y, rstd, rows_pad, cols_pad, codes, scales, yb);
}

// ---- swiglu with its GEMM operand -------------------------------------------------
// Fuses ops.cu's swiglu_fwd (h = g * sigmoid(g) * u, as written there) with the
// operand the down projection reads of h: quant_row1x128_f32 (codes != null) or
// pad_bf16_f32 (yb != null). One warp per (row, 128-column group) of rows_pad x L,
// lane l the columns g*128 + 4l .. +3 (row1x128's layout); padding rows write code 0
// and scale 1, padding columns 0.
template <class Load>
__device__ __forceinline__ void swiglu_operand_at(Load load, int rows, int cols, float* h, int rows_pad,
                                                  int cols_pad, u8* codes, float* scales, bf16_t* yb) {
    const int L = (cols + 127) / 128, lane = threadIdx.x & 31;
    const long wi = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (wi >= (long)rows_pad * L) return;  // warp-uniform
    const int r = (int)(wi / L), g = (int)(wi % L), c = g * 128 + lane * 4;
    float gv[4] = {0.f, 0.f, 0.f, 0.f}, uv[4] = {0.f, 0.f, 0.f, 0.f}, v[4];
    if (r < rows) load(r, c, gv, uv);
    for (int j = 0; j < 4; j++) {
        bool in = r < rows && c + j < cols;
        v[j] = in ? gv[j] * sigmoid(gv[j]) * uv[j] : 0.0f;
    }
    // h's stores 16 bytes a lane (four 4-byte stores 16 bytes apart kept the kernel
    // at half the copy bandwidth).
    if (h && r < rows) store4(h + (long)r * cols, c, cols, (cols & 3) == 0 && ((u64)h & 15) == 0, v);
    store_operand4(v, r, g, c, lane, rows_pad, cols_pad, codes, scales, yb);
}

// gate, up [rows, cols]: f32, or (_gu16) the BF16 values the rows GEMM stored (the
// same numbers, half the bytes).
template <typename G>
__device__ __forceinline__ void swiglu_operand_of(const G* gate, const G* up, int rows, int cols, float* h,
                                                  int rows_pad, int cols_pad, u8* codes, float* scales, bf16_t* yb) {
    const bool vec = (cols & 3) == 0;
    // Both loads in flight before either is used (load4 widened gate's BF16 in its
    // own branch before up's load issued).
    auto load = [&](int r, int c, float gv[4], float uv[4]) {
        const Raw4<G> rg = load_raw4(gate + (long)r * cols, c, cols, vec);
        const Raw4<G> ru = load_raw4(up + (long)r * cols, c, cols, vec);
        rg.widen(*reinterpret_cast<float(*)[4]>(gv));
        ru.widen(*reinterpret_cast<float(*)[4]>(uv));
    };
    swiglu_operand_at(load, rows, cols, h, rows_pad, cols_pad, codes, scales, yb);
}
extern "C" __global__ void swiglu_operand(const float* gate, const float* up, int rows, int cols, float* h,
                                          int rows_pad, int cols_pad, u8* codes, float* scales, bf16_t* yb) {
    pdl_entry();
    swiglu_operand_of(gate, up, rows, cols, h, rows_pad, cols_pad, codes, scales, yb);
}
extern "C" __global__ void swiglu_operand_gu16(const bf16_t* gate, const bf16_t* up, int rows, int cols, float* h,
                                               int rows_pad, int cols_pad, u8* codes, float* scales, bf16_t* yb) {
    pdl_entry();
    swiglu_operand_of(gate, up, rows, cols, h, rows_pad, cols_pad, codes, scales, yb);
}

// SwiGLU with both FP8 groupings of h, for a training forward whose WGrad is FP8
// (fuses swiglu_operand and quant_dual_f32 of its h: the same values, so its 1x128
// codes are swiglu_operand's and its 128x1 codes quantize_col128x1's of that h; no
// f32 h is written, and the backward quantizes nothing of it). gate, up [rows, cols]
// f32 or (_gu16) the rows GEMM's BF16 values; quant_dual_f32's grid, block and
// outputs; values past rows or cols are 0, as swiglu_operand's padding.
template <typename G>
__device__ __forceinline__ void swiglu_dual_at(const G* gate, const G* up, int rows, int cols, int rows_pad,
                                               int cols_pad, u8* codes, float* scales, u8* codes_t,
                                               float* scales_t) {
    __shared__ DualShared sh;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int c = blockIdx.x * 128 + lane * 4, r0 = blockIdx.y * 128 + w * 8;
    const bool vec = (cols & 3) == 0;
    // swiglu_operand_at's h, NB rows at a time: their gate and up loads all in
    // flight before the first is used (load_rows4; all sixteen spilled at 64
    // registers, and one row at a time waited out a memory round trip a row).
    constexpr int NB = sizeof(G) == 2 ? 4 : 2;
    float v[8][4];
#pragma unroll
    for (int h = 0; h < 8; h += NB) {
        bool on[NB];
#pragma unroll
        for (int i = 0; i < NB; i++) on[i] = r0 + h + i < rows;
        Raw4<G> rg[NB], ru[NB];
        load_rows4(rg, gate + (long)(r0 + h) * cols, cols, c, cols, vec, on);
        load_rows4(ru, up + (long)(r0 + h) * cols, cols, c, cols, vec, on);
        float gv[NB][4], uv[NB][4];
        widen_rows4(rg, gv);
        widen_rows4(ru, uv);
        // Outside the matrix gate and up load as 0, so h is +0 there, as
        // swiglu_operand_at's padding, with no per-value branch.
#pragma unroll
        for (int i = 0; i < NB; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) v[h + i][j] = gv[i][j] * sigmoid(gv[i][j]) * uv[i][j];
    }
    dual_tile(v, blockIdx.x, blockIdx.y, rows_pad, cols_pad, codes, scales, cols_pad, codes_t, scales_t, cols_pad, sh);
}
extern "C" __global__ void __launch_bounds__(512, 2)
    swiglu_dual(const float* gate, const float* up, int rows, int cols, int rows_pad, int cols_pad, u8* codes,
                float* scales, u8* codes_t, float* scales_t) {
    pdl_entry();
    swiglu_dual_at(gate, up, rows, cols, rows_pad, cols_pad, codes, scales, codes_t, scales_t);
}
extern "C" __global__ void __launch_bounds__(512, 2)
    swiglu_dual_gu16(const bf16_t* gate, const bf16_t* up, int rows, int cols, int rows_pad, int cols_pad,
                     u8* codes, float* scales, u8* codes_t, float* scales_t) {
    pdl_entry();
    swiglu_dual_at(gate, up, rows, cols, rows_pad, cols_pad, codes, scales, codes_t, scales_t);
}

// swiglu_operand of two split-K GEMMs' outputs (fuses the gate and up projections'
// linear_epilogue, no bias, and swiglu_operand; the same layout). h may be null: a
// decode step keeps only the operand.
extern "C" __global__ void swiglu_sk_operand(SkIn gate, SkIn up, int rows, int cols, float* h, int rows_pad,
                                             int cols_pad, u8* codes, float* scales, bf16_t* yb) {
    pdl_entry();
    auto load = [&](int r, int c, float gv[4], float uv[4]) {
        sk_epi4(gate, r, c, cols, gv);
        sk_epi4(up, r, c, cols, uv);
    };
    swiglu_operand_at(load, rows, cols, h, rows_pad, cols_pad, codes, scales, yb);
}
