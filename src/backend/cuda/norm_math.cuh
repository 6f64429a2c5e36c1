// The element math of RMSNorm on the GPU (spec §1.2), shared by the norm kernels (norm_rope.cu, norm_regs.cu) and
// the kernels that run a norm inside a larger step (per_layer_input.cu): vector loads and stores of V = 1 or 8
// elements, the norm weight, and the arithmetic of one thread's elements, so that every kernel computing a norm rounds
// and adds exactly as rms_norm does; and the norm kernels' job descriptions. Included only by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "core/status.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace tandem::cuda {

// V consecutive elements as f32. V is 1 or 8; with 8 the pointer is 16-byte aligned (checked by the launcher).
template <class T, int V>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[V]) {
  if constexpr (V == 8 && sizeof(T) == 2) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = to_f32(e[j]);
  } else if constexpr (V == 8 && sizeof(T) == 4) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
    v[4] = b.x;
    v[5] = b.y;
    v[6] = b.z;
    v[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = to_f32(p[j]);
  }
}

template <class T, int V>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[V]) {
  if constexpr (V == 8 && sizeof(T) == 2) {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) e[j] = from_f32<T>(v[j]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else if constexpr (V == 8 && sizeof(T) == 4) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) p[j] = from_f32<T>(v[j]);
  }
}

struct NormWeight {
  const void* data = nullptr;  // [dim] or nullptr (weightless norm)
  DType dtype = DType::kF32;
  bool keep = false;  // read with L2's evict_last priority (device_utils.cuh ld_keep): same bits, kept resident
};

// A norm's weight tensor as the kernels take it (an empty tensor: a weightless norm).
inline NormWeight norm_weight(const Tensor& w) {
  return NormWeight{w.empty() ? nullptr : w.data, w.dtype, !w.empty() && keep_norm_weights()};
}
// Whether the kernels read this weight: none, or bf16 / f32.
inline bool plain_weight(const Tensor& w) { return w.empty() || w.dtype == DType::kBF16 || w.dtype == DType::kF32; }
// A weight the fused kernels read with vector loads for rows of d: none, or d bf16 / f32 values, 16-byte aligned.
inline bool plain_norm_weight(const Tensor& w, int64_t d) {
  return plain_weight(w) && (w.empty() || (w.numel() == d && aligned16(w.data)));
}

// V elements from p, as vector accesses when `vec` (p 16-byte aligned), else one by one.
template <class T, int V>
__device__ __forceinline__ void load_any(const T* p, float (&v)[V], bool vec) {
  if (vec) {
    load_vec<T, V>(p, v);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = to_f32(p[j]);
  }
}

template <class T, int V>
__device__ __forceinline__ void store_any(T* p, const float (&v)[V], bool vec) {
  if (vec) {
    store_vec<T, V>(p, v);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) p[j] = from_f32<T>(v[j]);
  }
}

