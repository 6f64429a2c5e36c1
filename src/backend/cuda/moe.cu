// Mixture-of-experts on the GPU (spec §1.10, ops.h MoeRouteArgs / MoeExpertsArgs). moe_route: one warp per token,
// f32 softmax over all experts, top-k by repeated warp argmax (ties to the lower expert), renormalised and scaled by
// per_expert_scale. moe_experts, the simple version: kernel 1 computes h = gelu_tanh(G_e x) * (U_e x) for every
// (token, selected expert) pair into the stream's workspace, one warp per row of G_e/U_e; kernel 2 computes each
// output row as sum_j w_j (D_e h_j) with the experts of a token added in increasing index (as HF and the CPU), one
// warp per output element, accumulated in f32 and rounded once. Issue 7's grouped-GEMM version will instead gather
// the tokens of each expert and run [n_sel, d_model] x [2 d_ff, d_model]^T tensor-core GEMMs, so each expert's
// weights are read once per forward (here they are re-read for every token that selected them, from L2 at best).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kMaxTopK = 32;          // largest k the kernels take (Gemma 4 26B-A4B uses 8)
constexpr int kRouteWarps = 4;        // tokens per routing block
constexpr int kExpertWarps = 8;       // warps per expert block
constexpr int64_t kRowsPerBlock = 32; // rows of G_e/U_e (kernel 1) or outputs (kernel 2) per block

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Whether expert (v, i) ranks before (bv, bi): larger logit first, equal logits by lower index; i < 0 = none.
__device__ __forceinline__ bool ranks_before(float v, int i, float bv, int bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

// One warp per token. The j-th pick is the best expert ranking after the (j-1)-th, so nothing needs marking.
template <class TL>
__global__ void moe_route_kernel(int32_t* idx, float* weights, const TL* logits, const void* pes, DType pes_dtype,
                                 int64_t n_tok, int n_exp, int k) {
  const int lane = threadIdx.x % kWarp;
  const int64_t t = blockIdx.x * static_cast<int64_t>(kRouteWarps) + threadIdx.x / kWarp;
  if (t >= n_tok) return;  // the whole warp leaves together
  const TL* lr = logits + t * n_exp;
  float mx = -INFINITY;
  for (int e = lane; e < n_exp; e += kWarp) mx = fmaxf(mx, to_f32(lr[e]));
  mx = warp_max(mx);
  float total = 0.f;
  for (int e = lane; e < n_exp; e += kWarp) total += expf(to_f32(lr[e]) - mx);
  total = warp_sum(total);

  float prev_v = 0.f, sel_sum = 0.f;
  int prev_i = -1, picked = 0;
  int32_t* ir = idx + t * k;
  float* wr = weights + t * k;
  for (int j = 0; j < k; ++j) {
    float best_v = 0.f;
    int best_i = -1;
    for (int e = lane; e < n_exp; e += kWarp) {
      const float v = to_f32(lr[e]);
      if ((prev_i < 0 || ranks_before(prev_v, prev_i, v, e)) && ranks_before(v, e, best_v, best_i)) {
        best_v = v;
        best_i = e;
      }
    }
#pragma unroll
    for (int off = kWarp / 2; off > 0; off /= 2) {
      const float v = __shfl_xor_sync(0xffffffffu, best_v, off);
      const int i = __shfl_xor_sync(0xffffffffu, best_i, off);
      if (ranks_before(v, i, best_v, best_i)) {
        best_v = v;
        best_i = i;
      }
    }
    if (best_i < 0) break;  // only NaN logits leave nothing to pick; the rows are finished below
    const float prob = expf(best_v - mx) / total;  // softmax over all experts, f32
    sel_sum += prob;
    if (lane == 0) {
      ir[j] = best_i;
      wr[j] = prob;
    }
    prev_v = best_v;
    prev_i = best_i;
    ++picked;
  }
  if (lane != 0) return;
  for (int j = 0; j < k; ++j) {
    if (j >= picked) {  // NaN logits: a valid index with a NaN weight shows the bug downstream
      ir[j] = 0;
      wr[j] = __int_as_float(0x7fc00000);
    } else {
      wr[j] = wr[j] / sel_sum * load_f32(pes, pes_dtype, ir[j]);  // renormalise, then per-expert scale
    }
  }
}

// sum_i w[i] x[i] over one row, by a whole warp (every lane gets the sum). With `vec` (bf16 w, n % 8 == 0, w
// 16-byte aligned) each lane reads 8 weights at once.
template <class TW, class TX>
__device__ __forceinline__ float warp_dot(const TW* w, const TX* x, int64_t n, bool vec) {
  const int lane = threadIdx.x % kWarp;
  float s = 0.f;
  if constexpr (sizeof(TW) == 2) {
    if (vec) {
      for (int64_t i = lane * 8; i < n; i += 8 * kWarp) {
        const uint4 raw = *reinterpret_cast<const uint4*>(w + i);
        const TW* e = reinterpret_cast<const TW*>(&raw);
#pragma unroll
        for (int c = 0; c < 8; ++c) s += to_f32(e[c]) * to_f32(x[i + c]);
      }
      return warp_sum(s);
    }
  }
  for (int64_t i = lane; i < n; i += kWarp) s += to_f32(w[i]) * to_f32(x[i]);
  return warp_sum(s);
}

__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  return 0.5f * x * (1.f + tanhf(kBeta * (x + kKappa * (x * x * x))));
}

