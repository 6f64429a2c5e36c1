// RMSNorm (spec §1.2) and half-split RoPE (spec §1.7) on the GPU. RMSNorm: one block per row (a single warp for
// head-sized rows), f32 math, 16-byte vector loads when every row is 16-byte aligned. RoPE: one thread per
// rotated pair; for bf16 activations it follows HF's bf16 arithmetic (cos/sin rounded to bf16, each product and
// the sum rounded: spec §1.13 item 4), for f32 it is plain f32.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;

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
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
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
};

// Row `blockIdx.x`: y = x * rsqrt(mean(x^2) + eps) * w. Pass 2 re-reads x (from L1/L2) so any dim works; each
// element is read before it is written by the same thread, so out may alias x.
template <class TX, class TO, int V>
__global__ void rms_norm_kernel(TO* out, const TX* x, NormWeight w, int64_t dim, float eps) {
  const TX* xr = x + blockIdx.x * dim;
  TO* outr = out + blockIdx.x * dim;
  const int64_t step = static_cast<int64_t>(blockDim.x) * V;
  float ss = 0.f;
  for (int64_t i = threadIdx.x * V; i < dim; i += step) {
    float v[V];
    load_vec<TX, V>(xr + i, v);
#pragma unroll
    for (int j = 0; j < V; ++j) ss += v[j] * v[j];
  }
  ss = block_sum(ss);
  // HF writes pow(ms + eps, -0.5); PyTorch's CUDA pow evaluates an exponent of -0.5 as rsqrt.
  const float inv = rsqrtf(ss / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x * V; i < dim; i += step) {
    float v[V], wv[V];
    load_vec<TX, V>(xr + i, v);
    if (w.data == nullptr) {
#pragma unroll
      for (int j = 0; j < V; ++j) wv[j] = 1.f;
    } else if (w.dtype == DType::kBF16) {
      load_vec<bf16, V>(static_cast<const bf16*>(w.data) + i, wv);
    } else {
      load_vec<float, V>(static_cast<const float*>(w.data) + i, wv);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = v[j] * inv * wv[j];
    store_vec<TO, V>(outr + i, v);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <class TX, class TO>
Status rms_norm_typed(const RmsNormArgs& a, cudaStream_t stream) {
  const int64_t dim = a.x.dim(-1), rows = a.x.rows();
  if (rows == 0 || dim == 0) return ok_status();
  const NormWeight w{a.weight.empty() ? nullptr : a.weight.data, a.weight.dtype};
  const bool vec = dim % 8 == 0 && aligned16(a.x.data) && aligned16(a.out.data) && (!w.data || aligned16(w.data));
  const int v = vec ? 8 : 1;
  int threads = static_cast<int>(std::min<int64_t>(1024, (dim / v + kWarp - 1) / kWarp * kWarp));
  if (threads < kWarp) threads = kWarp;
  auto* out = static_cast<TO*>(a.out.data);
  const auto* x = static_cast<const TX*>(a.x.data);
  const auto grid = static_cast<unsigned>(rows);
  if (vec) {
    rms_norm_kernel<TX, TO, 8><<<grid, threads, 0, stream>>>(out, x, w, dim, a.eps);
  } else {
    rms_norm_kernel<TX, TO, 1><<<grid, threads, 0, stream>>>(out, x, w, dim, a.eps);
  }
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

// x [n_tok, n_heads, head_dim] in place; one thread per (token, head, pair j < head_dim / 2).
template <class T>
__global__ void rope_kernel(T* x, const int32_t* pos, const float* inv_freq, int64_t n_heads, int64_t head_dim,
                            int64_t n_pairs) {
  const int64_t half = head_dim / 2;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n_pairs;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = idx % half, th = idx / half, t = th / n_heads;
    const float f = inv_freq[j];
    if (f == 0.f) continue;  // proportional RoPE: the pair stays bit-for-bit unchanged
    float s, c;
    sincosf(static_cast<float>(pos[t]) * f, &s, &c);  // the angle is an f32 product, as in HF
    T* p = x + th * head_dim + j;
    const float x1 = to_f32(p[0]), x2 = to_f32(p[half]);
    if constexpr (sizeof(T) == 2) {
      // bf16: q * cos + rotate_half(q) * sin with every tensor op rounded to bf16 (spec §1.13 item 4).
      auto r = [](float v) { return __bfloat162float(__float2bfloat16_rn(v)); };
      c = r(c);
      s = r(s);
      p[0] = from_f32<T>(r(x1 * c) - r(x2 * s));
      p[half] = from_f32<T>(r(x2 * c) + r(x1 * s));
    } else {
      p[0] = from_f32<T>(x1 * c - x2 * s);
      p[half] = from_f32<T>(x2 * c + x1 * s);
    }
  }
}

}  // namespace

Status launch_rms_norm(const RmsNormArgs& a, cudaStream_t stream) {
  if (!a.weight.empty() && a.weight.dtype != DType::kBF16 && a.weight.dtype != DType::kF32)
    return unsupported(strfmt("cuda rms_norm: weight dtype %s (bf16 or f32 only)", dtype_name(a.weight.dtype)));
  const DType xt = a.x.dtype, ot = a.out.dtype;
  if (xt == DType::kBF16 && ot == DType::kBF16) return rms_norm_typed<bf16, bf16>(a, stream);
  if (xt == DType::kF32 && ot == DType::kF32) return rms_norm_typed<float, float>(a, stream);
  if (xt == DType::kF32 && ot == DType::kBF16) return rms_norm_typed<float, bf16>(a, stream);
  if (xt == DType::kBF16 && ot == DType::kF32) return rms_norm_typed<bf16, float>(a, stream);
  return unsupported(strfmt("cuda rms_norm: x %s -> out %s (f32/bf16 only)", dtype_name(xt), dtype_name(ot)));
}

Status launch_rope(const RopeArgs& a, cudaStream_t stream) {
  const int64_t n_tok = a.x.shape[0], n_heads = a.x.shape[1], head_dim = a.x.shape[2];
  const int64_t n_pairs = n_tok * n_heads * (head_dim / 2);
  if (n_pairs == 0) return ok_status();
  constexpr int kThreads = 256;
  const auto* pos = static_cast<const int32_t*>(a.pos.data);
  const auto* inv_freq = static_cast<const float*>(a.inv_freq.data);
  if (a.x.dtype == DType::kBF16) {
    rope_kernel<bf16><<<grid_for(n_pairs, kThreads), kThreads, 0, stream>>>(static_cast<bf16*>(a.x.data), pos,
                                                                          inv_freq, n_heads, head_dim, n_pairs);
  } else if (a.x.dtype == DType::kF32) {
    rope_kernel<float><<<grid_for(n_pairs, kThreads), kThreads, 0, stream>>>(static_cast<float*>(a.x.data), pos,
                                                                           inv_freq, n_heads, head_dim, n_pairs);
  } else {
    return unsupported(strfmt("cuda rope: x dtype %s (f32/bf16 only)", dtype_name(a.x.dtype)));
  }
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace tandem::cuda
