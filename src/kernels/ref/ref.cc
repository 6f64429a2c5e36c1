// Scalar reference of every op of backend/ops.h (spec §1.2 RMSNorm, §1.6 attention, §1.7 RoPE, §1.9 GeGLU,
// §1.10 MoE, §1.11 soft-cap): plain loops over host tensors, math in double where it is cheap, results rounded
// once to the output dtype. Written for obviousness, never for speed: this is what the backends are tested against.
#include "kernels/ref/ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

namespace tandem::ref {
namespace {

void check_host(const Tensor& t, const char* what) {
  TANDEM_CHECK_MSG(t.device.is_cpu(), "ref kernels run on host tensors; %s is on %s", what,
                   t.device.to_string().c_str());
}

void check_plain(const Tensor& t, const char* what) {
  check_host(t, what);
  TANDEM_CHECK_MSG(!t.empty(), "%s is empty", what);
  TANDEM_CHECK_MSG(t.is_contiguous(), "%s %s is not contiguous", what, t.describe().c_str());
}

void check_float(const Tensor& t, const char* what) {
  check_plain(t, what);
  TANDEM_CHECK_MSG(dtype_is_float(t.dtype), "%s must be a float tensor, got %s", what, t.describe().c_str());
}

void check_i32(const Tensor& t, const char* what) {
  check_plain(t, what);
  TANDEM_CHECK_MSG(t.dtype == DType::kI32, "%s must be i32, got %s", what, t.describe().c_str());
}

// Element `i` (flat index into a contiguous tensor, or a precomputed strided offset) as a double.
double ld(const Tensor& t, int64_t i) { return load_as_f32(t.data, t.dtype, i); }

// Stores `v` rounded to t's dtype.
void st(const Tensor& t, int64_t i, double v) {
  float f = static_cast<float>(v);
  switch (t.dtype) {
    case DType::kF32: t.ptr<float>()[i] = f; break;
    case DType::kBF16: t.ptr<uint16_t>()[i] = f32_to_bf16(f); break;
    case DType::kF16: t.ptr<uint16_t>()[i] = f32_to_f16(f); break;
    default: TANDEM_CHECK_MSG(false, "store to non-float tensor %s", t.describe().c_str());
  }
}

// Rounds an f32 value to the precision of dtype `t` (identity for f32).
float round_to(DType t, float f) {
  if (t == DType::kBF16) return round_bf16(f);
  if (t == DType::kF16) return f16_to_f32(f32_to_f16(f));
  return f;
}

double gelu_tanh_d(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

// Offset of element (head, slot, d) of a KV storage tensor [n_kv_heads, capacity, head_dim] (strides honoured).
int64_t kv_offset(const Tensor& t, int64_t head, int64_t slot, int64_t d) {
  return head * t.stride[0] + slot * t.stride[1] + d * t.stride[2];
}

void check_kv(const KvView& kv, int64_t n_kv_heads, int64_t head_dim) {
  for (const Tensor* t : {&kv.k, &kv.v}) {
    check_host(*t, "kv");
    TANDEM_CHECK_MSG(t->ndim == 3 && t->shape[0] == n_kv_heads && t->shape[2] == head_dim && t->stride[2] == 1,
                     "kv storage %s does not match [%lld, capacity, %lld]", t->describe().c_str(),
                     static_cast<long long>(n_kv_heads), static_cast<long long>(head_dim));
    TANDEM_CHECK(dtype_is_float(t->dtype));
  }
  TANDEM_CHECK(kv.k.shape[1] == kv.v.shape[1]);
  TANDEM_CHECK_MSG(kv.begin >= 0 && kv.begin <= kv.end, "kv range [%lld, %lld)", static_cast<long long>(kv.begin),
                   static_cast<long long>(kv.end));
  if (kv.ring) {
    TANDEM_CHECK_MSG(kv.end - kv.begin <= kv.capacity(), "ring kv range [%lld, %lld) exceeds capacity %lld",
                     static_cast<long long>(kv.begin), static_cast<long long>(kv.end),
                     static_cast<long long>(kv.capacity()));
  } else {
    TANDEM_CHECK_MSG(kv.end <= kv.capacity(), "kv end %lld exceeds capacity %lld", static_cast<long long>(kv.end),
                     static_cast<long long>(kv.capacity()));
  }
}

}  // namespace

float gelu_tanh(float x) { return static_cast<float>(gelu_tanh_d(x)); }

void embedding(const EmbeddingArgs& a) {
  check_float(a.out, "out");
  TANDEM_CHECK_MSG(!a.table.empty() && dtype_is_float(a.table.dtype) && a.table.ndim == 2 && a.table.stride[1] == 1,
                   "table %s must be a 2-d float tensor with contiguous rows", a.table.describe().c_str());
  check_i32(a.ids, "ids");
  const int64_t n = a.ids.numel(), dim = a.table.dim(1), n_vocab = a.table.dim(0);
  TANDEM_CHECK(a.out.rows() == n && a.out.dim(-1) == dim);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t id = a.ids.ptr<int32_t>()[t];
    TANDEM_CHECK_MSG(id >= 0 && id < n_vocab, "token id %lld outside [0, %lld)", static_cast<long long>(id),
                     static_cast<long long>(n_vocab));
    for (int64_t d = 0; d < dim; ++d) st(a.out, t * dim + d, ld(a.table, id * a.table.stride[0] + d) * a.scale);
  }
}

void linear(const LinearArgs& a) {
  check_float(a.out, "out");
  check_float(a.x, "x");
  check_float(a.w, "w");
  const int64_t n_out = a.w.dim(0), n_in = a.w.dim(1), n_tok = a.x.rows();
  TANDEM_CHECK_MSG(a.w.ndim == 2 && a.x.dim(-1) == n_in && a.out.rows() == n_tok && a.out.dim(-1) == n_out,
                   "linear shapes: out %s, x %s, w %s", a.out.describe().c_str(), a.x.describe().c_str(),
                   a.w.describe().c_str());
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t o = 0; o < n_out; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < n_in; ++i) acc += ld(a.x, t * n_in + i) * ld(a.w, o * n_in + i);
      double y = a.alpha * acc;
      if (a.accumulate) y += ld(a.out, t * n_out + o);
      st(a.out, t * n_out + o, y);
    }
  }
}

