// AVX2 + FMA + F16C instance of the CPU vector kernels (simd_impl.inc). Compiled with -mavx2 -mfma -mf16c and
// only reached after simd_select.cc has checked that the running CPU supports all three.
#include <immintrin.h>

#include "backend/cpu/simd.h"

namespace tandem::cpu {
namespace {

struct V {
  using T = __m256;
  static constexpr int64_t kLanes = 8;
  static constexpr int kTokBlock = 2;  // 4 rows x 2 tokens = 8 accumulators of the 16 ymm registers
  static constexpr int kRowsOneToken = 8;
  static constexpr int kRowsTwoTokens = 4;
  static constexpr int kRowsManyTokens = 4;
  static constexpr int64_t kPairLanes = 0;  // no paired bf16 path
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float f) { return _mm256_set1_ps(f); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static T load_bf16(const uint16_t* p) {  // bf16 -> f32 is a zero-extend and a 16-bit shift
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static T load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  // Paired bf16 (see simd.h); unused here (kPairLanes = 0) but kept so the shared kernels compile.
  static void load_bf16_pair(const uint16_t* p, T& lo, T& hi) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    hi = _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static void keep(T& v) { __asm__("" : "+v"(v)); }  // pins v in a register (see block_kernel)
  static float hsum(T v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
};

#include "backend/cpu/simd_impl.inc"

}  // namespace

extern const SimdOps kSimdOpsAvx2;
constinit const SimdOps kSimdOpsAvx2 = {"avx2", 0, &linear_rows, &dot, &axpy, &to_f32, &sum, &gelu_mul, &softcap};

}  // namespace tandem::cpu
