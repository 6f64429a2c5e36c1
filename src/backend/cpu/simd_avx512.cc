// AVX-512F instance of the CPU vector kernels (simd_impl.inc). Compiled with -mavx512f -mfma -mf16c and only
// reached after simd_select.cc has checked that the running CPU supports AVX-512F.
#include <immintrin.h>

#include "backend/cpu/simd.h"

namespace tandem::cpu {
namespace {

struct V {
  using T = __m512;
  static constexpr int64_t kLanes = 16;
  static constexpr int kTokBlock = 4;  // 4 rows x 4 tokens = 16 accumulators of the 32 zmm registers
  static constexpr int kRowsOneToken = 8;
  static constexpr int kRowsTwoTokens = 6;  // bf16 pairs: 2 x 6 weight + 12 accumulator registers
  static constexpr int64_t kPairLanes = 16;
  static constexpr int kRowsManyTokens = 4;
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float f) { return _mm512_set1_ps(f); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static T load_bf16(const uint16_t* p) {  // bf16 -> f32 is a zero-extend and a 16-bit shift
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // 32 bf16 from 16 words: hi = the odd elements (mask the low half), lo = the even ones (shift left 16).
  static void load_bf16_pair(const uint16_t* p, T& lo, T& hi) {
    const __m512i u = _mm512_loadu_si512(p);
    hi = _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
  static T load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static void keep(T& v) { __asm__("" : "+v"(v)); }  // pins v in a register (see block_kernel)
  static float hsum(T v) { return _mm512_reduce_add_ps(v); }
};

#include "backend/cpu/simd_impl.inc"

}  // namespace

extern const SimdOps kSimdOpsAvx512;
constinit const SimdOps kSimdOpsAvx512 = {"avx512", 16, &linear_rows, &dot, &axpy, &to_f32, &sum, &gelu_mul, &softcap};

}  // namespace tandem::cpu