void rms_norm(const RmsNormArgs& a) {
  check_float(a.out, "out");
  check_float(a.x, "x");
  const int64_t dim = a.x.dim(-1), rows = a.x.rows();
  TANDEM_CHECK(a.out.numel() == a.x.numel() && a.out.dim(-1) == dim);
  if (!a.weight.empty()) {
    check_float(a.weight, "weight");
    TANDEM_CHECK(a.weight.numel() == dim);
  }
  const bool has_res = !a.residual.empty(), has_rope = !a.rope_pos.empty() || !a.rope_inv_freq.empty();
  if (has_res) {
    check_float(a.residual, "residual");
    TANDEM_CHECK(a.residual.numel() == a.out.numel());
  }
  // The epilogue stages round to out's dtype one by one, as the separate rms_norm, add and scale ops would.
  const auto rounded = [&](double v) { return static_cast<double>(round_to(a.out.dtype, static_cast<float>(v))); };
  std::vector<double> row(static_cast<size_t>(dim));
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t d = 0; d < dim; ++d) {
      row[d] = ld(a.x, r * dim + d);
      ss += row[d] * row[d];
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + static_cast<double>(a.eps));
    for (int64_t d = 0; d < dim; ++d) {
      const double w = a.weight.empty() ? 1.0 : ld(a.weight, d);
      double y = row[d] * inv * w;
      if (has_res) y = ld(a.residual, r * dim + d) + rounded(y);
      if (a.out_scale != 1.f) y = rounded(y) * a.out_scale;
      st(a.out, r * dim + d, y);
    }
  }
  if (has_rope) {
    // Then RoPE on the rounded norm output, by the reference rope itself.
    TANDEM_CHECK_MSG(!has_res && a.out_scale == 1.f && a.out.dtype == a.x.dtype, "rms_norm with rope: residual %s, "
                     "out_scale %g, x %s, out %s", has_res ? a.residual.describe().c_str() : "none",
                     static_cast<double>(a.out_scale), a.x.describe().c_str(), a.out.describe().c_str());
    const int64_t n_tok = a.rope_pos.numel();
    TANDEM_CHECK(n_tok > 0 && rows % n_tok == 0);
    rope({.x = Tensor::make(a.out.data, a.out.dtype, {n_tok, rows / n_tok, dim}, a.out.device), .pos = a.rope_pos,
          .inv_freq = a.rope_inv_freq});
  }
}

