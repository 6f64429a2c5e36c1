// Sampling-side kernels on the GPU: row-wise argmax over logits (greedy decoding, spec §1.13 item 6: ties go
// to the lowest index, a NaN wins like torch.argmax). One block per row. Issue 7 adds the sampler kernels here.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 512;

// Whether (v, i) beats (bv, bi): NaN beats any number, larger beats smaller, equal values go to the lower index.
__device__ __forceinline__ bool better(float v, int64_t i, float bv, int64_t bi) {
  const bool v_nan = isnan(v), b_nan = isnan(bv);
  if (v_nan || b_nan) return v_nan && (!b_nan || i < bi);
  return v > bv || (v == bv && i < bi);
}

template <class T>
__global__ void argmax_kernel(int32_t* out, const T* x, int64_t n) {
  pdl_enter();
  const T* row = x + blockIdx.x * n;
  float best = -INFINITY;
  int64_t best_i = INT64_MAX;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = to_f32(row[i]);
    if (better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, best, off);
    const int64_t i = __shfl_xor_sync(0xffffffffu, best_i, off);
    if (better(v, i, best, best_i)) {
      best = v;
      best_i = i;
    }
  }
  __shared__ float s_val[kThreads / kWarp];
  __shared__ int64_t s_idx[kThreads / kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) {
    s_val[warp] = best;
    s_idx[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / kWarp); ++w) {
      if (better(s_val[w], s_idx[w], best, best_i)) {
        best = s_val[w];
        best_i = s_idx[w];
      }
    }
    out[blockIdx.x] = static_cast<int32_t>(best_i);
  }
}

}  // namespace

Status launch_argmax(const ArgmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.rows(), n = a.x.dim(-1);
  if (rows == 0) return ok_status();
  auto* out = static_cast<int32_t*>(a.out.data);
  const auto grid = static_cast<unsigned>(rows);
  if (a.x.dtype == DType::kBF16) {
    launch_kernel(argmax_kernel<__nv_bfloat16>, grid, kThreads, 0, stream, out,
                  static_cast<const __nv_bfloat16*>(a.x.data), n);
  } else if (a.x.dtype == DType::kF32) {
    launch_kernel(argmax_kernel<float>, grid, kThreads, 0, stream, out, static_cast<const float*>(a.x.data), n);
  } else {
    return unsupported(strfmt("cuda argmax: x dtype %s (f32/bf16 only)", dtype_name(a.x.dtype)));
  }
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace tandem::cuda
