// .npy (format v1.0) reading and writing for f32 / i32 / i64 arrays: fixtures in tests and `tandem logits --out`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "tensor/dtype.h"

namespace tandem {

struct NpyArray {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // little-endian, C order
  [[nodiscard]] int64_t numel() const;
  [[nodiscard]] const float* f32() const { return reinterpret_cast<const float*>(bytes.data()); }
  [[nodiscard]] const int32_t* i32() const { return reinterpret_cast<const int32_t*>(bytes.data()); }
  [[nodiscard]] const int64_t* i64() const { return reinterpret_cast<const int64_t*>(bytes.data()); }
};

Result<NpyArray> read_npy(const std::string& path);
// Parses the bytes of a whole .npy file (versions 1.0 and 2.0 read; 1.0 written). `source` names it in errors.
Result<NpyArray> parse_npy(const uint8_t* bytes, size_t size, const std::string& source);
Status write_npy(const std::string& path, DType dtype, const std::vector<int64_t>& shape, const void* data);

}  // namespace tandem