struct ExpertShape {
  int64_t n_exp, d_model, d_ff, k;
  int64_t pair0;   // first (token, slot) pair of this chunk: pair = t * k + j
  DType act;       // the activation dtype: gate, up and h are rounded to it as HF's bf16 tensors are
  bool vec_gu, vec_down;
};

// Block (pair0 + blockIdx.x, row block blockIdx.y): h[pair, f] for f in the block's rows.
template <class TW, class TX>
__global__ void __launch_bounds__(kExpertWarps * kWarp)
    moe_gate_up_kernel(float* h, const TX* x, const TW* gate_up, const int32_t* idx, ExpertShape s) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t pair = s.pair0 + blockIdx.x, t = pair / s.k;
  const int64_t e = idx[pair];
  float* hr = h + static_cast<int64_t>(blockIdx.x) * s.d_ff;
  const int64_t f0 = blockIdx.y * kRowsPerBlock, f1 = min(s.d_ff, f0 + kRowsPerBlock);
  if (e < 0 || e >= s.n_exp) {  // the caller validated the indices; this only keeps a bug from reading wild memory
    for (int64_t f = f0 + threadIdx.x; f < f1; f += blockDim.x) hr[f] = __int_as_float(0x7fc00000);
    return;
  }
  const TX* xr = x + t * s.d_model;
  const TW* g_rows = gate_up + e * 2 * s.d_ff * s.d_model;
  const TW* u_rows = g_rows + s.d_ff * s.d_model;
  for (int64_t f = f0 + warp; f < f1; f += kExpertWarps) {
    const float g = round_to(s.act, warp_dot(g_rows + f * s.d_model, xr, s.d_model, s.vec_gu));
    const float u = round_to(s.act, warp_dot(u_rows + f * s.d_model, xr, s.d_model, s.vec_gu));
    if (lane == 0) hr[f] = round_to(s.act, round_to(s.act, gelu_tanh(g)) * u);
  }
}

