// Device-side helpers shared by the CUDA kernel files: element loads/stores for the float dtypes (math is always
// f32; stores round to nearest even like PyTorch, spec §1.13), warp/block reductions, and launch geometry.
// Included only by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "tensor/dtype.h"

namespace tandem::cuda {

// Whether p is 16-byte aligned (the vector loads and cp.async of the kernels need it).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline constexpr int kWarp = 32;

// Compile-time element access (templated kernels).
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

// Run-time element access (memory-bound elementwise kernels, where a uniform branch costs nothing).
__device__ __forceinline__ float load_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_f32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    case DType::kF16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

// Rounds v to the precision of t (identity for f32).
__device__ __forceinline__ float round_to(DType t, float v) {
  if (t == DType::kBF16) return __bfloat162float(__float2bfloat16_rn(v));
  if (t == DType::kF16) return __half2float(__float2half_rn(v));
  return v;
}

// acc + the dot product of 8 bf16 pairs, each packed in a uint4 (one 16-byte load), in element order.
__device__ __forceinline__ float dot8_bf16(const uint4& a, const uint4& b, float acc) {
  const __nv_bfloat162* pa = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* pb = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(pa[i]), fb = __bfloat1622float2(pb[i]);
    acc = fmaf(fa.x, fb.x, acc);
    acc = fmaf(fa.y, fb.y, acc);
  }
  return acc;
}

// gelu with the tanh approximation, in PyTorch's order of operations.
__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  const float inner = kBeta * (x + kKappa * (x * x * x));
  return 0.5f * x * (1.f + tanhf(inner));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// The best (value, index) pair over the warp by a shuffle tree, every lane ending with it: `better(v, i, bv, bi)`
// says whether (v, i) beats (bv, bi) (e.g. a larger value, ties to the lower index), and must be a strict order
// for every lane to agree.
template <class I, class Better>
__device__ __forceinline__ void warp_arg_best(float& best_v, I& best_i, Better better) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, best_v, off);
    const I i = __shfl_xor_sync(0xffffffffu, best_i, off);
    if (better(v, i, best_v, best_i)) {
      best_v = v;
      best_i = i;
    }
  }
}

// Inclusive prefix sum of v over the warp's lanes in lane order (all 32 lanes take part).
template <class T>
__device__ __forceinline__ T warp_inclusive_scan(T v) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int off = 1; off < kWarp; off *= 2) {
    const T o = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += o;
  }
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result. With n_warps
// given, over the block's first n_warps warps only (the others' values are left out, but every thread must call):
// the bits of the whole-block sum in a block of that many warps.
__device__ __forceinline__ float block_sum(float v, int n_warps = -1) {
  __shared__ float partial[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (n_warps < 0) n_warps = blockDim.x / kWarp;
  v = warp_sum(v);
  if (n_warps == 1) return v;
  if (lane == 0 && warp < n_warps) partial[warp] = v;
  __syncthreads();
  v = lane < n_warps ? partial[lane] : 0.f;
  v = warp_sum(v);
  __syncthreads();  // partial[] may be reused by a following call
  return v;
}

// Programmatic dependent launch (sm_90+; the host side is launch.cuh). Every kernel calls this first, before it
// reads or writes global memory: it waits until the kernel before it on the stream has completed and its writes are
// visible (griddepcontrol.wait), then lets the next kernel start launching (griddepcontrol.launch_dependents), so
// the next kernel's launch overlaps this one's run instead of following its end. Waiting first keeps every
// read-after-write and write-after-read order between kernels exactly as without it. No-op below sm_90 and for
// launches without the attribute.
// pdl_enter's two halves, for a kernel that must not let the next one start early (a grid-wide barrier needs all
// of its own blocks resident): the wait alone, and the go-ahead later.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

// Small constants that every decode step reads again (norm weights, RoPE frequencies): loads that ask L2 to keep
// their lines (an evict_last policy), so that the weight rows streaming past them (evict-first loads) do not push
// them out between steps and a kernel's first requests, made before its PDL wait, come back from L2. The bits read
// are the same as a plain load's. sm_80+; a plain load below.
__device__ __forceinline__ uint64_t l2_keep_policy() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}
__device__ __forceinline__ uint4 ld_keep(const uint4* p, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint4 v;
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
#else
  (void)policy;
  return *p;
#endif
}
__device__ __forceinline__ float ld_keep(const float* p, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float v;
  asm volatile("ld.global.L2::cache_hint.f32 %0, [%1], %2;" : "=f"(v) : "l"(p), "l"(policy));
  return v;
#else
  (void)policy;
  return *p;
#endif
}
__device__ __forceinline__ float ld_keep(const __nv_bfloat16* p, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned short bits;
  asm volatile("ld.global.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(bits) : "l"(p), "l"(policy));
  return __bfloat162float(__ushort_as_bfloat16(bits));
#else
  (void)policy;
  return __bfloat162float(*p);
#endif
}

// Asks L2 to fetch the 128-byte line at p (no register result; the kernel goes on at once).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

// Blocks for a grid-stride loop over n items with `threads` per block (capped; the loop covers the rest).
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  constexpr int64_t kMaxBlocks = 132 * 32;  // enough to fill an H100/H200 several times over
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

}  // namespace tandem::cuda
