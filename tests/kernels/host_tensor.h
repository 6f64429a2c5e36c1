// Test helper: an owning host tensor (Buffer + contiguous view) with element get/set in f32, random fills and
// NaN poisoning. Shared by the kernel tests (tests/kernels) and the backend parity tests (tests/backend).
#pragma once

#include <cstdint>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <vector>

#include "tensor/buffer.h"

namespace tandem::testing {

class HostTensor {
 public:
  HostTensor(DType dtype, std::initializer_list<int64_t> shape) {
    Tensor probe = Tensor::make(nullptr, dtype, shape);
    buf_ = Buffer::host(probe.nbytes() ? probe.nbytes() : 1).value();
    t_ = buf_.view(dtype, shape);
  }
  // A tensor holding `values` (rounded to `dtype`).
  HostTensor(DType dtype, std::initializer_list<int64_t> shape, const std::vector<float>& values)
      : HostTensor(dtype, shape) {
    TANDEM_CHECK(static_cast<int64_t>(values.size()) == t_.numel());
    for (size_t i = 0; i < values.size(); ++i) set(static_cast<int64_t>(i), values[i]);
  }

  [[nodiscard]] const Tensor& t() const { return t_; }
  operator const Tensor&() const { return t_; }  // NOLINT(implicit): lets tests pass a HostTensor as an op argument
  [[nodiscard]] int64_t numel() const { return t_.numel(); }

  [[nodiscard]] float get(int64_t i) const {
    if (t_.dtype == DType::kI32) return static_cast<float>(t_.ptr<int32_t>()[i]);
    return load_as_f32(t_.data, t_.dtype, i);
  }
  [[nodiscard]] int32_t geti(int64_t i) const { return t_.ptr<int32_t>()[i]; }
  void set(int64_t i, float v) {
    switch (t_.dtype) {
      case DType::kF32: t_.ptr<float>()[i] = v; break;
      case DType::kBF16: t_.ptr<uint16_t>()[i] = f32_to_bf16(v); break;
      case DType::kF16: t_.ptr<uint16_t>()[i] = f32_to_f16(v); break;
      case DType::kI32: t_.ptr<int32_t>()[i] = static_cast<int32_t>(v); break;
      case DType::kI64: t_.ptr<int64_t>()[i] = static_cast<int64_t>(v); break;
    }
  }
  void seti(int64_t i, int32_t v) { t_.ptr<int32_t>()[i] = v; }
  [[nodiscard]] std::vector<float> values() const {
    std::vector<float> v(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) v[i] = get(i);
    return v;
  }

  void fill(float v) {
    for (int64_t i = 0; i < numel(); ++i) set(i, v);
  }
  void fill_uniform(std::mt19937& rng, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    for (int64_t i = 0; i < numel(); ++i) set(i, d(rng));
  }
  void fill_normal(std::mt19937& rng, float stddev) {
    std::normal_distribution<float> d(0.f, stddev);
    for (int64_t i = 0; i < numel(); ++i) set(i, d(rng));
  }
  // Poison: NaN for float tensors, INT32_MIN for i32, so unwritten outputs are detectable.
  void poison() {
    if (t_.dtype == DType::kI32) {
      for (int64_t i = 0; i < numel(); ++i) seti(i, std::numeric_limits<int32_t>::min());
    } else {
      fill(std::numeric_limits<float>::quiet_NaN());
    }
  }
  void copy_from(const HostTensor& o) {
    TANDEM_CHECK(o.t_.nbytes() == t_.nbytes());
    std::memcpy(t_.data, o.t_.data, t_.nbytes());
  }

 private:
  Buffer buf_;
  Tensor t_;
};

// max |a - b| / max |b| over all elements (normwise relative error); NaN anywhere gives +inf.
inline double rel_error(const HostTensor& got, const HostTensor& want) {
  TANDEM_CHECK(got.numel() == want.numel());
  double max_diff = 0, max_ref = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    if (std::isnan(g) != std::isnan(w)) return std::numeric_limits<double>::infinity();
    if (std::isnan(g)) continue;
    max_diff = std::max(max_diff, std::fabs(g - w));
    max_ref = std::max(max_ref, std::fabs(w));
  }
  return max_ref == 0 ? max_diff : max_diff / max_ref;
}

// True when no element is NaN.
inline bool has_no_nan(const HostTensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::isnan(t.get(i))) return false;
  return true;
}

}  // namespace tandem::testing