void rope(const RopeArgs& a) {
  check_float(a.x, "x");
  check_i32(a.pos, "pos");
  check_float(a.inv_freq, "inv_freq");
  TANDEM_CHECK(a.x.ndim == 3 && a.inv_freq.dtype == DType::kF32);
  const int64_t n_tok = a.x.shape[0], n_heads = a.x.shape[1], head_dim = a.x.shape[2], half = head_dim / 2;
  TANDEM_CHECK(head_dim % 2 == 0 && a.inv_freq.numel() == half && a.pos.numel() == n_tok);
  for (int64_t t = 0; t < n_tok; ++t) {
    const float pos = static_cast<float>(a.pos.ptr<int32_t>()[t]);
    for (int64_t j = 0; j < half; ++j) {
      const float f = a.inv_freq.ptr<float>()[j];
      if (f == 0.f) continue;  // proportional RoPE: an unrotated pair is left bit-for-bit unchanged
      // HF computes the angle as an f32 product and cos/sin in f32, then casts them to the activation dtype.
      const float angle = pos * f;
      const double c = round_to(a.x.dtype, std::cos(angle)), s = round_to(a.x.dtype, std::sin(angle));
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t base = (t * n_heads + h) * head_dim;
        const double x1 = ld(a.x, base + j), x2 = ld(a.x, base + j + half);
        st(a.x, base + j, x1 * c - x2 * s);
        st(a.x, base + j + half, x2 * c + x1 * s);
      }
    }
  }
}

void kv_write(const KvWriteArgs& a) {
  check_float(a.k_new, "k_new");
  check_float(a.v_new, "v_new");
  check_i32(a.pos, "pos");
  TANDEM_CHECK(a.k_new.ndim == 3 && a.k_new.same_shape(a.v_new));
  const int64_t n_tok = a.k_new.shape[0], n_kv = a.k_new.shape[1], head_dim = a.k_new.shape[2];
  TANDEM_CHECK(a.pos.numel() == n_tok);
  check_host(a.kv.k, "kv.k");
  check_host(a.kv.v, "kv.v");
  TANDEM_CHECK(a.kv.k.ndim == 3 && a.kv.k.shape[0] == n_kv && a.kv.k.shape[2] == head_dim && a.kv.k.stride[2] == 1);
  TANDEM_CHECK(a.kv.v.ndim == 3 && a.kv.v.shape[0] == n_kv && a.kv.v.shape[2] == head_dim && a.kv.v.stride[2] == 1);
  for (int64_t t = 0; t < n_tok; ++t) {
    const int64_t p = a.pos.ptr<int32_t>()[t];
    TANDEM_CHECK_MSG(p >= 0 && (a.kv.ring || p < a.kv.capacity()), "kv_write position %lld, capacity %lld",
                     static_cast<long long>(p), static_cast<long long>(a.kv.capacity()));
    const int64_t slot = a.kv.slot(p);
    for (int64_t h = 0; h < n_kv; ++h) {
      for (int64_t d = 0; d < head_dim; ++d) {
        const int64_t src = (t * n_kv + h) * head_dim + d;
        st(a.kv.k, kv_offset(a.kv.k, h, slot, d), ld(a.k_new, src));
        st(a.kv.v, kv_offset(a.kv.v, h, slot, d), ld(a.v_new, src));
      }
    }
  }
}

