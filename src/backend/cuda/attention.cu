// Attention on the GPU (ops.h AttentionArgs, spec §1.6): GQA over the layer's K/V storage (full or ring slots),
// causal + sliding-window visibility as one key range per query, f32 math with an online (flash-decoding style)
// softmax, scale 1.0 for Gemma 4. bf16 queries over bf16 K/V (decode, verify, drafter, prompt chunks) go to the
// tensor-core kernel of attention_decode.cu; everything else (f32, odd head dims) to the general kernel here: one block
// per (token, query head), its warps taking interleaved keys, each keeping a running max / sum / output row, merged
// at the end. Few rows over a long context also split the keys across blocks (split-K): partial states go to the
// stream's workspace and a second kernel merges them. The range end may be read on the device (kv_end).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;               // warps per block, each over its own keys
constexpr int kMaxHeadDim = 512;        // Gemma 4's full-attention head dim
constexpr int64_t kKeysPerSplit = 128;  // fewest keys one split-K block handles (32 per warp)
constexpr int kBlocksPerSm = 8;         // split-K aims at this many blocks per SM, enough to hide load latency

struct AttnParams {
  void* out;                   // [n_tok, n_heads, head_dim]
  const void* q;               // [n_tok, n_heads, head_dim]
  const void* k;               // [n_kv, capacity, head_dim], strides below (elements)
  const void* v;
  int64_t k_stride_head, k_stride_slot, v_stride_head, v_stride_slot;
  const int32_t* q_pos;        // [n_tok]
  const int32_t* kv_end;       // [1] on the device, or null: the range end is `end`
  int64_t n_heads, group, head_dim;
  int64_t begin, end, capacity, window;
  bool ring, causal;
  float scale;
  bool q_pairs, kv_pairs;       // rows allow aligned two-element loads (bf16x2 / float2)
  int n_splits;
  float* partial;              // [rows, n_splits, head_dim + 2] when n_splits > 1: acc[head_dim], max, sum
};

// Visible keys of query position qp: one range [lo, hi) (ops.h: begin <= k < end, k <= qp, k > qp - window).
__device__ __forceinline__ void visible_range(const AttnParams& p, KvRange r, int64_t qp, int64_t* lo, int64_t* hi) {
  int64_t a = r.begin, b = r.end;
  if (p.causal) b = min(b, qp + 1);
  if (p.window > 0) a = max(a, qp - p.window + 1);
  *lo = a;
  *hi = max(a, b);
}

// Elements d and d + 1 of a row as f32 (zero past head_dim); one 4- or 8-byte load when `pairs` says the row
// and the head dim allow it.
template <class T>
__device__ __forceinline__ void load_pair(const T* row, int64_t d, int64_t hd, bool pairs, float& a, float& b) {
  if (pairs && d + 1 < hd) {
    if constexpr (sizeof(T) == 2) {
      const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(row + d);
      a = __low2float(v);
      b = __high2float(v);
    } else {
      const float2 v = *reinterpret_cast<const float2*>(row + d);
      a = v.x;
      b = v.y;
    }
    return;
  }
  a = d < hd ? to_f32(row[d]) : 0.f;
  b = d + 1 < hd ? to_f32(row[d + 1]) : 0.f;
}

// Block (row = t * n_heads + h, split = blockIdx.y). Lane `lane` owns head dims 2*lane + 64*i + {0, 1}, i < NP.
template <class TQ, class TKV, int NP>
__global__ void __launch_bounds__(kWarps * kWarp) attention_kernel(AttnParams p) {
  pdl_enter();
  __shared__ float s_max[kWarps], s_sum[kWarps];
  __shared__ float s_acc[kWarps][kMaxHeadDim];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t row = blockIdx.x, t = row / p.n_heads, h = row % p.n_heads, kvh = h / p.group;
  const int64_t hd = p.head_dim;

  int64_t lo, hi;
  visible_range(p, kv_range(p.kv_end, p.begin, p.end, p.capacity, p.ring), p.q_pos[t], &lo, &hi);
  if (p.n_splits > 1) {  // this block's contiguous share of the visible keys
    const int64_t chunk = (hi - lo + p.n_splits - 1) / p.n_splits;
    lo = min(hi, lo + chunk * blockIdx.y);
    hi = min(hi, lo + chunk);
  }

  // The query row, pre-multiplied by the scale; every warp holds it (read before any write: out may alias q).
  float qr[NP][2];
  const TQ* qrow = static_cast<const TQ*>(p.q) + row * hd;
#pragma unroll
  for (int i = 0; i < NP; ++i) {
    load_pair(qrow, 2 * lane + 64 * i, hd, p.q_pairs, qr[i][0], qr[i][1]);
    qr[i][0] *= p.scale;
    qr[i][1] *= p.scale;
  }

  // Online softmax over this warp's keys: m = running max, l = running sum of exp(s - m), acc = sum exp(s - m) v.
  float m = -INFINITY, l = 0.f, acc[NP][2] = {};
  const TKV* kbase = static_cast<const TKV*>(p.k) + kvh * p.k_stride_head;
  const TKV* vbase = static_cast<const TKV*>(p.v) + kvh * p.v_stride_head;
  for (int64_t key = lo + warp; key < hi; key += kWarps) {
    const int64_t slot = p.ring ? key % p.capacity : key;
    const TKV* krow = kbase + slot * p.k_stride_slot;
    const TKV* vrow = vbase + slot * p.v_stride_slot;
    float kv[NP][2], vv[NP][2];
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      load_pair(krow, 2 * lane + 64 * i, hd, p.kv_pairs, kv[i][0], kv[i][1]);
      load_pair(vrow, 2 * lane + 64 * i, hd, p.kv_pairs, vv[i][0], vv[i][1]);
    }
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NP; ++i) s += qr[i][0] * kv[i][0] + qr[i][1] * kv[i][1];
    s = warp_sum(s);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float e = expf(s - m_new);
    l = l * corr + e;
