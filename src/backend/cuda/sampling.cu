// Row-wise argmax over logits on the GPU (greedy decoding, spec §1.13 item 6: ties go to the lowest index, a NaN
// wins like torch.argmax). One cluster of 8 blocks per row, so a 262,144-token row is read by 8 SMs (one block
// per row took 0.1 ms, cuda_bench). The sampler (temperature, top-k/p, rejection) is in sampler.cu.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

namespace cg = cooperative_groups;
constexpr int kThreads = 1024;
constexpr int kBlocks = 8;  // blocks per row (one cluster)

// Whether (v, i) beats (bv, bi): NaN beats any number, larger beats smaller, equal values go to the lower index.
__device__ __forceinline__ bool better(float v, int64_t i, float bv, int64_t bi) {
  const bool v_nan = isnan(v), b_nan = isnan(bv);
  if (v_nan || b_nan) return v_nan && (!b_nan || i < bi);
  return v > bv || (v == bv && i < bi);
}

// One cluster of kBlocks blocks per row, each block reducing a contiguous slice; block 0 combines the slices'
// winners (which rank is which does not matter: better() is a total order on (value, index)).
// ids (or null): element i stands for token ids[i]; the comparison and the output use the id.
template <class T>
__global__ void __launch_bounds__(kThreads) argmax_kernel(int32_t* out, const T* x, int64_t n, const int32_t* ids) {
  pdl_enter();
  const int64_t slice = (n + kBlocks - 1) / kBlocks, lo = blockIdx.x * slice;
  const int64_t hi = lo + slice < n ? lo + slice : n;
  const T* row = x + blockIdx.y * n;
  float best = -INFINITY;
  int64_t best_i = INT64_MAX;
#pragma unroll 8
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) {
    const float v = to_f32(row[i]);
    const int64_t key = ids != nullptr ? ids[i] : i;
    if (better(v, key, best, best_i)) {
      best = v;
      best_i = key;
    }
  }
  warp_arg_best(best, best_i, better);
  __shared__ float s_val[kThreads / kWarp];
  __shared__ int64_t s_idx[kThreads / kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) {
    s_val[warp] = best;
    s_idx[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / kWarp; ++w) {
      if (better(s_val[w], s_idx[w], best, best_i)) {
        best = s_val[w];
        best_i = s_idx[w];
      }
    }
    s_val[0] = best;  // this block's winner, read by block 0 of the cluster
    s_idx[0] = best_i;
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  if (cluster.block_rank() == 0 && threadIdx.x == 0) {
    for (unsigned r = 1; r < kBlocks; ++r) {
      const float v = *cluster.map_shared_rank(&s_val[0], r);
      const int64_t i = *cluster.map_shared_rank(&s_idx[0], r);
      if (better(v, i, best, best_i)) {
        best = v;
        best_i = i;
      }
    }
    out[blockIdx.y] = static_cast<int32_t>(best_i);
  }
  cluster.sync();  // no block leaves while block 0 may still read its shared memory
}

// centroid_candidates: one block sorts the (cluster logit, cluster) keys descending with a bitonic network in shared
// memory (order-preserving float bits, NaN above every number; the complemented index breaks ties to the lower
// cluster), then gathers the first k clusters' rows of the ordering table.
constexpr int kMaxClusters = 4096;
constexpr int kSortThreads = 1024;

