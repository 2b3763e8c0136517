// Written in the thirty-second session, run in the thirty-third (H200: NOTES). What does a
// grid-wide barrier cost inside a decode-shaped graph, against the kernel boundary it
// would replace? The question behind NOTES' "consumers inside their GEMMs": the gate/up
// GEMM's 192 blocks write split-K partials, then swiglu_sk_operand's 1,536 warp items
// read them. Four graphs of NL such pairs, replayed back to back with PDL on:
//   two:     producer kernel (192 blocks x 128 threads) then consumer kernel (192 x 256)
//   fused:   one kernel: the producer's work, a grid barrier, the consumer's items
//            spread over the same 192 blocks (8 a block, 2 a warp)
//   barrier: the producer's work and the barrier alone (the barrier's own cost)
//   alone:   the producer alone
//   lean:    fused and barrier again with a leaner barrier (one release-add a block on a
//            64-bit count that is never reset, the others polling it with acquire loads)
// Build and run on the GPU machine:
//   nvcc -O2 -arch=sm_90a -o /tmp/gb bench/results/grid-barrier-s33.cu && /tmp/gb
// Prints us a pair for each graph and whether the fused output equals the two-kernel one.
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#define CK(x)                                                                   \
    do {                                                                        \
        cudaError_t e = (x);                                                    \
        if (e != cudaSuccess) {                                                 \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

constexpr int BLOCKS = 192, TOK = 64, COLS = 3072, SPLITS = 2;

__device__ __forceinline__ void pdl_entry() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Every block of the grid resident at once (the caller checks the occupancy). A block
// reads the generation before it arrives (it cannot move until this block arrives),
// the last to arrive resets the count and bumps the generation, the others spin on it;
// no host reset between launches or graph replays. Traps after ~2^26 polls rather
// than hang if the grid is not all resident.
__device__ void grid_barrier(unsigned* count, unsigned* gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        const unsigned g = atomicAdd(gen, 0u);
        if (atomicAdd(count, 1u) == gridDim.x - 1) {
            atomicExch(count, 0u);
            __threadfence();
            atomicAdd(gen, 1u);
        } else {
            unsigned polls = 0;
            while (ld_acquire(gen) == g)
                if (++polls > (1u << 26)) __trap();
        }
        __threadfence();
    }
    __syncthreads();
}

// The lean form (CUTLASS's generic barrier's pattern): the count only grows; the
// barrier a block arrives at ends when the count reaches the next multiple of the
// grid (every launch on this count has the same grid). Thread 0's release-add orders
// the block's writes (they precede it through __syncthreads); acquire loads poll.
__device__ void grid_barrier_lean(unsigned long long* count) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long old, v;
        asm volatile("atom.add.release.gpu.global.u64 %0, [%1], 1;" : "=l"(old) : "l"(count) : "memory");
        const unsigned long long target = (old / gridDim.x + 1) * gridDim.x;
        unsigned polls = 0;
        do {
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(count) : "memory");
            if (++polls > (1u << 26)) __trap();
        } while (v < target);
    }
    __syncthreads();
}

// The producer's work for block b: a 64 x 64 partial tile of gate (b < 96) or up, one
// of two splits: p[problem][split][token][col] (16 KB a block), from x [64][64].
__device__ void produce(const float* x, float* p, int b) {
    const int prob = b / 96, rem = b % 96, split = rem / 48, tile = rem % 48;
    float* out = p + ((long)(prob * SPLITS + split) * TOK) * COLS + tile * 64;
    for (int e = threadIdx.x; e < TOK * 64; e += blockDim.x) {
        const int t = e / 64, c = e % 64;
        out[(long)t * COLS + c] = x[t * 64 + c] * (float)(split + 1) + (float)prob;
    }
}

// One consumer warp item (row r, 128-column group g): gate and up summed over the
// splits (slice order), h = g * sigmoid(g) * u, and its warp's max (as the operand's
// scale) into h [64][3072] and amax [64][24].
__device__ void consume(const float* p, float* h, float* amax, int item, int lane) {
    const int r = item / 24, g = item % 24, c = g * 128 + lane * 4;
    float gv[4], uv[4];
    for (int j = 0; j < 4; j++) {
        gv[j] = __ldcg(p + ((long)(0 * SPLITS + 0) * TOK + r) * COLS + c + j) +
                __ldcg(p + ((long)(0 * SPLITS + 1) * TOK + r) * COLS + c + j);
        uv[j] = __ldcg(p + ((long)(1 * SPLITS + 0) * TOK + r) * COLS + c + j) +
                __ldcg(p + ((long)(1 * SPLITS + 1) * TOK + r) * COLS + c + j);
    }
    float m = 0.0f;
    for (int j = 0; j < 4; j++) {
        const float v = gv[j] / (1.0f + expf(-gv[j])) * uv[j];
        h[(long)r * COLS + c + j] = v;
        m = fmaxf(m, fabsf(v));
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) amax[r * 24 + g] = m;
}

