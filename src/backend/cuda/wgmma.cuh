// Inline-PTX wrappers for Hopper's warpgroup tensor-core instructions (wgmma, sm_90a only): a warpgroup (four
// consecutive warps, 128 threads) multiplies a 64-row A by a B of N columns, reading B (and A, in the _ss forms) from
// shared memory through 64-bit matrix descriptors and accumulating in f32 registers. Accumulator layout (PTX ISA
// "Register Fragments for wgmma .m64nNk16"): warp w of the group holds rows 16 w .. 16 w + 15; with gq = lane / 4,
// tq = lane % 4, d[j][0..1] are row gq, columns 8 j + 2 tq and + 1, d[j][2..3] the same columns of row gq + 8: per
// 8-column tile, the layout of mma.sync m16n8's C. A from registers (_rs) takes mma.sync m16n8k16's A fragments.
// Shared-memory operands here use the 128-byte swizzle: 8-row x 128-byte atoms, 1024-byte aligned, whose 16-byte
// chunk c of row r sits at chunk c ^ (r % 8) (sw128_offset). Outside sm_90a every wrapper traps; callers check
// wgmma_available() first. Included only by .cu files.
#pragma once

#include <cstdint>

namespace tandem::cuda {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TANDEM_WGMMA 1
#else
#define TANDEM_WGMMA 0
#endif

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile stored as blocks of 64 bf16 columns, each block
// `rows` rows of 128 bytes (so 8 rows make a 1024-byte swizzle atom), with the 128-byte swizzle.
__device__ __forceinline__ uint32_t sw128_offset(int row, int chunk, int rows) {
  return static_cast<uint32_t>((chunk >> 3) * rows * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

// A shared-memory matrix descriptor with the 128-byte swizzle: start address (shared window), leading and stride
// byte offsets (the distances between 8-row core-matrix groups along the two dimensions; the K-major operands here
// use only the stride one), all in 16-byte units.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t smem_addr, uint32_t lead_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | static_cast<uint64_t>((lead_bytes & 0x3FFFF) >> 4) << 16 |
         static_cast<uint64_t>((stride_bytes & 0x3FFFF) >> 4) << 32 | uint64_t{1} << 62;
}

// Orders this thread's earlier generic-proxy shared-memory writes (st.shared, cp.async once waited for) before later
// async-proxy reads (wgmma operands); run by the writers before the barrier that publishes the data.
__device__ __forceinline__ void fence_proxy_async_smem() {
#if TANDEM_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Before a batch of wgmma: earlier register writes of the accumulators and A fragments are complete.
__device__ __forceinline__ void wgmma_fence() {
#if TANDEM_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if TANDEM_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed groups are still running (their accumulators must not be touched until then).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if TANDEM_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Pins an accumulator register between volatile asm statements: wgmma writes its accumulators asynchronously, but the
// compiler sees them as written by the wgmma statement itself and could move a read of them above the wait (or a
// write below the issue). Applied to every accumulator after wgmma_wait and before wgmma_fence.
template <int R, int C>
__device__ __forceinline__ void wgmma_pin(float (&d)[R][C]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < C; ++j) asm volatile("" : "+f"(d[i][j])::"memory");
}

// d (64 x 32) = (accumulate ? d : 0) + A (64 x 16, K-major in shared memory) B (16 x 32, K-major: B's 32 columns are
// rows of 16 contiguous k).
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
#if TANDEM_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
#else
  (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
  __trap();
#endif
}

// d (64 x 64) += A (64 x 16, registers: mma.sync A fragments of this warp's 16 rows) B (16 x 64, MN-major in shared
// memory: B's 16 rows of 64 contiguous columns, i.e. transposed).
__device__ __forceinline__ void wgmma_m64n64k16_rs_tb(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc_b) {
#if TANDEM_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  (void)d, (void)a, (void)desc_b;
  __trap();
#endif
}

}  // namespace tandem::cuda
