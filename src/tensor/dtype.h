// Element types and the scalar conversions between them. bf16 rounding is round-to-nearest-even, as PyTorch
// does, because matching transformers bit for bit depends on it (spec §1.13).
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace tandem {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);                          // "f32", "bf16", ...
std::optional<DType> dtype_from_safetensors(std::string_view s);  // "F32", "BF16", "F16", "I32", "I64"
const char* dtype_safetensors_name(DType t);
bool dtype_is_float(DType t);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// Rounds a float to the nearest bf16 value and returns it as float.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Reads element i of a float-typed buffer (f32/bf16/f16) as float.
float load_as_f32(const void* data, DType t, int64_t i);

}  // namespace tandem