// load_any with L2's evict_last policy (device_utils.cuh ld_keep): the same values, in 16-byte loads when `vec`.
template <class T, int V>
__device__ __forceinline__ void load_keep(const T* p, float (&v)[V], bool vec, uint64_t policy) {
  if (V == 8 && vec) {
    constexpr int kPerLoad = 16 / sizeof(T);  // 8 bf16 or 4 f32
#pragma unroll
    for (int h = 0; h < V / kPerLoad; ++h) {
      const uint4 raw = ld_keep(reinterpret_cast<const uint4*>(p) + h, policy);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < kPerLoad; ++j) v[kPerLoad * h + j] = to_f32(e[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = ld_keep(p + j, policy);
  }
}

template <int V>
__device__ __forceinline__ void load_weight(const NormWeight& w, int64_t i, float (&v)[V], bool vec) {
  if (w.data == nullptr) {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = 1.f;
  } else if (w.keep) {
    const uint64_t policy = l2_keep_policy();
    if (w.dtype == DType::kBF16) {
      load_keep<__nv_bfloat16, V>(static_cast<const __nv_bfloat16*>(w.data) + i, v, vec, policy);
    } else {
      load_keep<float, V>(static_cast<const float*>(w.data) + i, v, vec, policy);
    }
  } else if (w.dtype == DType::kBF16) {
    load_any<__nv_bfloat16, V>(static_cast<const __nv_bfloat16*>(w.data) + i, v, vec);
  } else {
    load_any<float, V>(static_cast<const float*>(w.data) + i, v, vec);
  }
}

// v as the separate op would have stored it in a T tensor (identity for f32).
template <class T>
__device__ __forceinline__ float round_as(float v) {
  return to_f32(from_f32<T>(v));
}

// ss + the squares of v in element order: one thread's share of a row's sum of squares.
template <int V>
__device__ __forceinline__ float add_squares(const float (&v)[V], float ss) {
#pragma unroll
  for (int j = 0; j < V; ++j) ss += v[j] * v[j];
  return ss;
}

// (mean(x^2) + eps)^-0.5 from the row's sum of squares. HF writes pow(ms + eps, -0.5); PyTorch's CUDA pow
// evaluates an exponent of -0.5 as rsqrt.
__device__ __forceinline__ float inv_rms_of(float ss, int64_t dim, float eps) {
  return rsqrtf(ss / static_cast<float>(dim) + eps);
}

// rms_norm's output math on V elements of out's dtype TO: v = x * inv * w, then + residual (the normed value
// rounded first, never contracted into an FMA) when res is given, then * out_scale (rounded first) when it is not
// 1. The caller's store rounds the result.
template <class TO, int V>
__device__ __forceinline__ void norm_out(float (&v)[V], float inv, const float (&w)[V], const float* res,
                                         float out_scale) {
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = v[j] * inv * w[j];
  if (res) {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = __fadd_rn(res[j], round_as<TO>(v[j]));
  }
  if (out_scale != 1.f) {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = round_as<TO>(v[j]) * out_scale;
  }
}

// The fused epilogue of rms_norm (ops.h): out = (residual + y) * out_scale, each stage rounded to out's dtype.
struct NormEpilogue {
  const void* residual = nullptr;  // out's dtype and shape, or nullptr
  float out_scale = 1.f;
  bool vec_io = false;  // out, residual and weight are 16-byte aligned: pass 2 may use vector loads and stores
  // rms_norm_then: next_out = rms_norm(out) * next_w (out's dtype), or nullptr. The launcher takes it only when
  // out has x's norm geometry, so the second reduction adds the same values in the same order as a separate
  // rms_norm launch on out would.
  void* next_out = nullptr;
  NormWeight next_w;
  float next_eps = 0.f;
};

// One norm of rms_norm_seq (its stages are applied in order).
struct NormJob {
  void* out = nullptr;
  const void* x = nullptr;
  NormWeight w;
  NormEpilogue e;
  float eps = 0.f;
  // The register path (norm_regs.cu): the earlier stage whose out this stage's x / residual is, or -1 (read from
  // memory).
  int x_src = -1, res_src = -1;
};
constexpr int kMaxNormJobs = 4;
struct NormJobs {
  NormJob j[kMaxNormJobs];
};

// The register path of rms_norm, rms_norm_then and rms_norm_seq (norm_regs.cu), for bf16 x and out read as 8-element
// vectors, every pointer 16-byte aligned (vec_io), and a block of at most kNormRegThreads threads: each thread owns
// one 8-element chunk of its row, as rms_norm_row does when one pass covers the row, so the bits are the same.
constexpr int kNormRegThreads = 672;  // rows of up to 5376 values (31B's width) without register spills
bool norm_regs_enabled();
// Stages [0, n) of `jobs` over `rows` rows of `dim`, one block of `threads` per row; x_src / res_src must be set.
Status launch_norm_regs(const NormJobs& jobs, int n, int64_t rows, int threads, int64_t dim, cudaStream_t stream);

}  // namespace tandem::cuda