void attention(const AttentionArgs& a) {
  check_float(a.out, "out");
  check_float(a.q, "q");
  check_i32(a.q_pos, "q_pos");
  TANDEM_CHECK(a.q.ndim == 3 && a.out.same_shape(a.q));
  const int64_t n_tok = a.q.shape[0], n_heads = a.q.shape[1], head_dim = a.q.shape[2];
  const int64_t n_kv = a.kv.k.ndim == 3 ? a.kv.k.shape[0] : 0;
  TANDEM_CHECK_MSG(n_kv > 0 && n_heads % n_kv == 0, "%lld query heads over %lld kv heads",
                   static_cast<long long>(n_heads), static_cast<long long>(n_kv));
  const KvView kv = host_attention_range(a);
  check_kv(kv, n_kv, head_dim);
  TANDEM_CHECK(a.q_pos.numel() == n_tok && a.window >= 0);
  const int64_t group = n_heads / n_kv;
  std::vector<double> score;
  for (int64_t t = 0; t < n_tok; ++t) {
    const int64_t qp = a.q_pos.ptr<int32_t>()[t];
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t kvh = h / group, qbase = (t * n_heads + h) * head_dim;
      // Visible keys, by the rule of ops.h, one at a time.
      std::vector<int64_t> keys;
      for (int64_t k = kv.begin; k < kv.end; ++k) {
        const bool causal_ok = !a.causal || k <= qp;
        const bool window_ok = a.window == 0 || k > qp - a.window;
        if (causal_ok && window_ok) keys.push_back(k);
      }
      score.assign(keys.size(), 0.0);
      double mx = -std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < keys.size(); ++i) {
        const int64_t slot = kv.slot(keys[i]);
        double dot = 0;
        for (int64_t d = 0; d < head_dim; ++d) dot += ld(a.q, qbase + d) * ld(kv.k, kv_offset(kv.k, kvh, slot, d));
        score[i] = dot * a.scale;
        mx = std::max(mx, score[i]);
      }
      double denom = 0;
      for (double& s : score) {
        s = std::exp(s - mx);
        denom += s;
      }
      for (int64_t d = 0; d < head_dim; ++d) {
        double acc = 0;
        for (size_t i = 0; i < keys.size(); ++i)
          acc += score[i] * ld(kv.v, kv_offset(kv.v, kvh, kv.slot(keys[i]), d));
        st(a.out, qbase + d, keys.empty() ? 0.0 : acc / denom);  // no visible key: zeros, not 0/0
      }
    }
  }
}

void gelu_mul(const GeluMulArgs& a) {
  check_float(a.out, "out");
  check_float(a.gate, "gate");
  if (a.up.is_contiguous()) check_float(a.up, "up");
  TANDEM_CHECK(a.out.numel() == a.gate.numel() && a.up.numel() == a.gate.numel());
  const bool strided = !a.up.is_contiguous();
  TANDEM_CHECK_MSG(!strided || (a.up.ndim == 2 && a.up.stride[1] == 1 && a.up.stride[0] >= a.up.shape[1]),
                   "gelu_mul up %s: only rows may be strided", a.up.describe().c_str());
  const int64_t d = a.up.dim(-1);
  for (int64_t i = 0; i < a.gate.numel(); ++i) {
    const int64_t ui = strided ? i / d * a.up.stride[0] + i % d : i;
    st(a.out, i, gelu_tanh_d(ld(a.gate, i)) * ld(a.up, ui));
  }
}

void add(const AddArgs& a) {
  check_float(a.out, "out");
  check_float(a.a, "a");
  check_float(a.b, "b");
  TANDEM_CHECK(a.out.numel() == a.a.numel() && a.b.numel() == a.a.numel());
  for (int64_t i = 0; i < a.a.numel(); ++i) st(a.out, i, ld(a.a, i) + ld(a.b, i) * a.b_scale);
}

void scale(const ScaleArgs& a) {
  check_float(a.x, "x");
  for (int64_t i = 0; i < a.x.numel(); ++i) st(a.x, i, ld(a.x, i) * a.s);
}

void softcap(const SoftcapArgs& a) {
  check_float(a.x, "x");
  TANDEM_CHECK(a.cap > 0.f);
  for (int64_t i = 0; i < a.x.numel(); ++i) st(a.x, i, a.cap * std::tanh(ld(a.x, i) / a.cap));
}

void argmax(const ArgmaxArgs& a) {
  check_float(a.x, "x");
  check_i32(a.out, "out");
  const int64_t rows = a.x.rows(), n = a.x.dim(-1);
  TANDEM_CHECK(a.out.numel() == rows && n > 0);
  if (!a.ids.empty()) {  // element i stands for token ids[i]: ties (NaNs included) to the lowest id
    check_i32(a.ids, "ids");
    TANDEM_CHECK(rows == 1 && a.ids.numel() == n);
    const int32_t* id = a.ids.ptr<int32_t>();
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
      const double v = ld(a.x, i), b = ld(a.x, best);
      const bool vn = std::isnan(v), bn = std::isnan(b);
      const bool wins = (vn || bn) ? (vn && (!bn || id[i] < id[best])) : (v > b || (v == b && id[i] < id[best]));
      if (wins) best = i;
    }
    a.out.ptr<int32_t>()[0] = id[best];
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
      const double v = ld(a.x, r * n + i), b = ld(a.x, r * n + best);
      if (std::isnan(b)) break;                 // the first NaN wins (torch semantics)
      if (std::isnan(v) || v > b) best = i;     // strictly greater: ties keep the lowest index
    }
    a.out.ptr<int32_t>()[r] = static_cast<int32_t>(best);
  }
}

