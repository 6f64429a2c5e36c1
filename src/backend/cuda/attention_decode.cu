// The decode attention kernel's entry points (attention_decode_kernel.cuh has the kernel), and its instantiation
// that takes q as given (kNorm 0).
#include <algorithm>
#include <climits>
#include <cstdint>

#include "backend/cuda/attention_decode_kernel.cuh"

namespace tandem::cuda {

namespace decode {
template Status launch_decode<0>(const DecodeParams&, int, const DecodeShape&, const Scratch&, cudaStream_t);
}  // namespace decode

using decode::bf16;
using decode::DecodeParams;
using decode::DecodeShape;
using decode::kLog2e;
using decode::kMaxChunkRows;
using decode::kMaxHeadDim;
using decode::kMaxTokens;

bool attention_decode_applies(const AttentionArgs& a) {
  const KvView& kv = a.kv;
  if (a.q.dtype != DType::kBF16 || a.out.dtype != DType::kBF16 || kv.k.dtype != DType::kBF16 ||
      kv.v.dtype != DType::kBF16)
    return false;
  const int64_t n_tok = a.q.shape[0], head_dim = a.q.shape[2];
  if (n_tok < 1 || n_tok > kMaxTokens || head_dim < 8 || head_dim > kMaxHeadDim || head_dim % 8 != 0) return false;
  // Positions and slots are i32 (q_pos, kv_end); 16-byte rows for cp.async (strides in elements).
  if (kv.capacity() > INT_MAX || kv.end > INT_MAX || a.window > INT_MAX) return false;
  return aligned16(a.q.data) && aligned16(a.out.data) && aligned16(kv.k.data) && aligned16(kv.v.data) &&
         kv.k.stride[0] % 8 == 0 && kv.k.stride[1] % 8 == 0 && kv.v.stride[0] % 8 == 0 && kv.v.stride[1] % 8 == 0;
}

Status launch_attention_decode(const AttentionArgs& a, int64_t max_keys, const Scratch& scratch, cudaStream_t stream,
                               const QNormIn* qn, const KvNewIn* kv_new) {
  const int64_t n_tok = a.q.shape[0], n_heads = a.q.shape[1], head_dim = a.q.shape[2];
  const int64_t n_kv = a.kv.k.shape[0], group = n_heads / n_kv;
  DecodeParams p{};
  p.out = static_cast<bf16*>(a.out.data);
  p.q = static_cast<const bf16*>(a.q.data);
  p.k = static_cast<const bf16*>(a.kv.k.data);
  p.v = static_cast<const bf16*>(a.kv.v.data);
  p.k_stride_head = a.kv.k.stride[0];
  p.k_stride_slot = a.kv.k.stride[1];
  p.v_stride_head = a.kv.v.stride[0];
  p.v_stride_slot = a.kv.v.stride[1];
  p.q_pos = static_cast<const int32_t*>(a.q_pos.data);
  p.kv_end = a.kv_end.empty() ? nullptr : static_cast<const int32_t*>(a.kv_end.data);
  p.begin = a.kv.begin;
  p.end = a.kv.end;
  p.capacity = a.kv.capacity();
  p.window = a.window;
  p.n_tok = static_cast<int>(n_tok);
  p.n_heads = static_cast<int>(n_heads);
  p.group = static_cast<int>(group);
  p.head_dim = static_cast<int>(head_dim);
  p.ring = a.kv.ring;
  p.causal = a.causal;
  p.scale_log2 = a.scale * kLog2e;
  p.partial = static_cast<float*>(scratch.data);
  if (qn != nullptr) p.qn = *qn;
  if (kv_new != nullptr) p.kv_new = *kv_new;

  // Query rows (n_tok x group) in chunks of at most kMaxChunkRows, as even as possible.
  const int64_t rows = n_tok * group;
  DecodeShape s{};
  s.rows_out = n_tok * n_heads;
  s.n_kv = n_kv;
  s.n_chunks = (rows + kMaxChunkRows - 1) / kMaxChunkRows;
  p.chunk_rows = static_cast<int>((rows + s.n_chunks - 1) / s.n_chunks);
  // A window bounds the keys the queries see together (consecutive query positions: window + n_tok - 1).
  s.max_keys = a.window > 0 ? std::min(max_keys, a.window + n_tok - 1) : max_keys;
  const int nt = (p.chunk_rows + 7) / 8;
  if (kv_new != nullptr) return decode::launch_decode<2>(p, nt, s, scratch, stream);
  if (qn != nullptr) return decode::launch_decode<1>(p, nt, s, scratch, stream);
  return decode::launch_decode<0>(p, nt, s, scratch, stream);
}

}  // namespace tandem::cuda