__device__ __forceinline__ uint32_t order_key(float v) {
  if (isnan(v)) return 0xffffffffu;
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

template <class T>
__global__ void __launch_bounds__(kSortThreads)
    centroid_candidates_kernel(int32_t* ids, const T* logits, const int32_t* ordering, int n, int k, int m) {
  pdl_enter();
  __shared__ unsigned long long keys[kMaxClusters];
  int* s_top = reinterpret_cast<int*>(keys);  // after the sort: the top clusters, over the keys they came from
  int size = 1;
  while (size < n) size *= 2;
  for (int i = threadIdx.x; i < size; i += kSortThreads) {
    // Padding sorts last: key 0 is below every real key (a real one has a nonzero complemented index or value).
    keys[i] = i < n ? (static_cast<unsigned long long>(order_key(to_f32(logits[i]))) << 32) |
                          (0xffffffffu - static_cast<uint32_t>(i))
                    : 0ull;
  }
  __syncthreads();
  for (int len = 2; len <= size; len *= 2) {
    for (int stride = len / 2; stride > 0; stride /= 2) {
      for (int i = threadIdx.x; i < size; i += kSortThreads) {
        const int j = i ^ stride;
        if (j > i) {
          const bool descending = (i & len) == 0;
          const unsigned long long a = keys[i], b = keys[j];
          if (descending ? a < b : a > b) {
            keys[i] = b;
            keys[j] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  constexpr int kPerThread = kMaxClusters / kSortThreads;
  int top[kPerThread];
#pragma unroll
  for (int r = 0; r < kPerThread; ++r) {
    const int j = threadIdx.x + r * kSortThreads;
    top[r] = j < k ? static_cast<int>(0xffffffffu - static_cast<uint32_t>(keys[j])) : 0;
  }
  __syncthreads();  // every key is read before the indices overwrite them
#pragma unroll
  for (int r = 0; r < kPerThread; ++r) {
    const int j = threadIdx.x + r * kSortThreads;
    if (j < k) s_top[j] = top[r];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < k * m; i += kSortThreads)
    ids[i] = ordering[static_cast<int64_t>(s_top[i / m]) * m + i % m];
}

}  // namespace

Status launch_centroid_candidates(const CentroidCandidatesArgs& a, cudaStream_t stream) {
  const int64_t n = a.logits.numel();
  if (n < 1 || n > kMaxClusters || a.k < 1 || a.k > n || a.ordering.numel() % n != 0)
    return unsupported(strfmt("cuda centroid_candidates: %lld clusters (1..%d), k %d, ordering %s",
                              static_cast<long long>(n), kMaxClusters, a.k, a.ordering.describe().c_str()));
  const auto m = static_cast<int>(a.ordering.numel() / n);
  auto* ids = static_cast<int32_t*>(a.ids.data);
  const auto* ord = static_cast<const int32_t*>(a.ordering.data);
  if (a.logits.dtype == DType::kBF16) {
    launch_kernel(centroid_candidates_kernel<__nv_bfloat16>, 1, kSortThreads, 0, stream, ids,
                  static_cast<const __nv_bfloat16*>(a.logits.data), ord, static_cast<int>(n), a.k, m);
  } else if (a.logits.dtype == DType::kF32) {
    launch_kernel(centroid_candidates_kernel<float>, 1, kSortThreads, 0, stream, ids,
                  static_cast<const float*>(a.logits.data), ord, static_cast<int>(n), a.k, m);
  } else {
    return unsupported(strfmt("cuda centroid_candidates: logits dtype %s", dtype_name(a.logits.dtype)));
  }
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status launch_argmax(const ArgmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.rows(), n = a.x.dim(-1);
  if (rows == 0) return ok_status();
  if (rows > 65535) return unsupported(strfmt("cuda argmax: %lld rows (at most 65535)", static_cast<long long>(rows)));
  auto* out = static_cast<int32_t*>(a.out.data);
  const auto* ids = a.ids.empty() ? nullptr : static_cast<const int32_t*>(a.ids.data);
  if (ids != nullptr && (rows != 1 || a.ids.dtype != DType::kI32 || a.ids.numel() != n))
    return invalid_argument(strfmt("cuda argmax: ids %s for x %s", a.ids.describe().c_str(), a.x.describe().c_str()));
  const dim3 grid(kBlocks, static_cast<unsigned>(rows));
  if (a.x.dtype == DType::kBF16) {
    TANDEM_CUDA_TRY(launch_clusters(argmax_kernel<__nv_bfloat16>, grid, dim3(kThreads), 0, stream, kBlocks, out,
                                    static_cast<const __nv_bfloat16*>(a.x.data), n, ids));
  } else if (a.x.dtype == DType::kF32) {
    TANDEM_CUDA_TRY(launch_clusters(argmax_kernel<float>, grid, dim3(kThreads), 0, stream, kBlocks, out,
                                    static_cast<const float*>(a.x.data), n, ids));
  } else {
    return unsupported(strfmt("cuda argmax: x dtype %s (f32/bf16 only)", dtype_name(a.x.dtype)));
  }
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace tandem::cuda