__global__ void __launch_bounds__(128) k_produce(const float* x, float* p) {
    pdl_entry();
    produce(x, p, blockIdx.x);
}
__global__ void __launch_bounds__(256) k_consume(const float* p, float* h, float* amax) {
    pdl_entry();
    const int item = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (item < TOK * 24) consume(p, h, amax, item, threadIdx.x & 31);
}
// mode 0: producer, barrier, consumer items; mode 1: producer and barrier only.
__global__ void __launch_bounds__(128) k_fused(const float* x, float* p, float* h, float* amax, unsigned* count,
                                               unsigned* gen, int mode) {
    pdl_entry();
    produce(x, p, blockIdx.x);
    grid_barrier(count, gen);
    if (mode == 1) return;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int item = blockIdx.x * 4 + w; item < TOK * 24; item += gridDim.x * 4) consume(p, h, amax, item, lane);
}

// The same with the lean barrier.
__global__ void __launch_bounds__(128) k_fused_lean(const float* x, float* p, float* h, float* amax,
                                                    unsigned long long* count, int mode) {
    pdl_entry();
    produce(x, p, blockIdx.x);
    grid_barrier_lean(count);
    if (mode == 1) return;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int item = blockIdx.x * 4 + w; item < TOK * 24; item += gridDim.x * 4) consume(p, h, amax, item, lane);
}

template <class K, class... A>
static void launch(cudaStream_t s, K kern, int blocks, int threads, A... args) {
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(blocks);
    c.blockDim = dim3(threads);
    c.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at;
    c.numAttrs = 1;
    CK(cudaLaunchKernelEx(&c, kern, args...));
}

int main() {
    const int NL = 28, R = 200;
    int per_sm = 0, sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_fused, 128, 0));
    printf("k_fused: %d blocks an SM x %d SMs = %d resident, grid %d\n", per_sm, sms, per_sm * sms, BLOCKS);
    if (per_sm * sms < BLOCKS) return 1;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *x, *p, *h, *amax, *h2, *amax2;
    unsigned *count, *gen;
    unsigned long long* count64;
    CK(cudaMalloc(&count64, 8));
    CK(cudaMemset(count64, 0, 8));
    CK(cudaMalloc(&x, TOK * 64 * 4));
    CK(cudaMalloc(&p, 2L * SPLITS * TOK * COLS * 4));
    CK(cudaMalloc(&h, (long)TOK * COLS * 4));
    CK(cudaMalloc(&h2, (long)TOK * COLS * 4));
    CK(cudaMalloc(&amax, TOK * 24 * 4));
    CK(cudaMalloc(&amax2, TOK * 24 * 4));
    CK(cudaMalloc(&count, 4));
    CK(cudaMalloc(&gen, 4));
    CK(cudaMemset(count, 0, 4));
    CK(cudaMemset(gen, 0, 4));
    std::vector<float> hx(TOK * 64);
    for (size_t i = 0; i < hx.size(); i++) hx[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    const char* names[] = {"two launches", "fused (barrier)", "producer + barrier", "producer alone",
                           "fused (lean)", "producer + lean"};
    printf("%-20s %10s\n", "graph", "us a pair");
    for (int mode = 0; mode < 6; mode++) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
        for (int l = 0; l < NL; l++) {
            if (mode == 0) {
                launch(s, k_produce, BLOCKS, 128, (const float*)x, p);
                launch(s, k_consume, BLOCKS, 256, (const float*)p, h, amax);
            } else if (mode == 1) {
                launch(s, k_fused, BLOCKS, 128, (const float*)x, p, h2, amax2, count, gen, 0);
            } else if (mode == 2) {
                launch(s, k_fused, BLOCKS, 128, (const float*)x, p, h2, amax2, count, gen, 1);
            } else if (mode == 3) {
                launch(s, k_produce, BLOCKS, 128, (const float*)x, p);
            } else {
                launch(s, k_fused_lean, BLOCKS, 128, (const float*)x, p, h2, amax2, count64, mode == 4 ? 0 : 1);
            }
        }
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        for (int w = 0; w < 10; w++) CK(cudaGraphLaunch(ge, s));
        CK(cudaStreamSynchronize(s));
        auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < R; r++) CK(cudaGraphLaunch(ge, s));
        CK(cudaStreamSynchronize(s));
        auto t1 = std::chrono::steady_clock::now();
        printf("%-20s %10.2f\n", names[mode], std::chrono::duration<double, std::micro>(t1 - t0).count() / R / NL);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    std::vector<float> a(TOK * COLS), b(TOK * COLS), ma(TOK * 24), mb(TOK * 24);
    CK(cudaMemcpy(a.data(), h, a.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), h2, b.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ma.data(), amax, ma.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(mb.data(), amax2, mb.size() * 4, cudaMemcpyDeviceToHost));
    const bool same = !memcmp(a.data(), b.data(), a.size() * 4) && !memcmp(ma.data(), mb.data(), ma.size() * 4);
    printf("fused output (the lean barrier's, the last to write it) %s the two launches' (bit for bit)\n",
           same ? "equals" : "DIFFERS FROM");
    return same ? 0 : 2;
}
