// Does a CUDA graph's replay start later when the graph holds memory nodes
// (cudaMallocAsync / cudaFreeAsync captured inside it)? 230 small PDL kernels, as a
// decode step; replayed with a download and a host sync between replays (the rollout
// loop) and back to back (the graph's own device time).
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>
#include <chrono>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)
__global__ void k(const float* a, float* p, int n) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = a[i] * 0.5f + 1.0f;
}
static void launch(cudaStream_t s, const float* a, float* p, int n, bool pdl) {
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3((n + 127) / 128); c.blockDim = dim3(128); c.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = pdl;
    c.attrs = at; c.numAttrs = 1;
    CK(cudaLaunchKernelEx(&c, k, a, p, n));
}
int main() {
    const int NK = 230, n = 64 * 1024;
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<float*> fixed(NK + 1);
    for (auto& f : fixed) { CK(cudaMalloc(&f, n * 4)); CK(cudaMemset(f, 0, n * 4)); }
    float* host; CK(cudaMallocHost(&host, 4096));
    int* inh; CK(cudaMallocHost(&inh, 4096));
    float* dl; CK(cudaMalloc(&dl, 4096));
    const char* names[] = {"fixed buffers, PDL", "fixed buffers, no PDL", "alloc nodes (1 a kernel), PDL",
                           "alloc nodes (3 a kernel), PDL", "fixed + 4 input copies, PDL"};
    printf("%-34s %12s %12s %12s\n", "graph", "synced us", "b2b us", "gap us");
    for (int mode = 0; mode < 5; mode++) {
        bool pdl = mode != 1;
        cudaGraph_t g; cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
        if (mode == 4) for (int c = 0; c < 4; c++) CK(cudaMemcpyAsync(dl + c * 64, inh + c * 64, 256, cudaMemcpyHostToDevice, s));
        const float* prev = fixed[0];
        std::vector<float*> pend;
        for (int i = 0; i < NK; i++) {
            float* out = fixed[i + 1];
            if (mode >= 2) {
                int na = mode == 3 ? 3 : 1;
                for (int j = 0; j < na; j++) { float* b; CK(cudaMallocAsync(&b, n * 4, s)); pend.push_back(b); out = b; }
            }
            launch(s, prev, out, n, pdl);
            // free what the previous kernel read (as a layer drops its inputs)
            if (mode >= 2 && pend.size() > 6) { for (size_t j = 0; j + 3 < pend.size(); j++) if (pend[j] != out && pend[j] != prev) { CK(cudaFreeAsync(pend[j], s)); pend[j] = nullptr; }
                std::vector<float*> keep; for (auto b : pend) if (b) keep.push_back(b); pend = keep; }
            prev = out;
        }
        CK(cudaMemcpyAsync(fixed[0], prev, 4, cudaMemcpyDeviceToDevice, s));
        for (auto b : pend) CK(cudaFreeAsync(b, s));
        CK(cudaStreamEndCapture(s, &g));
        size_t nodes = 0; CK(cudaGraphGetNodes(g, nullptr, &nodes));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphUpload(ge, s));
        for (int w = 0; w < 20; w++) CK(cudaGraphLaunch(ge, s));
        CK(cudaStreamSynchronize(s));
        const int R = 300;
        auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < R; r++) {
            CK(cudaGraphLaunch(ge, s));
            CK(cudaMemcpyAsync(host, fixed[0], 512, cudaMemcpyDeviceToHost, s));
            CK(cudaStreamSynchronize(s));
        }
        auto t1 = std::chrono::steady_clock::now();
        for (int r = 0; r < R; r++) CK(cudaGraphLaunch(ge, s));
        CK(cudaStreamSynchronize(s));
        auto t2 = std::chrono::steady_clock::now();
        double sy = std::chrono::duration<double, std::micro>(t1 - t0).count() / R;
        double bb = std::chrono::duration<double, std::micro>(t2 - t1).count() / R;
        printf("%-34s %12.1f %12.1f %12.1f   (%zu nodes)\n", names[mode], sy, bb, sy - bb, nodes);
        CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
    }
    return 0;
}
