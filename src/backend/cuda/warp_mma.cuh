// Inline-PTX wrappers for the tensor-core kernels (sm_80+): cp.async global -> shared copies with zero fill,
// ldmatrix fragment loads and mma.sync m16n8k16 bf16 with f32 accumulation. Fragment layouts are the PTX ISA's
// ("Matrix Fragments for mma.m16n8k16"): gq = lane / 4, tq = lane % 4; A holds rows gq, gq + 8 and columns 2tq,
// 2tq + 1, 2tq + 8, 2tq + 9; B (column-major) rows 2tq, 2tq + 1, 2tq + 8, 2tq + 9 of column gq; C/D rows gq, gq + 8
// and columns 2tq, 2tq + 1. Included only by .cu files.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

namespace tandem::cuda {

// A generic pointer into shared memory as the 32-bit shared-window address the PTX below takes.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; zero-fills the destination when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ldmatrix: four (x2: two) 8x8 b16 matrices from shared memory; lane i gives the 16-byte row i % 8 of matrix i / 8
// (x2: lanes 0-15). Register j receives matrix j's row lane / 4, columns 2 (lane % 4) and + 1 (low half first);
// .trans gives column lane / 4, rows 2 (lane % 4) and + 1 instead.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(p))
               : "memory");
}

// The bits of a bf16 pair (low element in the low half), for packing fragments.
__device__ __forceinline__ uint32_t bf162_bits(__nv_bfloat162 v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

// c += a b: a 16x16 (row-major fragment), b 16x8 (column-major fragment), bf16 in, f32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace tandem::cuda
