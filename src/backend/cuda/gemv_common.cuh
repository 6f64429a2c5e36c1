// What the two decode/verify product kernels share: gemv.cu (CUDA cores, 1..9 rows) and gemv_tc.cu (tensor cores,
// 2..9 rows). The output rows of one launch (up to kMaxLinearGroup matrices of the same x) and the store of one
// finished product with the epilogues both kernels offer. Included only by .cu files.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/device_utils.cuh"
#include "backend/ops.h"
#include "core/status.h"

namespace tandem::cuda {

// The output rows of one launch: up to kMaxLinearGroup matrices of the same x (linear_group), segment i taking the
// blocks from first_block[i] on. out[i] is [T, n_out[i]].
static_assert(kMaxLinearGroup == 3, "the product kernels pick among three segments");
struct GemvSegs {
  const __nv_bfloat16* w[kMaxLinearGroup];
  void* out[kMaxLinearGroup];
  int64_t n_out[kMaxLinearGroup];
  int64_t first_block[kMaxLinearGroup];
  int n;
};

// Entry si of a segment array, selected without indexing the kernel parameter (which would copy it to local memory).
template <class V>
__device__ __forceinline__ V seg_at(const V (&a)[kMaxLinearGroup], int si) {
  return si == 0 ? a[0] : (si == 1 ? a[1] : a[2]);
}

// The segment that block `block` works on.
__device__ __forceinline__ int gemv_segment(const GemvSegs& segs, int64_t block) {
  int si = 0;
#pragma unroll
  for (int i = 1; i < kMaxLinearGroup; ++i)
    if (i < segs.n && block >= segs.first_block[i]) si = i;
  return si;
}

// Stores one output element from its f32 sums. M = 2 (geglu): s is the gate product, u the up product, and the
// element is gelu(round(s)) * round(u), rounded as linear, linear, gelu_mul would round. M = 1: alpha * s (+ the
// element already there when accumulating); with up (linear_gelu_mul) the product as stored is gelu'd and
// multiplied by *up, as linear then gelu_mul round.
template <class TO, int M>
__device__ __forceinline__ void gemv_store(TO* dst, float s, float u, float alpha, bool accumulate, const TO* up) {
  if constexpr (M == 2) {
    const float g = to_f32(from_f32<TO>(s)), uu = to_f32(from_f32<TO>(u));  // the two products, rounded
    *dst = from_f32<TO>(to_f32(from_f32<TO>(gelu_tanh(g))) * uu);
  } else {
    float y = alpha * s;
    if (accumulate) y += to_f32(*dst);
    if (up != nullptr) {
      const float g = to_f32(from_f32<TO>(y));
      y = to_f32(from_f32<TO>(gelu_tanh(g))) * to_f32(*up);
    }
    *dst = from_f32<TO>(y);
  }
}

// gemv_tc.cu: the launch that launch_rows (gemv.cu) hands a product over to where gemv_tc_takes (kernels.h). Each
// warp of a block sums a fixed share of K for 16 weight rows, and the block adds the warps' sums in order, so the
// bits depend on K, the launch's rows of output and the SM count (which set the blocks per strip), never on T or on
// the values of the other rows.
// w2: geglu's w_up (M = 2) or null; up / up_stride: the linear_gelu_mul epilogue or null. Fills segs.first_block.
Status launch_gemv_tc(GemvSegs segs, int64_t rows, int64_t n_in, bool out_bf16, const void* x, const void* w2,
                      float alpha, bool accumulate, const void* up, int64_t up_stride, bool early, int sm_count,
                      cudaStream_t stream);

}  // namespace tandem::cuda
