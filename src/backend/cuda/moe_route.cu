// MoE routing on the GPU (spec §1.10, ops.h MoeRouteArgs): one warp per token, f32 softmax over all experts, top-k
// by repeated warp argmax (ties to the lower expert), renormalised and scaled by per_expert_scale.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_common.h"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kRouteWarps = 4;  // tokens per routing block

// Whether expert (v, i) ranks before (bv, bi): larger logit first, equal logits by lower index; i < 0 = none.
__device__ __forceinline__ bool ranks_before(float v, int i, float bv, int bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

// bf16 logit bits and expert e as one 32-bit key whose unsigned order is the ranking: larger logit first, equal
// logits by lower index (-0 counts as +0, as the float comparison has them equal). Every key is > 0.
__device__ __forceinline__ uint32_t rank_key(uint16_t bits, int e) {
  if (bits == 0x8000u) bits = 0;
  const uint32_t ordered = (bits & 0x8000u) ? (~bits & 0xffffu) : (bits | 0x8000u);
  return ordered << 16 | (0xffffu - static_cast<uint32_t>(e));
}

// The logit of a rank_key, as a float.
__device__ __forceinline__ float key_logit(uint32_t key) {
  const uint32_t ordered = key >> 16;
  const auto bits = static_cast<uint16_t>((ordered & 0x8000u) ? (ordered & 0x7fffu) : (~ordered & 0xffffu));
  return __bfloat162float(__ushort_as_bfloat16(bits));
}

// One warp per token. The token's logits are read once into registers (lane l holds experts l, l + 32, ...; at most
// kMaxExperts). bf16 logits: each pick is one warp max-reduction (redux.sync) over every lane's best remaining key,
// and the owner clears the picked key. f32 logits: the j-th pick is the best expert ranking after the (j-1)-th, by
// shuffles. The max and the softmax denominator add the same values in the same order for every PER_LANE.
// One token's routing by the calling warp: logits lr [n_exp] (global or shared memory) -> ir [k], wr [k].
template <class TL, int PER_LANE>
__device__ __forceinline__ void route_row(int32_t* ir, float* wr, const TL* lr, const void* pes, DType pes_dtype,
                                          int n_exp, int k) {
  const int lane = threadIdx.x % kWarp;
  float lv[PER_LANE];
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    const int e = lane + i * kWarp;
    lv[i] = e < n_exp ? to_f32(lr[e]) : 0.f;
  }
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i)
    if (lane + i * kWarp < n_exp) mx = fmaxf(mx, lv[i]);
  mx = warp_max(mx);
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i)
    if (lane + i * kWarp < n_exp) total += expf(lv[i] - mx);
  total = warp_sum(total);

  // Pick j is kept in lane j's registers (k <= 32), so the epilogue below reads every per-expert scale at once
  // instead of one dependent global round trip after another.
  float sel_sum = 0.f, my_prob = 0.f;
  int picked = 0, my_i = -1;
  auto take = [&](int j, int e, float logit) {    // the j-th pick: expert e
    const float prob = expf(logit - mx) / total;  // softmax over all experts, f32
    sel_sum += prob;
    if (lane == j) {
      my_i = e;
      my_prob = prob;
    }
    ++picked;
  };
  if constexpr (std::is_same_v<TL, bf16>) {
    uint32_t key[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      const int e = lane + i * kWarp;
      key[i] = e < n_exp ? rank_key(__bfloat16_as_ushort(lr[e]), e) : 0u;
    }
    for (int j = 0; j < k; ++j) {
      uint32_t mine = 0;
#pragma unroll
      for (int i = 0; i < PER_LANE; ++i) mine = max(mine, key[i]);
      const uint32_t best = __reduce_max_sync(0xffffffffu, mine);
      if (best == 0) break;  // k > n_exp: nothing left (the rows are finished below)
      const int best_i = static_cast<int>(0xffffu - (best & 0xffffu));
      if (best_i % kWarp == lane) {
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i)
          if (i == best_i / kWarp) key[i] = 0;
      }
      take(j, best_i, key_logit(best));
    }
  } else {
    float prev_v = 0.f;
    int prev_i = -1;
    for (int j = 0; j < k; ++j) {
      float best_v = 0.f;
      int best_i = -1;
#pragma unroll
      for (int i = 0; i < PER_LANE; ++i) {
        const int e = lane + i * kWarp;
        const float v = lv[i];
        if (e < n_exp && (prev_i < 0 || ranks_before(prev_v, prev_i, v, e)) && ranks_before(v, e, best_v, best_i)) {
          best_v = v;
          best_i = e;
        }
      }
      warp_arg_best(best_v, best_i, ranks_before);
      if (best_i < 0) break;  // only NaN logits leave nothing to pick; the rows are finished below
      take(j, best_i, best_v);
      prev_v = best_v;
      prev_i = best_i;
    }
  }
  if (lane >= k) return;
  if (lane >= picked) {  // NaN logits: a valid index with a NaN weight shows the bug downstream
    ir[lane] = 0;
    wr[lane] = __int_as_float(0x7fc00000);
  } else {
    ir[lane] = my_i;
    wr[lane] = my_prob / sel_sum * load_f32(pes, pes_dtype, my_i);  // renormalise, then per-expert scale
  }
}