#pragma unroll
    for (int i = 0; i < NP; ++i)
#pragma unroll
      for (int c = 0; c < 2; ++c) acc[i][c] = acc[i][c] * corr + e * vv[i][c];
    m = m_new;
  }

  // Merge the warps' states: M = max m_w, L = sum l_w exp(m_w - M), A = sum acc_w exp(m_w - M).
  if (lane == 0) {
    s_max[warp] = m;
    s_sum[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < NP; ++i)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int64_t d = 2 * lane + 64 * i + c;
      if (d < hd) s_acc[warp][d] = acc[i][c];
    }
  __syncthreads();
  float mx = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_max[w]);
  float wt[kWarps];
  float sum = 0.f;
  for (int w = 0; w < kWarps; ++w) {
    wt[w] = mx == -INFINITY ? 0.f : expf(s_max[w] - mx);  // a warp without keys has m = -inf: weight 0
    sum += s_sum[w] * wt[w];
  }
  if (p.n_splits == 1) {
    TQ* orow = static_cast<TQ*>(p.out) + row * hd;
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
      float a = 0.f;
      for (int w = 0; w < kWarps; ++w) a += s_acc[w][d] * wt[w];
      orow[d] = from_f32<TQ>(sum > 0.f ? a / sum : 0.f);  // no visible key: a zero row, never 0/0
    }
  } else {
    float* part = p.partial + (row * p.n_splits + blockIdx.y) * (hd + 2);
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
      float a = 0.f;
      for (int w = 0; w < kWarps; ++w) a += s_acc[w][d] * wt[w];
      part[d] = a;
    }
    if (threadIdx.x == 0) {
      part[hd] = mx;
      part[hd + 1] = sum;
    }
  }
}

// Merges the n_splits partial states of row blockIdx.x, head dims [64 blockIdx.y, +64) (same rule as the
// in-block merge) and writes the output. Warp w takes the splits s = w mod kCombineWarps, lane l dims 2l, 2l + 1
// of the slice; the warps' sums are added in warp order. A split that saw no key (max -inf, sum 0, acc 0) has
// weight 0 and adds nothing (past each warp's first few splits its values are not even read), so a launch sized for
// a long context costs little at a short one, and its result is the one a launch with only the non-empty splits
// gives, bit for bit. Every load the first reduction does not decide is issued before it.
constexpr int kCombineWarps = 8, kCombineDims = 64;

