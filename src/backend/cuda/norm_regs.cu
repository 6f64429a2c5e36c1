// The register path of rms_norm, rms_norm_then and rms_norm_seq (norm_math.cuh): a decode step's norms are one or
// a few rows of 1.5K..5.4K bf16 values, so each costs the latency of its memory round trips, not their bytes. The plain
// kernels (norm_rope.cu) make several per stage: x for the sum of squares, then the weight, the residual and x again
// for the output, each after the reduction before it; a stage reading an earlier one's out reads it back from
// memory. Here each thread owns one 8-element chunk of its row in every stage and:
//  - requests every stage's weight before the wait for the kernel before (no kernel writes a weight);
//  - loads, right after that wait and all at once, every x and residual that no earlier stage writes;
//  - takes an earlier stage's out from its registers, as it stored it (rounded to bf16).
// One block reduction per stage remains. Element ownership, the sum of squares (this thread's 8 squares in order,
// then block_sum over the same block size) and the output math (norm_out) are rms_norm_row's when one pass of the
// block covers the row, so the bits are the same (CudaFusedNorm.RegisterPathEqualsPlainKernelsBitwise).
#include <cuda_bf16.h>

#include <atomic>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/norm_math.cuh"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ void unpack8(const uint4& raw, float (&v)[8]) {
  const bf16* e = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = to_f32(e[j]);
}

__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
  uint4 raw;
  bf16* e = reinterpret_cast<bf16*>(&raw);
#pragma unroll
  for (int j = 0; j < 8; ++j) e[j] = from_f32<bf16>(v[j]);
  return raw;
}

// Stages [0, N) over row blockIdx.x; thread t owns elements [8 t, 8 t + 8) (none past dim: it adds zeros to the
// sums, as rms_norm_row's threads past the row do).
template <int N>
__global__ void __launch_bounds__(kNormRegThreads) rms_norm_regs_kernel(const NormJobs jobs, int64_t dim) {
  const int64_t i = 8 * static_cast<int64_t>(threadIdx.x), at = static_cast<int64_t>(blockIdx.x) * dim + i;
  const bool active = i < dim;
  float w[N][8];
#pragma unroll
  for (int s = 0; s < N; ++s) {
    if (active) {
      load_weight<8>(jobs.j[s].w, i, w[s], true);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) w[s][j] = 0.f;
    }
  }
  pdl_enter();
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 in_x[N], in_r[N], out[N];
#pragma unroll
  for (int s = 0; s < N; ++s) {
    const NormJob& j = jobs.j[s];
    in_x[s] = active && j.x_src < 0 ? *reinterpret_cast<const uint4*>(static_cast<const bf16*>(j.x) + at) : zero;
    in_r[s] = active && j.e.residual != nullptr && j.res_src < 0
                  ? *reinterpret_cast<const uint4*>(static_cast<const bf16*>(j.e.residual) + at)
                  : zero;
  }
#pragma unroll
  for (int s = 0; s < N; ++s) {
    const NormJob& j = jobs.j[s];
    uint4 xr = in_x[s], rr = in_r[s];
#pragma unroll
    for (int k = 0; k < s; ++k) {
      if (j.x_src == k) xr = out[k];
      if (j.res_src == k) rr = out[k];
    }
    float v[8], rv[8];
    unpack8(xr, v);
    unpack8(rr, rv);
    const float inv = inv_rms_of(block_sum(add_squares<8>(v, 0.f)), dim, j.eps);
    norm_out<bf16, 8>(v, inv, w[s], j.e.residual != nullptr ? rv : nullptr, j.e.out_scale);
    out[s] = pack8(v);
    if (active) *reinterpret_cast<uint4*>(static_cast<bf16*>(j.out) + at) = out[s];
  }
}

std::atomic<bool>& regs_flag() {
  static std::atomic<bool> on{true};
  return on;
}

std::atomic<bool>& keep_flag() {
  static std::atomic<bool> on{true};
  return on;
}

}  // namespace

void set_norm_regs(bool on) { regs_flag().store(on, std::memory_order_relaxed); }
void set_keep_norm_weights(bool on) { keep_flag().store(on, std::memory_order_relaxed); }
bool keep_norm_weights() { return keep_flag().load(std::memory_order_relaxed); }
bool norm_regs_enabled() { return regs_flag().load(std::memory_order_relaxed); }

Status launch_norm_regs(const NormJobs& jobs, int n, int64_t rows, int threads, int64_t dim, cudaStream_t stream) {
  if (n < 1 || n > kMaxNormJobs || threads > kNormRegThreads || dim > 8 * static_cast<int64_t>(threads))
    return internal_error("cuda norm register path: a shape it does not take");
  const auto grid = static_cast<unsigned>(rows);
  switch (n) {
    case 1: launch_kernel(rms_norm_regs_kernel<1>, grid, threads, 0, stream, jobs, dim); break;
    case 2: launch_kernel(rms_norm_regs_kernel<2>, grid, threads, 0, stream, jobs, dim); break;
    case 3: launch_kernel(rms_norm_regs_kernel<3>, grid, threads, 0, stream, jobs, dim); break;
    default: launch_kernel(rms_norm_regs_kernel<4>, grid, threads, 0, stream, jobs, dim); break;
  }
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace tandem::cuda
