// CPU backend: memory, streams, capability queries and the small row-wise ops (embedding, RMSNorm §1.2, RoPE §1.7,
// GeGLU §1.9, add/scale, soft-cap §1.11, argmax, MoE routing §1.10). linear/MoE experts live in cpu_linear.cc,
// attention and the KV writes in cpu_attention.cc. All math is f32, in the order HF evaluates it.
#include "backend/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numbers>
#include <vector>

#include "backend/cpu/cpu_checks.h"
#include "core/strings.h"

namespace tandem {
namespace cpu {

int simd_type(DType t) {
  switch (t) {
    case DType::kF32: return kSimdF32;
    case DType::kBF16: return kSimdBF16;
    case DType::kF16: return kSimdF16;
    default: TANDEM_CHECK_MSG(false, "no float kernels for dtype %s", dtype_name(t));
  }
  return kSimdF32;
}


CpuBackend::CpuBackend(int threads, const SimdOps& simd)
    : threads_(threads > 0 ? threads : omp_get_max_threads()), simd_(simd) {
  summary_ = strfmt("cpu (%s, %d threads)", simd_.name, threads_);
}

bool CpuBackend::supports(Op op, DType weight_dtype) const {
  return op < Op::kCount && dtype_is_float(weight_dtype);
}

void* CpuBackend::allocate(size_t bytes, MemKind) {
  const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  return std::aligned_alloc(64, rounded);
}

void CpuBackend::deallocate(void* ptr, size_t, MemKind) { std::free(ptr); }

Status CpuBackend::copy(void* dst, const void* src, size_t bytes, CopyKind, StreamId) {
  if (bytes) std::memmove(dst, src, bytes);
  return ok_status();
}

Status CpuBackend::memset_zero(void* dst, size_t bytes, StreamId) {
  if (bytes) std::memset(dst, 0, bytes);
  return ok_status();
}

void CpuBackend::embedding(const EmbeddingArgs& a) {
  check_act(a.out, "embedding out");
  TANDEM_CHECK_MSG(!a.table.empty() && a.table.device.is_cpu() && dtype_is_float(a.table.dtype),
                   "embedding table %s must be a float tensor on the CPU", a.table.describe().c_str());
  check_i32(a.ids, "embedding ids");
  const int64_t n = a.ids.numel(), dim = a.table.dim(1), n_vocab = a.table.dim(0);
  TANDEM_CHECK_MSG(a.table.ndim == 2 && a.table.stride[1] == 1 && a.table.stride[0] >= dim && a.out.rows() == n &&
                       a.out.dim(-1) == dim,
                   "embedding: out %s, table %s",
                   a.out.describe().c_str(), a.table.describe().c_str());
  const int type = simd_type(a.table.dtype);
  const size_t esize = dtype_size(a.table.dtype);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t id = a.ids.ptr<int32_t>()[t];
    TANDEM_CHECK_MSG(id >= 0 && id < n_vocab, "token id %lld outside [0, %lld)", static_cast<long long>(id),
                     static_cast<long long>(n_vocab));
    float* dst = a.out.ptr<float>() + t * dim;
    simd_.to_f32(dst, static_cast<const char*>(a.table.data) + static_cast<size_t>(id * a.table.stride[0]) * esize, type, dim);
    for (int64_t d = 0; d < dim; ++d) dst[d] *= a.scale;
  }
}

namespace {

// One row of rms_norm with its epilogue (ops.h): y = (x * inv) * w, then residual + y, then y * out_scale. Each
// stage is the f32 operation the separate rms_norm, add and scale ops perform, so the fused op matches them bitwise.
void norm_row(float* y, const float* x, const float* w, const float* res, float out_scale, int64_t dim, float eps) {
  double ss = 0;  // the sum of squares in double: cheap, and closer to exact than any f32 order
  for (int64_t d = 0; d < dim; ++d) ss += static_cast<double>(x[d]) * x[d];
  const float ms = static_cast<float>(ss / static_cast<double>(dim));
  const float inv = std::pow(ms + eps, -0.5f);  // pow, not rsqrt, as HF (spec §1.2)
  for (int64_t d = 0; d < dim; ++d) {
    float v = x[d] * inv;
    if (w) v *= w[d];
    if (res) v = res[d] + v;  // read before y[d] is written: out may alias x or residual
    if (out_scale != 1.f) v *= out_scale;
    y[d] = v;
  }
}

// RoPE (spec §1.7) of one token's heads, x [n_heads, head_dim], in place. Shared by rope() and rms_norm's RoPE
// epilogue so both compute the same bits.
void rope_token(float* x, int64_t n_heads, int64_t head_dim, float pos, const float* f) {
  const int64_t half = head_dim / 2;
  for (int64_t j = 0; j < half; ++j) {
    if (f[j] == 0.f) continue;  // unrotated pair of proportional RoPE: bit-for-bit unchanged
    const float angle = pos * f[j];
    const float c = std::cos(angle), s = std::sin(angle);
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + h * head_dim;
      const float x1 = xh[j], x2 = xh[j + half];
      xh[j] = x1 * c + (-x2) * s;  // x * cos + rotate_half(x) * sin
      xh[j + half] = x2 * c + x1 * s;
    }
  }
}

}  // namespace