void moe_route(const MoeRouteArgs& a) {
  check_float(a.logits, "logits");
  check_float(a.per_expert_scale, "per_expert_scale");
  check_i32(a.idx, "idx");
  check_float(a.weights, "weights");
  const int64_t n_tok = a.logits.rows(), n_exp = a.logits.dim(-1), k = a.k;
  TANDEM_CHECK(k >= 1 && k <= n_exp && a.per_expert_scale.numel() == n_exp);
  TANDEM_CHECK(a.idx.numel() == n_tok * k && a.weights.numel() == n_tok * k);
  std::vector<double> prob(static_cast<size_t>(n_exp));
  std::vector<bool> taken(static_cast<size_t>(n_exp));
  for (int64_t t = 0; t < n_tok; ++t) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t e = 0; e < n_exp; ++e) mx = std::max(mx, ld(a.logits, t * n_exp + e));
    double total = 0;
    for (int64_t e = 0; e < n_exp; ++e) total += prob[e] = std::exp(ld(a.logits, t * n_exp + e) - mx);
    for (double& p : prob) p /= total;  // softmax over all experts
    std::fill(taken.begin(), taken.end(), false);
    std::vector<int64_t> sel;
    double sel_sum = 0;
    for (int64_t j = 0; j < k; ++j) {  // top-k by repeated selection: strictly greater, so ties go to the lower index
      int64_t best = -1;
      for (int64_t e = 0; e < n_exp; ++e)
        if (!taken[e] && (best < 0 || ld(a.logits, t * n_exp + e) > ld(a.logits, t * n_exp + best))) best = e;
      taken[best] = true;
      sel.push_back(best);
      sel_sum += prob[best];
    }
    for (int64_t j = 0; j < k; ++j) {
      a.idx.ptr<int32_t>()[t * k + j] = static_cast<int32_t>(sel[j]);
      st(a.weights, t * k + j, prob[sel[j]] / sel_sum * ld(a.per_expert_scale, sel[j]));
    }
  }
}

void moe_experts(const MoeExpertsArgs& a) {
  check_float(a.out, "out");
  check_float(a.x, "x");
  check_float(a.gate_up, "gate_up");
  check_float(a.down, "down");
  check_i32(a.idx, "idx");
  check_float(a.weights, "weights");
  TANDEM_CHECK(a.gate_up.ndim == 3 && a.down.ndim == 3);
  const int64_t n_exp = a.gate_up.shape[0], d_ff = a.gate_up.shape[1] / 2, d_model = a.gate_up.shape[2];
  const int64_t n_tok = a.x.rows(), k = a.idx.dim(-1);
  TANDEM_CHECK(a.gate_up.shape[1] == 2 * d_ff && a.down.shape[0] == n_exp && a.down.shape[1] == d_model &&
               a.down.shape[2] == d_ff);
  TANDEM_CHECK(a.x.dim(-1) == d_model && a.out.numel() == a.x.numel());
  TANDEM_CHECK(a.idx.numel() == n_tok * k && a.weights.numel() == n_tok * k);
  std::vector<double> h(static_cast<size_t>(d_ff)), acc(static_cast<size_t>(d_model));
  for (int64_t t = 0; t < n_tok; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = a.idx.ptr<int32_t>()[t * k + j];
      TANDEM_CHECK_MSG(e >= 0 && e < n_exp, "expert index %lld of %lld", static_cast<long long>(e),
                       static_cast<long long>(n_exp));
      const int64_t gu = e * 2 * d_ff * d_model, dn = e * d_model * d_ff;
      for (int64_t f = 0; f < d_ff; ++f) {
        double g = 0, u = 0;
        for (int64_t i = 0; i < d_model; ++i) {
          const double xi = ld(a.x, t * d_model + i);
          g += xi * ld(a.gate_up, gu + f * d_model + i);
          u += xi * ld(a.gate_up, gu + (d_ff + f) * d_model + i);
        }
        h[f] = gelu_tanh_d(g) * u;
      }
      const double w = ld(a.weights, t * k + j);
      for (int64_t o = 0; o < d_model; ++o) {
        double y = 0;
        for (int64_t f = 0; f < d_ff; ++f) y += ld(a.down, dn + o * d_ff + f) * h[f];
        acc[o] += w * y;
      }
    }
    for (int64_t o = 0; o < d_model; ++o) st(a.out, t * d_model + o, acc[o]);
  }
}

}  // namespace tandem::ref
