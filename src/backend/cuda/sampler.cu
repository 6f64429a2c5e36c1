// Sampling on the GPU (ops.h SampleArgs, RejectDraftsArgs): the processed distribution (temperature, top-k,
// top-p, min-p) and a draw from it, and the speculative rejection rule, with no host round trip.
//
// sample: one cluster of kBlocks thread blocks per logits row. Each block stages its contiguous slice of the row
// in shared memory (so the vocabulary is read from global memory once) and the blocks combine their partial
// results through distributed shared memory:
//   1. the row maximum m;
//   2. top-k: the k-th largest logit by a radix select over order-preserving keys (4 rounds of 8 bits; each round
//      a 256-bin histogram per block, summed over the cluster); every logit >= it stays (ties stay, as on the CPU);
//   3. e_i = exp((x_i - m) / T), the kept weights, and their total W;
//   4. top-p: the same radix select over the bits of e (monotone for e >= 0) weighted by mass finds the smallest
//      weight v whose tokens, with all heavier ones, hold >= top_p * W; tokens of weight >= v stay (ties stay);
//   5. min-p: tokens with e < min_p (= p < min_p * p_max) go; the final total W2;
//   6. the draw: the first id whose cumulative weight exceeds u * W2, u = uniform_at(seed, counter + row).
// Weights are summed as 44-bit fixed-point integers (round(e * 2^44)), so every sum is exact and independent of
// the order of the atomics: the selection and the draw are deterministic, and a token's probability is exactly
// its fixed-point weight over the total (weights below 2^-45 of the maximum count as zero).
//
// reject_drafts: one block per row; the acceptance test reads p and q at the draft, and a rejected row draws from
// max(0, p - q) by the same fixed-point inverse CDF.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "core/strings.h"
#include "sample/counter_rng.h"