void CpuBackend::rms_norm(const RmsNormArgs& a) {
  check_act(a.out, "rms_norm out");
  check_act(a.x, "rms_norm x");
  const int64_t dim = a.x.dim(-1), rows = a.x.rows();
  TANDEM_CHECK(a.out.numel() == a.x.numel() && a.out.dim(-1) == dim);
  const bool has_w = !a.weight.empty(), has_res = !a.residual.empty();
  const bool has_rope = !a.rope_pos.empty() || !a.rope_inv_freq.empty();
  std::vector<float> w;
  if (has_w) {
    check_float(a.weight, "rms_norm weight");
    TANDEM_CHECK(a.weight.numel() == dim);
    w.resize(static_cast<size_t>(dim));
    simd_.to_f32(w.data(), a.weight.data, simd_type(a.weight.dtype), dim);
  }
  if (has_res) {
    check_act(a.residual, "rms_norm residual");
    TANDEM_CHECK(a.residual.numel() == a.out.numel());
  }
  const float* x = a.x.ptr<float>();
  const float* wp = has_w ? w.data() : nullptr;
  float* out = a.out.ptr<float>();
  if (has_rope) {
    check_i32(a.rope_pos, "rms_norm rope_pos");
    check_act(a.rope_inv_freq, "rms_norm rope_inv_freq");
    const int64_t n_tok = a.rope_pos.numel();
    TANDEM_CHECK_MSG(!has_res && a.out_scale == 1.f && dim % 2 == 0 && a.rope_inv_freq.numel() == dim / 2 &&
                         rows % n_tok == 0,
                     "rms_norm with rope: x %s, pos %s, inv_freq %s, residual %s, out_scale %g", a.x.describe().c_str(),
                     a.rope_pos.describe().c_str(), a.rope_inv_freq.describe().c_str(),
                     has_res ? a.residual.describe().c_str() : "none", static_cast<double>(a.out_scale));
    const int64_t n_heads = rows / n_tok;
#pragma omp parallel for num_threads(threads_) schedule(static) if (n_tok > 1)
    for (int64_t t = 0; t < n_tok; ++t) {
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t r = t * n_heads + h;
        norm_row(out + r * dim, x + r * dim, wp, nullptr, 1.f, dim, a.eps);
      }
      rope_token(out + t * n_heads * dim, n_heads, dim, static_cast<float>(a.rope_pos.ptr<int32_t>()[t]),
                 a.rope_inv_freq.ptr<float>());
    }
    return;
  }
  const float* res = has_res ? a.residual.ptr<float>() : nullptr;
