// KV-cache kernels on the GPU: kv_write stores new keys/values at their slots (position p at slot p, or p mod
// capacity for a sliding layer's ring; ops.h KvView). Issue 7 adds cache copies for speculative rollback here.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

struct KvDst {
  void* data;
  DType dtype;
  int64_t stride_head, stride_slot;  // elements; the head_dim stride is 1
};

struct KvSrc {
  const void* data;
  DType dtype;
};

// One thread per element of k_new/v_new [n_tok, n_kv_heads, head_dim]. A position the view cannot hold is
// skipped (the caller validated positions on the host; this only keeps a bug from writing out of bounds).
__global__ void kv_write_kernel(KvDst k, KvDst v, KvSrc k_new, KvSrc v_new, const int32_t* pos, int64_t capacity,
                                bool ring, int64_t n_kv, int64_t head_dim, int64_t n) {
  pdl_enter();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = i % head_dim, h = (i / head_dim) % n_kv, t = i / (head_dim * n_kv);
    const int64_t p = pos[t];
    if (p < 0 || (!ring && p >= capacity)) continue;
    const int64_t slot = ring ? p % capacity : p;
    store_f32(k.data, k.dtype, h * k.stride_head + slot * k.stride_slot + d, load_f32(k_new.data, k_new.dtype, i));
    store_f32(v.data, v.dtype, h * v.stride_head + slot * v.stride_slot + d, load_f32(v_new.data, v_new.dtype, i));
  }
}

}  // namespace

Status launch_kv_write(const KvWriteArgs& a, cudaStream_t stream) {
  for (const Tensor* t : {&a.kv.k, &a.kv.v, &a.k_new, &a.v_new}) {
    if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16)
      return unsupported(strfmt("cuda kv_write: dtype %s is not a float type", dtype_name(t->dtype)));
  }
  const int64_t n = a.k_new.numel();
  if (n == 0) return ok_status();
  const KvDst k{a.kv.k.data, a.kv.k.dtype, a.kv.k.stride[0], a.kv.k.stride[1]};
  const KvDst v{a.kv.v.data, a.kv.v.dtype, a.kv.v.stride[0], a.kv.v.stride[1]};
  launch_kernel(kv_write_kernel, grid_for(n, kThreads), kThreads, 0, stream, k, v, KvSrc{a.k_new.data, a.k_new.dtype},
                KvSrc{a.v_new.data, a.v_new.dtype}, static_cast<const int32_t*>(a.pos.data), a.kv.capacity(), a.kv.ring,
                a.k_new.shape[1], a.k_new.shape[2], n);
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace tandem::cuda