template <class TQ>
__global__ void __launch_bounds__(kCombineWarps* kWarp)
    attention_combine_kernel(void* out, const float* partial, int n_splits, int64_t hd) {
  pdl_enter();
  static_assert(kMaxAttnSplits <= kCombineWarps * kWarp, "one split per thread for the maxima");
  __shared__ float s_w[kMaxAttnSplits];
  __shared__ float s_acc[kCombineWarps][kCombineDims];
  __shared__ float s_red[kCombineWarps];
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int64_t row = blockIdx.x, stride = hd + 2;
  const float* part = partial + row * n_splits * stride;
  const int64_t d0 = static_cast<int64_t>(blockIdx.y) * kCombineDims + 2 * lane;
  // Every request before the first reduction: split tid's max and sum, and this lane's two values of the warp's
  // first kEarly splits (used only where their weight is not 0). With an even hd, (max, sum) and the value pairs
  // are 8-byte aligned pairs (stride and d0 even).
  constexpr int kEarly = 4;
  const bool pairs = hd % 2 == 0 && d0 + 1 < hd;
  float ms = -INFINITY, ls = 0.f;
  if (tid < n_splits) {
    if (hd % 2 == 0) {
      const float2 v = *reinterpret_cast<const float2*>(part + tid * stride + hd);
      ms = v.x;
      ls = v.y;
    } else {
      ms = part[tid * stride + hd];
      ls = part[tid * stride + hd + 1];
    }
  }
  float2 early[kEarly];
#pragma unroll
  for (int i = 0; i < kEarly; ++i) {
    const int sp = warp + i * kCombineWarps;
    early[i] = pairs && sp < n_splits ? *reinterpret_cast<const float2*>(part + sp * stride + d0) : float2{0.f, 0.f};
  }
  // The largest max, then the weights.
  float m = ms;
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (lane == 0) s_red[warp] = m;
  __syncthreads();
  float mx = s_red[0];
  for (int w = 1; w < kCombineWarps; ++w) mx = fmaxf(mx, s_red[w]);
  float sum = 0.f;  // sum of l_s w_s: per thread, then the warps' shuffle trees, then the warps in order
  if (tid < n_splits) {
    const float w = mx == -INFINITY || ms == -INFINITY ? 0.f : expf(ms - mx);
    s_w[tid] = w;
    if (w != 0.f) sum += ls * w;
  }
  sum = warp_sum(sum);
  __syncthreads();  // every warp has read s_red (the maxima)
  if (lane == 0) s_red[warp] = sum;
  __syncthreads();
  sum = 0.f;
  for (int w = 0; w < kCombineWarps; ++w) sum += s_red[w];
  float a0 = 0.f, a1 = 0.f;
  for (int s = warp, i = 0; s < n_splits; s += kCombineWarps, ++i) {
    const float w = s_w[s];
    if (w == 0.f) continue;
    const float* src = part + s * stride + d0;
    if (pairs) {
      float2 v;
      if (i < kEarly) {
#pragma unroll
        for (int j = 0; j < kEarly; ++j)
          if (j == i) v = early[j];
      } else {
        v = *reinterpret_cast<const float2*>(src);
      }
      a0 += v.x * w;
      a1 += v.y * w;
    } else {
      if (d0 < hd) a0 += src[0] * w;
      if (d0 + 1 < hd) a1 += src[1] * w;
    }
  }
  s_acc[warp][2 * lane] = a0;
  s_acc[warp][2 * lane + 1] = a1;
  __syncthreads();
  if (tid < kCombineDims && blockIdx.y * kCombineDims + tid < hd) {
    float a = 0.f;
    for (int w = 0; w < kCombineWarps; ++w) a += s_acc[w][tid];
    const int64_t d = static_cast<int64_t>(blockIdx.y) * kCombineDims + tid;
    static_cast<TQ*>(out)[row * hd + d] = from_f32<TQ>(sum > 0.f ? a / sum : 0.f);  // no visible key: zeros
  }
}

template <class TQ, class TKV, int NP>
Status launch_typed(const AttnParams& p, int64_t rows, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(p.n_splits));
  launch_kernel(attention_kernel<TQ, TKV, NP>, grid, kWarps * kWarp, 0, stream, p);
  TANDEM_CUDA_TRY_LAUNCH();
  if (p.n_splits > 1)
    return launch_attention_combine(p.out, sizeof(TQ) == 2 ? DType::kBF16 : DType::kF32, p.partial, p.n_splits,
                                    rows, p.head_dim, stream);
  return ok_status();
}

template <class TQ, class TKV>
Status launch_dim(const AttnParams& p, int64_t rows, cudaStream_t stream) {
  if (p.head_dim <= 64) return launch_typed<TQ, TKV, 1>(p, rows, stream);
  if (p.head_dim <= 128) return launch_typed<TQ, TKV, 2>(p, rows, stream);
  if (p.head_dim <= 256) return launch_typed<TQ, TKV, 4>(p, rows, stream);
  return launch_typed<TQ, TKV, 8>(p, rows, stream);
}

// Split-K only when the rows alone cannot fill the GPU and the context is long.
int choose_splits(int64_t rows, int64_t max_keys, int64_t head_dim, const Scratch& scratch) {
  const int64_t want_blocks = kBlocksPerSm * static_cast<int64_t>(std::max(scratch.sm_count, 1));
  if (rows >= want_blocks || max_keys < 2 * kKeysPerSplit || scratch.data == nullptr) return 1;
  int64_t splits = std::min((want_blocks + rows - 1) / rows, max_keys / kKeysPerSplit);
  const int64_t per_split_bytes = rows * (head_dim + 2) * static_cast<int64_t>(sizeof(float));
  splits = std::min<int64_t>(splits, static_cast<int64_t>(scratch.bytes) / per_split_bytes);
  return static_cast<int>(std::clamp<int64_t>(splits, 1, 64));
}

}  // namespace

