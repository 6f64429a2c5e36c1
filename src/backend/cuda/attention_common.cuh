// Pieces shared by the two CUDA attention kernels (attention.cu: the general kernel, one block per query row;
// attention_decode.cu: few query rows over a long context, all heads of a GQA group per block): the KV range read
// at run time (ops.h AttentionArgs::kv_end, so a captured CUDA graph replays at any cache length), the merge of
// split-K partial states, and the decode path's entry points. Included only by those .cu files.
#pragma once

#include <cuda_bf16.h>
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

// A bf16 attention op's operands and visibility as the tensor-core kernels read them (attention_decode.cu,
// attention_prefill.cu): tc_attention_inputs() fills them; tc_attention_operands_ok() is what both kernels need of
// them: bf16 q, out, K and V of rank 3, whole GQA groups, 16-byte aligned rows (strides in elements), and query
// rows, positions and slots that fit an int (q_pos and kv_end are i32).
struct TcAttnInputs {
  __nv_bfloat16* out;      // [n_tok, n_heads, head_dim] (may be q)
  const __nv_bfloat16* q;  // [n_tok, n_heads, head_dim]
  const __nv_bfloat16* k;  // [n_kv, capacity, head_dim], strides below (elements)
  const __nv_bfloat16* v;
  int64_t k_stride_head, k_stride_slot, v_stride_head, v_stride_slot;
  const int32_t* q_pos;   // [n_tok]
  const int32_t* kv_end;  // [1] on the device, or null
  int64_t begin, end, capacity, window;
  int n_tok, n_heads, group, head_dim;
  bool ring, causal;
  float scale_log2;  // scale * log2(e): scores are kept in base-2 units for exp2f
};
TcAttnInputs tc_attention_inputs(const AttentionArgs& a);
bool tc_attention_operands_ok(const AttentionArgs& a);

// The visible keys [lo, hi) of tokens t0 .. t0 + n - 1 (ops.h: [begin, end), k <= q_pos when causal,
// k > q_pos - window) into s_lo[i] / s_hi[i], the block's threads sharing the tokens. The caller syncs after.
__device__ __forceinline__ void token_ranges(const TcAttnInputs& p, int t0, int n, int* s_lo, int* s_hi) {
  const KvRange range = kv_range(p.kv_end, p.begin, p.end, p.capacity, p.ring);
  for (int t = threadIdx.x; t < n; t += blockDim.x) {
    const int64_t qp = p.q_pos[t0 + t];
    int64_t lo = range.begin, hi = range.end;
    if (p.causal) hi = hi < qp + 1 ? hi : qp + 1;
    if (p.window > 0) lo = lo > qp - p.window + 1 ? lo : qp - p.window + 1;
    s_lo[t] = static_cast<int>(lo);
    s_hi[t] = static_cast<int>(hi > lo ? hi : lo);
  }
}

// The union of n such ranges (empty ones skipped; none: [0, 0)).
__device__ __forceinline__ KvRange ranges_union(const int* s_lo, const int* s_hi, int n) {
  int64_t lo = 0, hi = 0;
  bool any = false;
  for (int t = 0; t < n; ++t) {
    if (s_lo[t] >= s_hi[t]) continue;
    lo = any && lo < s_lo[t] ? lo : s_lo[t];
    hi = any && hi > s_hi[t] ? hi : s_hi[t];
    any = true;
  }
  return {lo, hi};
}

// Whether the tensor-core kernel takes this op: bf16 q/out and K/V, any token count (TANDEM_ATTN_TC_MAX_TOKENS may cap
// it), head_dim % 8 == 0 (<= 512), 16-byte aligned K/V rows. (attention_decode.cu)
bool attention_decode_applies(const AttentionArgs& a);

// Whether the prompt-chunk kernel takes this op (prefill_attention()'s mode, bf16, 32+ tokens, head_dim 64 / 128 /
// 256, or 512 with prefill_attention_512(), 16-byte aligned K/V rows), and its launch (no split of the keys, no
// workspace). (attention_prefill.cu)
bool attention_prefill_applies(const AttentionArgs& a);
Status launch_attention_prefill(const AttentionArgs& a, cudaStream_t stream);

// Enqueues the decode kernel (and the combine when it splits the keys). max_keys sizes the launch: the range the
// queries see (the capacity inside a graph capture with kv_end, so every replay length fits).
Status launch_attention_decode(const AttentionArgs& a, int64_t max_keys, const Scratch& scratch,
                               cudaStream_t stream);

}  // namespace tandem::cuda