namespace tandem::cuda {
namespace {

namespace cg = cooperative_groups;
using u64 = unsigned long long;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / kWarp;
constexpr int kBlocks = 8;                  // blocks per cluster (one row)
constexpr int kMaxSlice = 40960;            // floats staged per block: 160 KiB of shared memory
constexpr float kFixed = 17592186044416.f;  // 2^44: e in [0, 1] -> an integer weight, sums of 2^18 fit in 63 bits

__device__ __forceinline__ u64 fixed_weight(float e) { return __float2ull_rn(e * kFixed); }

// Larger float -> larger key; NaN (mapped to -inf before) never occurs.
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Block-wide sum; every thread gets it.
__device__ u64 block_sum_u64(u64 v) {
  __shared__ u64 part[kWarps];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = warp_sum(lane < kWarps ? part[lane] : u64{0});
  __syncthreads();
  return v;
}

__device__ float block_max(float v) {
  __shared__ float part[kWarps];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = warp_max(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = warp_max(lane < kWarps ? part[lane] : -INFINITY);
  __syncthreads();
  return v;
}

// The index (within [0, n)) of the first item whose inclusive cumulative weight exceeds r, for r < the block's
// total weight. Warp w owns a contiguous range; the warp holding the crossing walks its range 32 items at a time.
template <class WeightAt>
__device__ int block_find(int n, u64 r, WeightAt weight_at) {
  __shared__ u64 warp_total[kWarps];
  __shared__ int s_found;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int span = (n + kWarps - 1) / kWarps, begin = min(n, warp * span), end = min(n, begin + span);
  u64 t = 0;
  for (int i = begin + lane; i < end; i += kWarp) t += weight_at(i);
  t = warp_sum(t);
  if (lane == 0) warp_total[warp] = t;
  if (threadIdx.x == 0) s_found = n - 1;  // unreachable for r < total; keeps the result in range regardless
  __syncthreads();
  u64 before = 0;  // weight of the warps before this one
  for (int w = 0; w < warp; ++w) before += warp_total[w];
  if (r >= before && r < before + warp_total[warp]) {  // exactly one warp
    u64 acc = before;
    for (int base = begin; base < end; base += kWarp) {
      const int i = base + lane;
      const u64 incl = warp_inclusive_scan(i < end ? weight_at(i) : u64{0});
      const unsigned hit = __ballot_sync(0xffffffffu, acc + incl > r);
      if (hit) {
        if (lane == __ffs(hit) - 1) s_found = i;
        break;
      }
      acc += __shfl_sync(0xffffffffu, incl, kWarp - 1);
    }
  }
  __syncthreads();
  return s_found;
}

// Shared memory the other blocks of the cluster read. Two copies of everything, used alternately: exchange j
// writes copy j % 2, which nobody reads any more, because every block passed exchange j - 1's cluster barrier
// after reading exchange j - 2.
struct Exchange {
  u64 hist[2][256];
  u64 value[2];
};

struct Selection {
  uint32_t bin;
  u64 above;  // weight of the candidates in higher bins
};

template <class T>
struct SampleKernelArgs {
  const T* x;
  int64_t n;
  float* probs;
  int32_t* out;
  float inv_t, top_p, min_p;
  int top_k;
  uint64_t seed, counter;
};

class ClusterRow {
 public:
  __device__ ClusterRow(Exchange* xs) : cl_(cg::this_cluster()), xs_(xs) {}

  // Each block's value (`mine`: the same in every thread, e.g. a block reduction), published to the cluster; returns
  // every block's value in rank order (in shared memory).
  __device__ const u64* all_values(u64 mine) {
    __shared__ u64 ranks[kBlocks];
    const int par = parity();
    if (threadIdx.x == 0) xs_->value[par] = mine;
    cl_.sync();
    if (threadIdx.x < kBlocks) ranks[threadIdx.x] = *cl_.map_shared_rank(&xs_->value[par], threadIdx.x);
    __syncthreads();
    return ranks;
  }
  __device__ u64 sum(u64 mine) {
    const u64* v = all_values(mine);
    u64 s = 0;
    for (int r = 0; r < kBlocks; ++r) s += v[r];
    __syncthreads();  // v is reused by the next exchange
    return s;
  }
  __device__ float max(float mine) {
    const u64* v = all_values(__float_as_uint(mine));
    float m = -INFINITY;
    for (int r = 0; r < kBlocks; ++r) m = fmaxf(m, __uint_as_float(static_cast<uint32_t>(v[r])));
    __syncthreads();
    return m;
  }

  // Radix select: the largest key K such that the candidates with key >= K weigh >= need (1 <= need <= the total
  // weight of all candidates). key_at(i) / weight_at(i) over the block's n items; 4 rounds of 8 bits.
  template <class KeyAt, class WeightAt>
  __device__ uint32_t select(int n, u64 need, KeyAt key_at, WeightAt weight_at) {
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
      const Selection s = round(n, need, prefix, mask, shift, key_at, weight_at);
      prefix |= s.bin << shift;
      mask |= 0xffu << shift;
      need -= s.above;
    }
    return prefix;
  }
  __device__ void finish() { cl_.sync(); }  // no block leaves while another may still read its shared memory

 private:
  __device__ int parity() { return flip_++ & 1; }

  template <class KeyAt, class WeightAt>
  __device__ Selection round(int n, u64 need, uint32_t prefix, uint32_t mask, int shift, KeyAt key_at,
                             WeightAt weight_at) {
    __shared__ u64 total[256];
    __shared__ Selection s_sel;
    const int par = parity();
    u64* hist = xs_->hist[par];
    for (int b = threadIdx.x; b < 256; b += kThreads) hist[b] = 0;
    __syncthreads();
    // Warp-aggregated: the lanes that fall in one bin add their weights (exactly, in two 22-bit halves) and one of
    // them updates the shared histogram.
    const int lane = threadIdx.x % kWarp;
    for (int base = 0; base < n; base += kThreads) {
      const int i = base + static_cast<int>(threadIdx.x);
      uint32_t bin = 256;
      u64 w = 0;
      if (i < n) {
        const uint32_t k = key_at(i);
        if ((k & mask) == prefix) {
          w = weight_at(i);
          bin = w ? (k >> shift) & 0xffu : 256;
        }
      }
      const unsigned same = __match_any_sync(0xffffffffu, bin);
      const unsigned lo = __reduce_add_sync(same, static_cast<unsigned>(w & 0x3fffffu));
      const unsigned hi = __reduce_add_sync(same, static_cast<unsigned>(w >> 22));
      if (bin < 256 && lane == __ffs(same) - 1) atomicAdd(&hist[bin], (static_cast<u64>(hi) << 22) + lo);
    }
    __syncthreads();
    cl_.sync();
    if (threadIdx.x < 256) {
      u64 t = 0;
      for (int r = 0; r < kBlocks; ++r) t += cl_.map_shared_rank(hist, r)[threadIdx.x];
      total[threadIdx.x] = t;
    }
    __syncthreads();
    if (threadIdx.x < kWarp) {  // lane l holds bins 255 - 8l .. 248 - 8l (descending)
      u64 mine = 0;
      for (int j = 0; j < 8; ++j) mine += total[255 - 8 * lane - j];
      const u64 incl = warp_inclusive_scan(mine);
      const u64 excl = incl - mine;
      const unsigned hit = __ballot_sync(0xffffffffu, excl < need && need <= incl);
      const int owner = hit ? __ffs(hit) - 1 : kWarp - 1;  // need <= the total: always hit
      if (lane == owner) {
        u64 acc = excl;
        int j = 0;
        for (; j < 7; ++j) {
          const u64 b = total[255 - 8 * lane - j];
          if (acc + b >= need) break;
          acc += b;
        }
        s_sel = {static_cast<uint32_t>(255 - 8 * lane - j), acc};
      }
    }
    __syncthreads();
    return s_sel;
  }

  cg::cluster_group cl_;
  Exchange* xs_;
  int flip_ = 0;
};

template <class T>
__global__ void __launch_bounds__(kThreads) sample_kernel(SampleKernelArgs<T> a) {
  extern __shared__ float e[];  // this block's slice: logits, then weights
  __shared__ Exchange xs;
  pdl_enter();
  ClusterRow cr(&xs);
  const int rank = static_cast<int>(blockIdx.x);
  const int64_t row = blockIdx.y;
  const int64_t slice = (a.n + kBlocks - 1) / kBlocks, lo = rank * slice;
  const int64_t rest = a.n - lo;
  const int n = static_cast<int>(rest <= 0 ? 0 : (rest < slice ? rest : slice));
  const T* x = a.x + row * a.n + lo;

  // 1. stage the slice; the row maximum.
  float m = -INFINITY;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    float v = to_f32(x[i]);
    if (isnan(v)) v = -INFINITY;
    e[i] = v;
    m = fmaxf(m, v);
  }
  m = cr.max(block_max(m));  // (block_max synchronizes the block after the staging)