// Block (token pair0 / k + blockIdx.x, output block blockIdx.y): out[t, o] = sum_j w_j D_e[o] . h_j, the token's
// experts taken in increasing index (ties, which a router never produces, by slot).
template <class TW, class TO>
__global__ void __launch_bounds__(kExpertWarps * kWarp)
    moe_down_kernel(TO* out, const float* h, const TW* down, const int32_t* idx, const float* weights, ExpertShape s) {
  __shared__ int order[kMaxTopK];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t t = s.pair0 / s.k + blockIdx.x;
  const int32_t* it = idx + t * s.k;
  if (threadIdx.x == 0) {
    for (int j = 0; j < s.k; ++j) order[j] = j;
    for (int a = 1; a < s.k; ++a)  // insertion sort by (expert, slot): stable, k is small
      for (int b = a; b > 0 && it[order[b - 1]] > it[order[b]]; --b) {
        const int tmp = order[b];
        order[b] = order[b - 1];
        order[b - 1] = tmp;
      }
  }
  __syncthreads();
  const int64_t o0 = blockIdx.y * kRowsPerBlock, o1 = min(s.d_model, o0 + kRowsPerBlock);
  for (int64_t o = o0 + warp; o < o1; o += kExpertWarps) {
    float acc = 0.f;
    for (int r = 0; r < s.k; ++r) {
      const int j = order[r];
      const int64_t e = it[j];
      if (e < 0 || e >= s.n_exp) {
        acc = __int_as_float(0x7fc00000);
        break;
      }
      const float* hj = h + (t * s.k + j - s.pair0) * s.d_ff;
      const float y = warp_dot(down + (e * s.d_model + o) * s.d_ff, hj, s.d_ff, s.vec_down);
      acc += weights[t * s.k + j] * y;
    }
    if (lane == 0) out[t * s.d_model + o] = from_f32<TO>(acc);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <class TW, class TX>
Status experts_typed(const MoeExpertsArgs& a, const Scratch& scratch, cudaStream_t stream) {
  ExpertShape s{};
  s.n_exp = a.gate_up.shape[0];
  s.d_ff = a.gate_up.shape[1] / 2;
  s.d_model = a.gate_up.shape[2];
  s.k = a.idx.dim(-1);
  s.act = a.out.dtype;
  s.vec_gu = sizeof(TW) == 2 && s.d_model % 8 == 0 && aligned16(a.gate_up.data);
  s.vec_down = sizeof(TW) == 2 && s.d_ff % 8 == 0 && aligned16(a.down.data);
  const int64_t n_tok = a.x.rows();
  if (n_tok == 0 || s.d_model == 0) return ok_status();
  // Tokens per chunk: as many as the workspace holds h for (always at least one for any real shape).
  const int64_t h_bytes_per_token = s.k * s.d_ff * static_cast<int64_t>(sizeof(float));
  const int64_t chunk = std::min<int64_t>(n_tok, static_cast<int64_t>(scratch.bytes) / std::max<int64_t>(h_bytes_per_token, 1));
  if (chunk < 1 || scratch.data == nullptr)
    return unsupported(strfmt("cuda moe_experts: k %lld x d_ff %lld needs more than the %zu-byte workspace",
                              static_cast<long long>(s.k), static_cast<long long>(s.d_ff), scratch.bytes));
  auto* h = static_cast<float*>(scratch.data);
  const auto* x = static_cast<const TX*>(a.x.data);
  const auto* gate_up = static_cast<const TW*>(a.gate_up.data);
  const auto* down = static_cast<const TW*>(a.down.data);
  const auto* idx = static_cast<const int32_t*>(a.idx.data);
  const auto* w = static_cast<const float*>(a.weights.data);
  const unsigned ff_blocks = static_cast<unsigned>(std::max<int64_t>(1, (s.d_ff + kRowsPerBlock - 1) / kRowsPerBlock));
  const unsigned out_blocks = static_cast<unsigned>((s.d_model + kRowsPerBlock - 1) / kRowsPerBlock);
  for (int64_t t0 = 0; t0 < n_tok; t0 += chunk) {
    const int64_t nt = std::min(chunk, n_tok - t0);
    s.pair0 = t0 * s.k;
    if (s.d_ff > 0) {
      moe_gate_up_kernel<TW, TX><<<dim3(static_cast<unsigned>(nt * s.k), ff_blocks), kExpertWarps * kWarp, 0, stream>>>(
          h, x, gate_up, idx, s);
      TANDEM_CUDA_TRY_LAUNCH();
    }
    moe_down_kernel<TW, TX><<<dim3(static_cast<unsigned>(nt), out_blocks), kExpertWarps * kWarp, 0, stream>>>(
        static_cast<TX*>(a.out.data), h, down, idx, w, s);
    TANDEM_CUDA_TRY_LAUNCH();
  }
  return ok_status();
}

bool bf16_or_f32(DType t) { return t == DType::kBF16 || t == DType::kF32; }

}  // namespace

Status launch_moe_route(const MoeRouteArgs& a, cudaStream_t stream) {
  if (!bf16_or_f32(a.logits.dtype))
    return unsupported(strfmt("cuda moe_route: logits dtype %s (bf16/f32 only)", dtype_name(a.logits.dtype)));
  const DType pt = a.per_expert_scale.dtype;
  if (pt != DType::kBF16 && pt != DType::kF32 && pt != DType::kF16)
    return unsupported(strfmt("cuda moe_route: per_expert_scale dtype %s", dtype_name(pt)));
  if (a.weights.dtype != DType::kF32)
    return unsupported(strfmt("cuda moe_route: weights dtype %s (f32 only)", dtype_name(a.weights.dtype)));
  const int64_t n_tok = a.logits.rows(), n_exp = a.logits.dim(-1);
  if (n_tok == 0) return ok_status();
  const auto grid = static_cast<unsigned>((n_tok + kRouteWarps - 1) / kRouteWarps);
  auto* idx = static_cast<int32_t*>(a.idx.data);
  auto* w = static_cast<float*>(a.weights.data);
  if (a.logits.dtype == DType::kBF16) {
    moe_route_kernel<<<grid, kRouteWarps * kWarp, 0, stream>>>(idx, w, static_cast<const bf16*>(a.logits.data),
                                                               a.per_expert_scale.data, pt, n_tok,
                                                               static_cast<int>(n_exp), a.k);
  } else {
    moe_route_kernel<<<grid, kRouteWarps * kWarp, 0, stream>>>(idx, w, static_cast<const float*>(a.logits.data),
                                                               a.per_expert_scale.data, pt, n_tok,
                                                               static_cast<int>(n_exp), a.k);
  }
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status launch_moe_experts(const MoeExpertsArgs& a, const Scratch& scratch, cudaStream_t stream) {
  const DType wt = a.gate_up.dtype, xt = a.x.dtype;
  if (!bf16_or_f32(wt) || a.down.dtype != wt)
    return unsupported(strfmt("cuda moe_experts: gate_up %s, down %s (both bf16 or both f32)", dtype_name(wt),
                              dtype_name(a.down.dtype)));
  if (!bf16_or_f32(xt) || a.out.dtype != xt)
    return unsupported(strfmt("cuda moe_experts: x %s, out %s (both bf16 or both f32)", dtype_name(xt),
                              dtype_name(a.out.dtype)));
  if (a.weights.dtype != DType::kF32)
    return unsupported(strfmt("cuda moe_experts: weights dtype %s (f32 only)", dtype_name(a.weights.dtype)));
  if (a.idx.dim(-1) > kMaxTopK)
    return unsupported(strfmt("cuda moe_experts: top-k %lld (at most %d)", static_cast<long long>(a.idx.dim(-1)),
                              kMaxTopK));
  if (wt == DType::kBF16)
    return xt == DType::kBF16 ? experts_typed<bf16, bf16>(a, scratch, stream) : experts_typed<bf16, float>(a, scratch, stream);
  return xt == DType::kBF16 ? experts_typed<float, bf16>(a, scratch, stream) : experts_typed<float, float>(a, scratch, stream);
}

}  // namespace tandem::cuda
