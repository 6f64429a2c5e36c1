// Portable instance of the CPU vector kernels (simd_impl.inc) with a one-lane "vector": plain float arithmetic,
// compiled with the project's default flags. Used on CPUs without AVX2 and to test the dispatch.
#include "backend/cpu/simd.h"

namespace tandem::cpu {
namespace {

inline float half_to_float(uint16_t h);  // defined in simd_impl.inc

struct V {
  using T = float;
  static constexpr int64_t kLanes = 1;
  static constexpr int kTokBlock = 4;
  static constexpr int kRowsOneToken = 4;
  static constexpr int kRowsTwoTokens = 4;
  static constexpr int kRowsManyTokens = 4;
  static constexpr int64_t kPairLanes = 0;  // no paired bf16 path
  static T zero() { return 0.f; }
  static T set1(float f) { return f; }
  static T load(const float* p) { return *p; }
  static T load_bf16(const uint16_t* p) {
    const uint32_t bits = static_cast<uint32_t>(*p) << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  }
  static T load_f16(const uint16_t* p) { return half_to_float(*p); }
  // Paired bf16 (see simd.h); unused here (kPairLanes = 0) but kept so the shared kernels compile.
  static void load_bf16_pair(const uint16_t* p, T& lo, T& hi) {
    lo = load_bf16(p);
    hi = load_bf16(p + 1);
  }
  static void store(float* p, T v) { *p = v; }
  static T fmadd(T a, T b, T c) { return a * b + c; }
  static T add(T a, T b) { return a + b; }
  static float hsum(T v) { return v; }
  static void keep(T&) {}
};

#include "backend/cpu/simd_impl.inc"

}  // namespace

const SimdOps& simd_ops_scalar() {
  static constexpr SimdOps kOps = {"scalar", 0, &linear_rows, &dot, &axpy, &to_f32, &sum, &gelu_mul, &softcap};
  return kOps;
}

}  // namespace tandem::cpu