  // 2. top-k: the k-th largest logit; every logit >= it stays.
  uint32_t kth = 0;
  if (a.top_k > 0 && a.top_k < a.n) {
    kth = cr.select(
        n, static_cast<u64>(a.top_k), [&](int i) { return order_key(e[i]); }, [](int) { return u64{1}; });
  }
  // 3. weights relative to the maximum (the maximum itself weighs exactly 1, also when every logit is -inf).
  u64 local = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float v = e[i];
    const float w = order_key(v) < kth ? 0.f : (v == m ? 1.f : expf((v - m) * a.inv_t));
    e[i] = w;
    local += fixed_weight(w);
  }
  const u64 total = cr.sum(block_sum_u64(local));  // (block_sum_u64 synchronizes the block after the writes)

  // 4. top-p: the lightest weight whose tokens, with every heavier one, hold >= top_p of the mass.
  uint32_t floor_key = 0;  // keep tokens whose weight's bits are >= floor_key (e >= 0: bits are monotone)
  if (a.top_p < 1.f) {
    const double want = ceil(static_cast<double>(a.top_p) * static_cast<double>(total));
    const u64 need = want < 1.0 ? 1 : (want >= static_cast<double>(total) ? total : static_cast<u64>(want));
    floor_key = cr.select(
        n, need, [&](int i) { return __float_as_uint(e[i]); }, [&](int i) { return fixed_weight(e[i]); });
  }
  // 5. min-p, and the final weights.
  local = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    float w = e[i];
    if (__float_as_uint(w) < floor_key || w < a.min_p) w = 0.f;
    e[i] = w;
    local += fixed_weight(w);
  }
  const u64 mine = block_sum_u64(local);
  const u64* per_block = cr.all_values(mine);
  u64 kept = 0, before = 0;
  for (int r = 0; r < kBlocks; ++r) {
    if (r < rank) before += per_block[r];
    kept += per_block[r];
  }
  if (a.probs != nullptr) {
    float* p = a.probs + row * a.n + lo;
    const double inv = 1.0 / static_cast<double>(kept);
    for (int i = threadIdx.x; i < n; i += kThreads)
      p[i] = static_cast<float>(static_cast<double>(fixed_weight(e[i])) * inv);
  }
  // 6. the draw.
  const double u = uniform_at(a.seed, a.counter + static_cast<uint64_t>(row));
  u64 r = static_cast<u64>(u * static_cast<double>(kept));
  if (r >= kept) r = kept - 1;
  if (r >= before && r < before + mine) {  // this block holds the crossing (uniform over the block)
    const int i = block_find(n, r - before, [&](int j) { return fixed_weight(e[j]); });
    if (threadIdx.x == 0) a.out[row] = static_cast<int32_t>(lo + i);
  }
  cr.finish();
}

struct RejectKernelArgs {
  const float* p;
  const float* q;
  const int32_t* draft;
  int32_t* accepted;
  int32_t* token;
  int64_t n;
  uint64_t seed, counter;
};