template <class TL, int PER_LANE>
__global__ void moe_route_kernel(int32_t* idx, float* weights, const TL* logits, const void* pes, DType pes_dtype,
                                 int64_t n_tok, int n_exp, int k) {
  pdl_enter();
  const int64_t t = blockIdx.x * static_cast<int64_t>(kRouteWarps) + threadIdx.x / kWarp;
  if (t >= n_tok) return;  // the whole warp leaves together
  route_row<TL, PER_LANE>(idx + t * k, weights + t * k, logits + t * n_exp, pes, pes_dtype, n_exp, k);
}

}  // namespace

Status launch_moe_route(const MoeRouteArgs& a, cudaStream_t stream) {
  if (!bf16_or_f32(a.logits.dtype))
    return unsupported(strfmt("cuda moe_route: logits dtype %s (bf16/f32 only)", dtype_name(a.logits.dtype)));
  const DType pt = a.per_expert_scale.dtype;
  if (pt != DType::kBF16 && pt != DType::kF32 && pt != DType::kF16)
    return unsupported(strfmt("cuda moe_route: per_expert_scale dtype %s", dtype_name(pt)));
  if (a.weights.dtype != DType::kF32)
    return unsupported(strfmt("cuda moe_route: weights dtype %s (f32 only)", dtype_name(a.weights.dtype)));
  if (a.k > kMaxTopK) return unsupported(strfmt("cuda moe_route: k = %d (at most %d)", a.k, kMaxTopK));
  const int64_t n_tok = a.logits.rows(), n_exp = a.logits.dim(-1);
  if (n_exp > kMaxExperts)
    return unsupported(strfmt("cuda moe_route: %lld experts (at most %d)", static_cast<long long>(n_exp), kMaxExperts));
  if (n_tok == 0) return ok_status();
  const auto grid = static_cast<unsigned>((n_tok + kRouteWarps - 1) / kRouteWarps);
  auto* idx = static_cast<int32_t*>(a.idx.data);
  auto* w = static_cast<float*>(a.weights.data);
  auto go = [&](auto logits_tag, auto lanes_tag) {
    using TL = decltype(logits_tag);
    constexpr int kPerLane = decltype(lanes_tag)::value;
    launch_kernel(moe_route_kernel<TL, kPerLane>, grid, kRouteWarps * kWarp, 0, stream, idx, w,
                  static_cast<const TL*>(a.logits.data), a.per_expert_scale.data, pt, n_tok, static_cast<int>(n_exp),
                  a.k);
  };
  // Four logits per lane cover Gemma 4's 128 experts; more take the widest variant.
  using Small = std::integral_constant<int, 4>;
  using Wide = std::integral_constant<int, kMaxExperts / kWarp>;
  const bool small = n_exp <= 4 * kWarp;
  if (a.logits.dtype == DType::kBF16) {
    small ? go(bf16{}, Small{}) : go(bf16{}, Wide{});
  } else {
    small ? go(float{}, Small{}) : go(float{}, Wide{});
  }
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace tandem::cuda