Status launch_attention_combine(void* out, DType out_dtype, const float* partial, int n_splits, int64_t rows,
                                int64_t head_dim, cudaStream_t stream) {
  if (n_splits < 1 || n_splits > kMaxAttnSplits)
    return invalid_argument(strfmt("cuda attention combine: %d splits (at most %d)", n_splits, kMaxAttnSplits));
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((head_dim + kCombineDims - 1) / kCombineDims));
  const int threads = kCombineWarps * kWarp;
  if (out_dtype == DType::kBF16)
    launch_kernel(attention_combine_kernel<bf16>, grid, threads, 0, stream, out, partial, n_splits, head_dim);
  else
    launch_kernel(attention_combine_kernel<float>, grid, threads, 0, stream, out, partial, n_splits, head_dim);
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status launch_attention(const AttentionArgs& a, const Scratch& scratch, cudaStream_t stream) {
  const DType qt = a.q.dtype, kt = a.kv.k.dtype;
  if ((qt != DType::kBF16 && qt != DType::kF32) || a.out.dtype != qt)
    return unsupported(strfmt("cuda attention: q %s, out %s (both bf16 or both f32)", dtype_name(qt),
                              dtype_name(a.out.dtype)));
  if ((kt != DType::kBF16 && kt != DType::kF32) || a.kv.v.dtype != kt)
    return unsupported(strfmt("cuda attention: K %s, V %s (both bf16 or both f32)", dtype_name(kt),
                              dtype_name(a.kv.v.dtype)));
  const int64_t n_tok = a.q.shape[0], n_heads = a.q.shape[1], head_dim = a.q.shape[2];
  if (head_dim > kMaxHeadDim)
    return unsupported(strfmt("cuda attention: head_dim %lld (at most %d)", static_cast<long long>(head_dim),
                              kMaxHeadDim));
  const int64_t rows = n_tok * n_heads;
  if (rows == 0 || head_dim == 0) return ok_status();
  // Launch sizing (split-K): the host range, or inside a graph capture with kv_end the largest range a replay may
  // see (the capacity); the kernels take their range at run time either way.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TANDEM_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
  const int64_t max_keys = !a.kv_end.empty() && capture != cudaStreamCaptureStatusNone ? a.kv.capacity()
                                                                                        : a.kv.end - a.kv.begin;
  if (attention_prefill_applies(a)) return launch_attention_prefill(a, stream);
  if (attention_decode_applies(a)) return launch_attention_decode(a, max_keys, scratch, stream);
  AttnParams p{};
  p.out = a.out.data;
  p.q = a.q.data;
  p.k = a.kv.k.data;
  p.v = a.kv.v.data;
  p.k_stride_head = a.kv.k.stride[0];
  p.k_stride_slot = a.kv.k.stride[1];
  p.v_stride_head = a.kv.v.stride[0];
  p.v_stride_slot = a.kv.v.stride[1];
  p.q_pos = static_cast<const int32_t*>(a.q_pos.data);
  p.kv_end = a.kv_end.empty() ? nullptr : static_cast<const int32_t*>(a.kv_end.data);
  p.n_heads = n_heads;
  p.group = n_heads / a.kv.k.shape[0];
  p.head_dim = head_dim;
  p.begin = a.kv.begin;
  p.end = a.kv.end;
  p.capacity = a.kv.capacity();
  p.window = a.window;
  p.ring = a.kv.ring;
  p.causal = a.causal;
  p.scale = a.scale;
  auto aligned = [](const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; };
  const size_t q_pair = 2 * dtype_size(qt), kv_pair = 2 * dtype_size(kt);
  p.q_pairs = head_dim % 2 == 0 && aligned(p.q, q_pair);
  p.kv_pairs = head_dim % 2 == 0 && aligned(p.k, kv_pair) && aligned(p.v, kv_pair) && p.k_stride_head % 2 == 0 &&
               p.k_stride_slot % 2 == 0 && p.v_stride_head % 2 == 0 && p.v_stride_slot % 2 == 0;
  p.n_splits = choose_splits(rows, max_keys, head_dim, scratch);
  p.partial = static_cast<float*>(scratch.data);
  if (qt == DType::kBF16)
    return kt == DType::kBF16 ? launch_dim<bf16, bf16>(p, rows, stream) : launch_dim<bf16, float>(p, rows, stream);
  return kt == DType::kBF16 ? launch_dim<float, bf16>(p, rows, stream) : launch_dim<float, float>(p, rows, stream);
}

}  // namespace tandem::cuda