__global__ void __launch_bounds__(kThreads) reject_kernel(RejectKernelArgs a) {
  pdl_enter();
  const int64_t row = blockIdx.x;
  const float* p = a.p + row * a.n;
  const float* q = a.q + row * a.n;
  const int32_t d = a.draft[row];
  const uint64_t c = a.counter + 2 * static_cast<uint64_t>(row);
  const bool in_range = d >= 0 && d < a.n;  // a draft outside the vocabulary has no mass: it is rejected
  const double pd = in_range ? p[d] : 0.0, qd = in_range ? q[d] : 0.0;
  const double accept_prob = qd > 0.0 ? fmin(1.0, pd / qd) : 0.0;
  if (uniform_at(a.seed, c) < accept_prob) {
    if (threadIdx.x == 0) {
      a.accepted[row] = 1;
      a.token[row] = d;
    }
    return;
  }
  const int n = static_cast<int>(a.n);
  auto residual = [&](int i) { return fixed_weight(fmaxf(0.f, p[i] - q[i])); };
  auto target = [&](int i) { return fixed_weight(p[i]); };
  u64 local = 0;
  for (int i = threadIdx.x; i < n; i += kThreads) local += residual(i);
  const u64 mass = block_sum_u64(local);
  const double u = uniform_at(a.seed, c + 1);
  int i = 0;
  if (mass > 0) {
    i = block_find(n, min(static_cast<u64>(u * static_cast<double>(mass)), mass - 1), residual);
  } else {  // p == q, or p is all on the draft: draw from p
    local = 0;
    for (int j = threadIdx.x; j < n; j += kThreads) local += target(j);
    const u64 all = block_sum_u64(local);
    i = block_find(n, min(static_cast<u64>(u * static_cast<double>(all)), all > 0 ? all - 1 : 0), target);
  }
  if (threadIdx.x == 0) {
    a.accepted[row] = 0;
    a.token[row] = i;
  }
}

template <class T>
Status launch_sample_typed(const SampleArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.rows(), n = a.x.dim(-1);
  const int64_t slice = (n + kBlocks - 1) / kBlocks;
  const size_t smem = static_cast<size_t>(slice) * sizeof(float);
  TANDEM_CUDA_TRY(allow_dynamic_smem<sample_kernel<T>>(kMaxSlice * sizeof(float)));  // over the 48 KB default
  SampleKernelArgs<T> k{.x = static_cast<const T*>(a.x.data),
                        .n = n,
                        .probs = a.probs.empty() ? nullptr : static_cast<float*>(a.probs.data),
                        .out = static_cast<int32_t*>(a.out.data),
                        .inv_t = 1.f / a.temperature,
                        .top_p = a.top_p,
                        .min_p = a.min_p,
                        .top_k = a.top_k,
                        .seed = a.seed,
                        .counter = a.counter};
  TANDEM_CUDA_TRY(launch_clusters(sample_kernel<T>, dim3(kBlocks, static_cast<unsigned>(rows)), dim3(kThreads), smem,
                                  stream, kBlocks, k));
  return ok_status();
}

}  // namespace

Status launch_sample(const SampleArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.rows(), n = a.x.dim(-1);
  if (rows == 0) return ok_status();
  if (n > static_cast<int64_t>(kBlocks) * kMaxSlice)
    return unsupported(
        strfmt("cuda sample: a vocabulary of %lld (at most %d)", static_cast<long long>(n), kBlocks * kMaxSlice));
  if (rows > 65535) return unsupported(strfmt("cuda sample: %lld rows (at most 65535)", static_cast<long long>(rows)));
  if (a.x.dtype == DType::kBF16) return launch_sample_typed<__nv_bfloat16>(a, stream);
  if (a.x.dtype == DType::kF32) return launch_sample_typed<float>(a, stream);
  return unsupported(strfmt("cuda sample: x dtype %s (f32/bf16 only)", dtype_name(a.x.dtype)));
}

Status launch_reject_drafts(const RejectDraftsArgs& a, cudaStream_t stream) {
  const int64_t rows = a.p.rows(), n = a.p.dim(-1);
  if (rows == 0) return ok_status();
  if (n > INT32_MAX) return unsupported("cuda reject_drafts: vocabulary too large");
  RejectKernelArgs k{.p = static_cast<const float*>(a.p.data),
                     .q = static_cast<const float*>(a.q.data),
                     .draft = static_cast<const int32_t*>(a.draft.data),
                     .accepted = static_cast<int32_t*>(a.accepted.data),
                     .token = static_cast<int32_t*>(a.token.data),
                     .n = n,
                     .seed = a.seed,
                     .counter = a.counter};
  launch_kernel(reject_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, k);
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace tandem::cuda
