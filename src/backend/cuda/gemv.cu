// linear() for decode and verify on the GPU: out[T, N] = alpha * x[T, K] @ w[N, K]^T (+ out) for T = 1..9 bf16
// rows against bf16 weights, where reading w once at full memory bandwidth is all that matters (gemm.h picks it).
// Each block owns R consecutive output rows; its 256 threads stride together over K in 16-byte chunks, so every
// weight row streams through as 4 KB coalesced reads with R independent loads in flight per thread; x (a few KB)
// comes from L1/L2. Products accumulate in f32 per thread, then a warp and a block reduction; the output is
// rounded once (ops.h, spec §1.13). The GeGLU variant (geglu op) streams R rows of w_gate and the same R rows of
// w_up together and writes gelu(round(g)) * round(u), rounded as linear, linear, gelu_mul would round.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int kMaxTokens = 9;
constexpr int kMaxGegluTokens = 2;  // decode sizes, where the fused GEMV beats two cuBLASLt products

// M = 1 weight matrix (linear), or 2 (geglu: rows of w_gate in acc[0], of w_up = w2 in acc[1]).
template <int T, int R, class TO, int M>
__global__ void __launch_bounds__(kThreads) gemv_kernel(TO* __restrict__ out, const bf16* __restrict__ x,
                                                        const bf16* __restrict__ w, const bf16* __restrict__ w2,
                                                        int64_t n_out, int64_t n_in, float alpha, bool accumulate) {
  pdl_enter();
  __shared__ float partial[kWarps][M * R * T];
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * R;
  const int64_t chunks = n_in / 8;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  // Rows past n_out (the last block) re-read the last row instead of branching inside the loop.
  const uint4* wr[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r)
      wr[m][r] = reinterpret_cast<const uint4*>(m == 0 ? w : w2) + min(row0 + r, n_out - 1) * chunks;

  float acc[M][R][T];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) acc[m][r][t] = 0.f;

#pragma unroll 2
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    uint4 wc[M][R];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) wc[m][r] = __ldcs(wr[m][r] + c);  // streamed once: keep it out of L1
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const uint4 xc = __ldg(xv + t * chunks + c);
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r][t] = dot8_bf16(wc[m][r], xc, acc[m][r][t]);
    }
  }

  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const float v = warp_sum(acc[m][r][t]);
        if (lane == 0) partial[warp][(m * R + r) * T + t] = v;
      }
  __syncthreads();
  for (int i = threadIdx.x; i < R * T; i += kThreads) {
    const int r = i / T, t = i % T;
    const int64_t o = row0 + r;
    if (o >= n_out) continue;
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < kWarps; ++j) s += partial[j][i];
    TO* dst = out + static_cast<int64_t>(t) * n_out + o;
    if constexpr (M == 2) {
      float u = 0.f;
#pragma unroll
      for (int j = 0; j < kWarps; ++j) u += partial[j][R * T + i];
      const float g = to_f32(from_f32<TO>(s)), up = to_f32(from_f32<TO>(u));  // the two products, rounded
      *dst = from_f32<TO>(to_f32(from_f32<TO>(gelu_tanh(g))) * up);
    } else {
      float y = alpha * s;
      if (accumulate) y += to_f32(*dst);
      *dst = from_f32<TO>(y);
    }
  }
}

