// CPU attention (spec §1.6: GQA, causal + sliding-window mask, f32 softmax, scale) and the KV writes into full or
// ring storage. The visible keys of a query always form one position range [lo, hi), so there is no mask tensor.
// The query heads that share a KV head are processed together, so each K/V row is read once for all of them.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_checks.h"

namespace tandem::cpu {
namespace {

// KV storage [n_kv_heads, capacity, head_dim], f32 or bf16, last dim contiguous, any strides for the first two.
void check_kv_storage(const Tensor& t, int64_t n_kv, int64_t head_dim, const char* what) {
  TANDEM_CHECK_MSG(!t.empty() && t.device.is_cpu(), "%s must be non-empty host memory", what);
  TANDEM_CHECK_MSG(t.ndim == 3 && t.shape[0] == n_kv && t.shape[2] == head_dim && t.stride[2] == 1,
                   "%s %s does not match [%lld, capacity, %lld] with a contiguous last dim", what,
                   t.describe().c_str(), static_cast<long long>(n_kv), static_cast<long long>(head_dim));
  TANDEM_CHECK_MSG(t.dtype == DType::kF32 || t.dtype == DType::kBF16, "%s must be f32 or bf16, got %s", what,
                   dtype_name(t.dtype));
}

const void* kv_row(const Tensor& t, int64_t head, int64_t slot) {
  return static_cast<const char*>(t.data) +
         static_cast<size_t>(head * t.stride[0] + slot * t.stride[1]) * dtype_size(t.dtype);
}

}  // namespace

void CpuBackend::kv_write(const KvWriteArgs& a) {
  check_act(a.k_new, "kv_write k_new");
  check_act(a.v_new, "kv_write v_new");
  check_i32(a.pos, "kv_write pos");
  TANDEM_CHECK(a.k_new.ndim == 3 && a.k_new.same_shape(a.v_new));
  const int64_t n_tok = a.k_new.shape[0], n_kv = a.k_new.shape[1], head_dim = a.k_new.shape[2];
  TANDEM_CHECK(a.pos.numel() == n_tok);
  check_kv_storage(a.kv.k, n_kv, head_dim, "kv.k");
  check_kv_storage(a.kv.v, n_kv, head_dim, "kv.v");
  TANDEM_CHECK(a.kv.k.shape[1] == a.kv.v.shape[1]);
  for (int64_t t = 0; t < n_tok; ++t) {
    const int64_t p = a.pos.ptr<int32_t>()[t];
    TANDEM_CHECK_MSG(p >= 0 && (a.kv.ring || p < a.kv.capacity()), "kv_write position %lld, capacity %lld",
                     static_cast<long long>(p), static_cast<long long>(a.kv.capacity()));
    const int64_t slot = a.kv.slot(p);
    for (int64_t h = 0; h < n_kv; ++h) {
      const float* src[2] = {a.k_new.ptr<float>() + (t * n_kv + h) * head_dim,
                             a.v_new.ptr<float>() + (t * n_kv + h) * head_dim};
      const Tensor* dst[2] = {&a.kv.k, &a.kv.v};
      for (int i = 0; i < 2; ++i) {
        void* d = const_cast<void*>(kv_row(*dst[i], h, slot));
        if (dst[i]->dtype == DType::kF32) {
          std::memcpy(d, src[i], static_cast<size_t>(head_dim) * sizeof(float));
        } else {
          auto* o = static_cast<uint16_t*>(d);
          for (int64_t x = 0; x < head_dim; ++x) o[x] = f32_to_bf16(src[i][x]);
        }
      }
    }
  }
}

void CpuBackend::attention(const AttentionArgs& a) {
  check_act(a.out, "attention out");
  check_act(a.q, "attention q");
  check_i32(a.q_pos, "attention q_pos");
  TANDEM_CHECK(a.q.ndim == 3 && a.out.same_shape(a.q));
  const int64_t n_tok = a.q.shape[0], n_heads = a.q.shape[1], head_dim = a.q.shape[2];
  const int64_t n_kv = a.kv.k.ndim == 3 ? a.kv.k.shape[0] : 0;
  TANDEM_CHECK_MSG(n_kv > 0 && n_heads % n_kv == 0, "%lld query heads over %lld kv heads",
                   static_cast<long long>(n_heads), static_cast<long long>(n_kv));
  check_kv_storage(a.kv.k, n_kv, head_dim, "kv.k");
  check_kv_storage(a.kv.v, n_kv, head_dim, "kv.v");
  const KvView kv = host_attention_range(a);
  TANDEM_CHECK(kv.k.shape[1] == kv.v.shape[1] && kv.begin >= 0 && kv.begin <= kv.end);
  TANDEM_CHECK_MSG(kv.ring ? kv.end - kv.begin <= kv.capacity() : kv.end <= kv.capacity(),
                   "kv range [%lld, %lld) does not fit capacity %lld (ring %d)", static_cast<long long>(kv.begin),
                   static_cast<long long>(kv.end), static_cast<long long>(kv.capacity()), kv.ring ? 1 : 0);
  TANDEM_CHECK(a.q_pos.numel() == n_tok && a.window >= 0);
  const int64_t group = n_heads / n_kv;
  const int ktype = simd_type(kv.k.dtype), vtype = simd_type(kv.v.dtype);
  // Work item = (token, kv head, slice of that kv head's query heads): each K/V row is loaded once per item and
  // used by every query head of the slice. Groups are sliced only when there are fewer (token, kv head) pairs
  // than threads (decode with one kv head).
  int64_t n_split = 1;
  if (n_tok * n_kv < threads_) n_split = std::min<int64_t>(group, (threads_ + n_tok * n_kv - 1) / (n_tok * n_kv));
  const int64_t per_item = (group + n_split - 1) / n_split;
  n_split = (group + per_item - 1) / per_item;
  const int64_t items = n_tok * n_kv * n_split;
  const int64_t work = n_tok * n_heads * std::max<int64_t>(kv.end - kv.begin, 1) * head_dim;

#pragma omp parallel num_threads(threads_) if (items > 1 && work > 65536)
  {
    std::vector<float> score, acc, denom;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t t = item / (n_kv * n_split), kvh = item / n_split % n_kv, split = item % n_split;
      const int64_t h0 = kvh * group + split * per_item, nh = std::min(per_item, (kvh + 1) * group - h0);
      const int64_t qp = a.q_pos.ptr<int32_t>()[t];
      int64_t lo = kv.begin, hi = kv.end;  // visible keys: [lo, hi)
      if (a.causal) hi = std::min(hi, qp + 1);
      if (a.window > 0) lo = std::max(lo, qp - a.window + 1);
      const float* q = a.q.ptr<float>() + (t * n_heads + h0) * head_dim;
      float* out = a.out.ptr<float>() + (t * n_heads + h0) * head_dim;  // may alias q: written last
      if (lo >= hi) {
        std::fill(out, out + nh * head_dim, 0.f);  // no visible key: zeros, never 0/0
        continue;
      }
      const int64_t nk = hi - lo;
      score.resize(static_cast<size_t>(nh * nk));
      for (int64_t k = lo; k < hi; ++k) {
        const void* krow = kv_row(kv.k, kvh, kv.slot(k));
        for (int64_t h = 0; h < nh; ++h) score[h * nk + k - lo] = simd_.dot(q + h * head_dim, krow, ktype, head_dim) * a.scale;
      }
      denom.assign(static_cast<size_t>(nh), 0.f);
      for (int64_t h = 0; h < nh; ++h) {  // softmax numerators in f32, the row maximum subtracted
        float* s = score.data() + h * nk;
        const float mx = *std::max_element(s, s + nk);
        for (int64_t i = 0; i < nk; ++i) {
          s[i] = std::exp(s[i] - mx);
          denom[h] += s[i];
        }
      }
      acc.assign(static_cast<size_t>(nh * head_dim), 0.f);
      for (int64_t k = lo; k < hi; ++k) {
        const void* vrow = kv_row(kv.v, kvh, kv.slot(k));
        for (int64_t h = 0; h < nh; ++h) simd_.axpy(acc.data() + h * head_dim, score[h * nk + k - lo], vrow, vtype, head_dim);
      }
      for (int64_t h = 0; h < nh; ++h)
        for (int64_t d = 0; d < head_dim; ++d) out[h * head_dim + d] = acc[h * head_dim + d] / denom[h];
    }
  }
}

}  // namespace tandem::cpu