#pragma omp parallel for num_threads(threads_) schedule(static) if (rows * dim > 65536)
  for (int64_t r = 0; r < rows; ++r)
    norm_row(out + r * dim, x + r * dim, wp, res ? res + r * dim : nullptr, a.out_scale, dim, a.eps);
}

void CpuBackend::rope(const RopeArgs& a) {
  check_act(a.x, "rope x");
  check_i32(a.pos, "rope pos");
  check_act(a.inv_freq, "rope inv_freq");
  TANDEM_CHECK(a.x.ndim == 3);
  const int64_t n_tok = a.x.shape[0], n_heads = a.x.shape[1], head_dim = a.x.shape[2], half = head_dim / 2;
  TANDEM_CHECK(head_dim % 2 == 0 && a.inv_freq.numel() == half && a.pos.numel() == n_tok);
#pragma omp parallel for num_threads(threads_) schedule(static) if (n_tok > 1)
  for (int64_t t = 0; t < n_tok; ++t)
    rope_token(a.x.ptr<float>() + t * n_heads * head_dim, n_heads, head_dim,
               static_cast<float>(a.pos.ptr<int32_t>()[t]), a.inv_freq.ptr<float>());
}

void CpuBackend::gelu_mul(const GeluMulArgs& a) {
  check_act(a.out, "gelu_mul out");
  check_act(a.gate, "gelu_mul gate");
  check_act_rows(a.up, "gelu_mul up");
  const int64_t n = a.gate.numel();
  TANDEM_CHECK(a.out.numel() == n && a.up.numel() == n);
  const float* g = a.gate.ptr<float>();
  const float* u = a.up.ptr<float>();
  float* o = a.out.ptr<float>();
  if (!a.up.is_contiguous()) {  // row-strided up: one row at a time
    const int64_t d = a.up.shape[1], rows = a.up.shape[0];
    for (int64_t t = 0; t < rows; ++t) simd_.gelu_mul(o + t * d, g + t * d, u + t * a.up.stride[0], d);
    return;
  }
  const int64_t chunk = 4096;
#pragma omp parallel for num_threads(threads_) schedule(static) if (n > 16384)
  for (int64_t c = 0; c < n; c += chunk) simd_.gelu_mul(o + c, g + c, u + c, std::min(chunk, n - c));
}

void CpuBackend::add(const AddArgs& a) {
  check_act(a.out, "add out");
  check_act(a.a, "add a");
  check_act(a.b, "add b");
  const int64_t n = a.a.numel();
  TANDEM_CHECK(a.out.numel() == n && a.b.numel() == n);
  const float* x = a.a.ptr<float>();
  const float* y = a.b.ptr<float>();
  float* o = a.out.ptr<float>();
  if (a.b_scale == 1.f) {
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i] * a.b_scale;
  }
}

void CpuBackend::scale(const ScaleArgs& a) {
  check_act(a.x, "scale x");
  float* x = a.x.ptr<float>();
  for (int64_t i = 0, n = a.x.numel(); i < n; ++i) x[i] *= a.s;
}

void CpuBackend::softcap(const SoftcapArgs& a) {
  check_act(a.x, "softcap x");
  TANDEM_CHECK(a.cap > 0.f);
  float* x = a.x.ptr<float>();
  const int64_t n = a.x.numel();
  const int64_t chunk = 4096;
#pragma omp parallel for num_threads(threads_) schedule(static) if (n > 16384)
  for (int64_t c = 0; c < n; c += chunk) simd_.softcap(x + c, std::min(chunk, n - c), a.cap);  // HF: (x / cap).tanh() * cap
}

