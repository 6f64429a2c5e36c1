// Pieces shared by the two CUDA attention kernels (attention.cu: the general kernel, one block per query row;
// attention_decode.cu: few query rows over a long context, all heads of a GQA group per block): the KV range read
// at run time (ops.h AttentionArgs::kv_end, so a captured CUDA graph replays at any cache length), the merge of
// split-K partial states, and the decode path's entry points. Included only by those .cu files.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kernels.h"
#include "core/status.h"
#include "tensor/dtype.h"

namespace tandem::cuda {

// Most split-K partial states one query row may have (the combine kernel keeps one weight per split in shared
// memory).
inline constexpr int kMaxAttnSplits = 256;

struct KvRange {
  int64_t begin, end;
};

// The stored positions [begin, end) a kernel sees: the launch's, or with kv_end set the end read from the device and,
// for a ring, begin = max(0, end - capacity) (ops.h). A full store's end is clamped to its capacity so that a bad
// device value cannot make a kernel read past the storage.
__device__ __forceinline__ KvRange kv_range(const int32_t* kv_end, int64_t begin, int64_t end, int64_t capacity,
                                            bool ring) {
  if (kv_end != nullptr) {
    end = *kv_end;
    if (ring) begin = end - capacity > 0 ? end - capacity : 0;
    else if (end > capacity) end = capacity;
  }
  return {begin, end < begin ? begin : end};
}

// Split-K partial states: row r = t * n_heads + h, split s at partial + (r * n_splits + s) * (head_dim + 2):
// acc[head_dim] (sum of exp(score - max) v), max (natural-log units; -inf when the split saw no key), sum.
// Merges them into out (bf16 or f32 [rows, head_dim]); a row whose splits saw no key gets zeros. (attention.cu)
Status launch_attention_combine(void* out, DType out_dtype, const float* partial, int n_splits, int64_t rows,
                                int64_t head_dim, cudaStream_t stream);

// Whether the tensor-core kernel takes this op: bf16 q/out and K/V, any token count (TANDEM_ATTN_TC_MAX_TOKENS may cap
// it), head_dim % 8 == 0 (<= 512), 16-byte aligned K/V rows. (attention_decode.cu)
bool attention_decode_applies(const AttentionArgs& a);

// Whether the prompt-chunk kernel takes this op (prefill_attention()'s mode, bf16, 32+ tokens, head_dim 64 / 128 /
// 256, 16-byte aligned K/V rows), and its launch (no split of the keys, no workspace). (attention_prefill.cu)
bool attention_prefill_applies(const AttentionArgs& a, int sm_count);
Status launch_attention_prefill(const AttentionArgs& a, cudaStream_t stream);

// Enqueues the decode kernel (and the combine when it splits the keys). max_keys sizes the launch: the range the
// queries see (the capacity inside a graph capture with kv_end, so every replay length fits).
Status launch_attention_decode(const AttentionArgs& a, int64_t max_keys, const Scratch& scratch,
                               cudaStream_t stream);

}  // namespace tandem::cuda
