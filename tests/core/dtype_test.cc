// bf16 / f16 conversions: round-to-nearest-even like torch, and the bf16 embedding-scale table of spec §1.3.
#include <gtest/gtest.h>

#include <cmath>

#include "tensor/dtype.h"

namespace tandem {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between two bf16 values (1 and 1 + 2^-7): ties go to even (1.0).
  EXPECT_EQ(round_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd mantissa) and 1 + 2^-6: rounds up to even.
  EXPECT_EQ(round_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(INFINITY)), INFINITY);
}

TEST(DType, EmbeddingScaleTable) {
  // Spec §1.3: bf16(sqrt(H)) for each released target.
  EXPECT_EQ(round_bf16(std::sqrt(1536.f)), 39.25f);
  EXPECT_EQ(round_bf16(std::sqrt(2560.f)), 50.5f);
  EXPECT_EQ(round_bf16(std::sqrt(2816.f)), 53.0f);
  EXPECT_EQ(round_bf16(std::sqrt(5376.f)), 73.5f);
  EXPECT_EQ(round_bf16(std::sqrt(256.f)), 16.0f);
}

TEST(DType, F16RoundTrip) {
  for (float f : {0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f, 0.333333f}) {
    float back = f16_to_f32(f32_to_f16(f));
    EXPECT_NEAR(back, f, std::fabs(f) * 1e-3f + 1e-7f) << f;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);  // overflow to inf
}

TEST(DType, Names) {
  EXPECT_EQ(dtype_from_safetensors("BF16"), DType::kBF16);
  EXPECT_FALSE(dtype_from_safetensors("F8_E4M3").has_value());
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
}

}  // namespace
}  // namespace tandem