void CpuBackend::argmax(const ArgmaxArgs& a) {
  check_act(a.x, "argmax x");
  check_i32(a.out, "argmax out");
  if (!a.ids.empty()) {  // element i stands for token ids[i]: ties (NaNs included) to the lowest id
    check_i32(a.ids, "argmax ids");
    const int64_t n = a.x.dim(-1);
    TANDEM_CHECK(a.x.rows() == 1 && a.out.numel() == 1 && a.ids.numel() == n && n > 0);
    const float* x = a.x.ptr<float>();
    const int32_t* id = a.ids.ptr<int32_t>();
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
      const bool vn = std::isnan(x[i]), bn = std::isnan(x[best]);
      if ((vn || bn) ? (vn && (!bn || id[i] < id[best])) : (x[i] > x[best] || (x[i] == x[best] && id[i] < id[best])))
        best = i;
    }
    a.out.ptr<int32_t>()[0] = id[best];
    return;
  }
  const int64_t rows = a.x.rows(), n = a.x.dim(-1);
  TANDEM_CHECK(a.out.numel() == rows && n > 0);
#pragma omp parallel for num_threads(threads_) schedule(static) if (rows > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a.x.ptr<float>() + r * n;
    int64_t best = 0;
    float bv = x[0];
    if (!std::isnan(bv)) {
      for (int64_t i = 1; i < n; ++i) {
        if (x[i] > bv) {  // strictly greater: ties keep the lowest index
          bv = x[i];
          best = i;
        } else if (std::isnan(x[i])) {  // NaN is the maximum; the first one wins
          best = i;
          break;
        }
      }
    }
    a.out.ptr<int32_t>()[r] = static_cast<int32_t>(best);
  }
}

void CpuBackend::moe_route(const MoeRouteArgs& a) {
  check_act(a.logits, "moe_route logits");
  check_float(a.per_expert_scale, "moe_route per_expert_scale");
  check_i32(a.idx, "moe_route idx");
  check_act(a.weights, "moe_route weights");
  const int64_t n_tok = a.logits.rows(), n_exp = a.logits.dim(-1), k = a.k;
  TANDEM_CHECK(k >= 1 && k <= n_exp && a.per_expert_scale.numel() == n_exp);
  TANDEM_CHECK(a.idx.numel() == n_tok * k && a.weights.numel() == n_tok * k);
  std::vector<float> pes(static_cast<size_t>(n_exp)), prob(static_cast<size_t>(n_exp));
  std::vector<char> taken(static_cast<size_t>(n_exp));
  simd_.to_f32(pes.data(), a.per_expert_scale.data, simd_type(a.per_expert_scale.dtype), n_exp);
  for (int64_t t = 0; t < n_tok; ++t) {
    const float* l = a.logits.ptr<float>() + t * n_exp;
    int32_t* idx = a.idx.ptr<int32_t>() + t * k;
    float* w = a.weights.ptr<float>() + t * k;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t e = 0; e < n_exp; ++e) mx = std::max(mx, l[e]);
    float total = 0;
    for (int64_t e = 0; e < n_exp; ++e) total += prob[e] = std::exp(l[e] - mx);
    for (int64_t e = 0; e < n_exp; ++e) prob[e] /= total;  // softmax over all experts, f32 (spec §1.10)
    std::fill(taken.begin(), taken.end(), 0);
    float sel = 0;
    for (int64_t j = 0; j < k; ++j) {  // top-k by logit; strictly greater, so ties go to the lower expert
      int64_t best = -1;
      for (int64_t e = 0; e < n_exp; ++e)
        if (!taken[e] && (best < 0 || l[e] > l[best])) best = e;
      taken[best] = 1;
      idx[j] = static_cast<int32_t>(best);
      sel += prob[best];
    }
    for (int64_t j = 0; j < k; ++j) w[j] = prob[idx[j]] / sel * pes[idx[j]];
  }
}

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_unique<cpu::CpuBackend>(threads, cpu::simd_ops_best());
}

Result<std::unique_ptr<Backend>> make_cpu_backend_with(const CpuBackendOptions& options) {
  const cpu::SimdOps* simd = cpu::simd_ops_named(options.isa.c_str());
  if (simd == nullptr)
    return unsupported(strfmt("cpu backend: instruction set '%s' is unknown or not supported by this CPU/build",
                              options.isa.c_str()));
  return std::unique_ptr<Backend>(std::make_unique<cpu::CpuBackend>(options.threads, *simd));
}

}  // namespace tandem