// w2 = nullptr: linear; else geglu with w = w_gate, w2 = w_up.
template <int T, class TO, int M = 1>
Status launch_rows(const LinearArgs& a, const void* w2, int sm_count, cudaStream_t stream) {
  const int64_t n_out = a.w.dim(0), n_in = a.w.dim(1);
  // Most rows per block (fewest re-reads of x) that still gives every SM a few blocks; fewer when T is large,
  // to bound the M x R x T accumulators.
  constexpr int kMaxR = (T <= 2 ? 8 : (T <= 4 ? 4 : 2)) / M;
  auto go = [&](auto r_tag) -> Status {
    constexpr int R = decltype(r_tag)::value;
    const auto blocks = static_cast<unsigned>((n_out + R - 1) / R);
    launch_kernel(gemv_kernel<T, R, TO, M>, blocks, kThreads, 0, stream, static_cast<TO*>(a.out.data),
                  static_cast<const bf16*>(a.x.data), static_cast<const bf16*>(a.w.data), static_cast<const bf16*>(w2),
                  n_out, n_in, a.alpha, a.accumulate);
    TANDEM_CUDA_TRY_LAUNCH();
    return ok_status();
  };
  const int64_t want_blocks = 4 * static_cast<int64_t>(sm_count > 0 ? sm_count : 132);
  if (kMaxR >= 8 && n_out / 8 >= want_blocks) return go(std::integral_constant<int, kMaxR>{});
  if (kMaxR >= 4 && n_out / 4 >= want_blocks) return go(std::integral_constant<int, (kMaxR >= 4 ? 4 : kMaxR)>{});
  if (kMaxR >= 2 && n_out / 2 >= want_blocks) return go(std::integral_constant<int, 2>{});
  return go(std::integral_constant<int, 1>{});
}

template <class TO>
Status launch_tokens(const LinearArgs& a, int sm_count, cudaStream_t stream) {
  switch (a.x.rows()) {
    case 1: return launch_rows<1, TO>(a, nullptr, sm_count, stream);
    case 2: return launch_rows<2, TO>(a, nullptr, sm_count, stream);
    case 3: return launch_rows<3, TO>(a, nullptr, sm_count, stream);
    case 4: return launch_rows<4, TO>(a, nullptr, sm_count, stream);
    case 5: return launch_rows<5, TO>(a, nullptr, sm_count, stream);
    case 6: return launch_rows<6, TO>(a, nullptr, sm_count, stream);
    case 7: return launch_rows<7, TO>(a, nullptr, sm_count, stream);
    case 8: return launch_rows<8, TO>(a, nullptr, sm_count, stream);
    case 9: return launch_rows<9, TO>(a, nullptr, sm_count, stream);
    default: break;
  }
  return internal_error(strfmt("cuda gemv: %lld rows", static_cast<long long>(a.x.rows())));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool gemv_eligible(const LinearArgs& a) {
  const int64_t rows = a.x.rows();
  return a.w.dtype == DType::kBF16 && a.x.dtype == DType::kBF16 &&
         (a.out.dtype == DType::kBF16 || a.out.dtype == DType::kF32) && rows >= 1 && rows <= kMaxTokens &&
         a.w.dim(0) > 0 && a.w.dim(1) >= 8 && a.w.dim(1) % 8 == 0 && aligned16(a.w.data) && aligned16(a.x.data);
}

Status launch_gemv(const LinearArgs& a, int sm_count, cudaStream_t stream) {
  if (!gemv_eligible(a)) return internal_error("cuda gemv: arguments it does not take");
  return a.out.dtype == DType::kBF16 ? launch_tokens<bf16>(a, sm_count, stream)
                                     : launch_tokens<float>(a, sm_count, stream);
}

bool geglu_gemv_eligible(const GegluArgs& a) {
  const LinearArgs g{.out = a.out, .x = a.x, .w = a.w_gate};
  return a.x.rows() <= kMaxGegluTokens && a.out.dtype == a.x.dtype && gemv_eligible(g) &&
         a.w_up.dtype == DType::kBF16 && a.w_up.ndim == 2 && a.w_up.shape[0] == a.w_gate.shape[0] &&
         a.w_up.shape[1] == a.w_gate.shape[1] && aligned16(a.w_up.data);
}

Status launch_geglu_gemv(const GegluArgs& a, int sm_count, cudaStream_t stream) {
  if (!geglu_gemv_eligible(a)) return internal_error("cuda geglu gemv: arguments it does not take");
  const LinearArgs g{.out = a.out, .x = a.x, .w = a.w_gate};
  return a.x.rows() == 1 ? launch_rows<1, bf16, 2>(g, a.w_up.data, sm_count, stream)
                         : launch_rows<2, bf16, 2>(g, a.w_up.data, sm_count, stream);
}

}  // namespace tandem::cuda
