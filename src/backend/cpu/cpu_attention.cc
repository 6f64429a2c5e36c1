// CPU attention (spec §1.6: GQA, causal + sliding-window mask, f32 softmax, scale) and the KV writes into full or
// ring storage. The visible keys of a query always form one position range [lo, hi), so there is no mask tensor;
// each (token, head) pair is one work item: vector dot products over the keys, softmax, then a weighted sum of V.
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
  const KvView& kv = a.kv;
  TANDEM_CHECK(kv.k.shape[1] == kv.v.shape[1] && kv.begin >= 0 && kv.begin <= kv.end);
  TANDEM_CHECK_MSG(kv.ring ? kv.end - kv.begin <= kv.capacity() : kv.end <= kv.capacity(),
                   "kv range [%lld, %lld) does not fit capacity %lld (ring %d)", static_cast<long long>(kv.begin),
                   static_cast<long long>(kv.end), static_cast<long long>(kv.capacity()), kv.ring ? 1 : 0);
  TANDEM_CHECK(a.q_pos.numel() == n_tok && a.window >= 0);
  const int64_t group = n_heads / n_kv;
  const int ktype = simd_type(kv.k.dtype), vtype = simd_type(kv.v.dtype);
  const int64_t work = n_tok * n_heads * std::max<int64_t>(kv.end - kv.begin, 1) * head_dim;

#pragma omp parallel num_threads(threads_) if (n_tok * n_heads > 1 && work > 65536)
  {
    std::vector<float> score;
    std::vector<float> acc(static_cast<size_t>(head_dim));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t t = 0; t < n_tok; ++t) {
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t qp = a.q_pos.ptr<int32_t>()[t], kvh = h / group;
        int64_t lo = kv.begin, hi = kv.end;  // visible keys: [lo, hi)
        if (a.causal) hi = std::min(hi, qp + 1);
        if (a.window > 0) lo = std::max(lo, qp - a.window + 1);
        const float* q = a.q.ptr<float>() + (t * n_heads + h) * head_dim;
        float* out = a.out.ptr<float>() + (t * n_heads + h) * head_dim;  // may alias q: written last
        if (lo >= hi) {
          std::fill(out, out + head_dim, 0.f);  // no visible key: zeros, never 0/0
          continue;
        }
        score.resize(static_cast<size_t>(hi - lo));
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t k = lo; k < hi; ++k) {
          const float s = simd_.dot(q, kv_row(kv.k, kvh, kv.slot(k)), ktype, head_dim) * a.scale;
          score[k - lo] = s;
          mx = std::max(mx, s);
        }
        float denom = 0;
        for (float& s : score) {
          s = std::exp(s - mx);
          denom += s;
        }
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t k = lo; k < hi; ++k) simd_.axpy(acc.data(), score[k - lo], kv_row(kv.v, kvh, kv.slot(k)), vtype, head_dim);
        for (int64_t d = 0; d < head_dim; ++d) out[d] = acc[d] / denom;
      }
    }
  }
}

}  // namespace tandem::cpu
