// Helpers of the warpgroup-MMA kernels (gemm_wg.cu, flash_wg.cu); context.rs
// prepends this after wgmma.cuh. Shared-memory tiles: rows of 128 bytes in the
// 128-byte swizzle (16-byte unit u of row r at u ^ (r & 7)), 8-row atoms 1024
// bytes apart, tiles 1024-byte aligned; longer rows are split into planes.

// Descriptor of a K-major tile in the 128-byte swizzle at shared address s: start
// >> 4 (bits 0-13), leading offset unused (0), stride 1024 >> 4 between 8-row atoms
// (bits 32-45), layout 1 = 128-byte swizzle (bits 62-63).
__device__ __forceinline__ u64 sw128_desc(u32 s) {
    return (u64)((s & 0x3FFFF) >> 4) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// At most N of this warpgroup's committed groups still running (they finish in order).
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// cp.async writes are the generic proxy's; wgmma reads through the async proxy.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Keeps the compiler from moving accumulator reads and writes across the wgmma
// issue and wait (it cannot see that the asynchronous MMA owns them in between).
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ u8* align1024(u8* p) {
    return p + ((1024 - (smem_addr(p) & 1023)) & 1023);
}

// Start copying the group at byte `off` of R rows (row stride RB bytes, rows >= rv
// and bytes past RB zero-filled) into the swizzled tile at dst: NT threads, thread
// tid. GB / 16 units a row; a BF16 row's units 8-15 go to the second plane.
template <int GB, int R, int NT>
__device__ __forceinline__ void load_tile(u8* dst, const u8* src, long RB, long off, int rv, int tid) {
    constexpr int UPR = GB / 16, UNITS = R * UPR;
#pragma unroll
    for (int i = 0; i < (UNITS + NT - 1) / NT; i++) {
        const int c = tid + i * NT;
        if (UNITS % NT == 0 || c < UNITS) {
            const int r = c / UPR, u = c % UPR;
            const long b = off + u * 16;
            const bool ok = r < rv && b < RB;
            cp16(dst + (u >> 3) * (R * 128) + r * 128 + (((u & 7) ^ (r & 7)) << 4), ok ? src + r * RB + b : src, ok);
        }
    }
}

template <int R>
__device__ __forceinline__ void zero(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++) d[i] = 0.0f;
}

// fence_regs for the u32 A fragments of a register-sourced wgmma: they must stay
// where they are until the MMA that reads them has been waited for.
template <int R>
__device__ __forceinline__ void fence_u32(u32 (&a)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+r"(a[i])::"memory");
}
