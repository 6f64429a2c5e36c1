// safetensors reading: mmap, single file or sharded (model.safetensors.index.json), zero-copy host views.
// Every header is validated before any tensor is handed out: JSON well-formed, known dtypes, shape x dtype size
// equal to the byte range, ranges inside the file, no overlaps, no gaps past the header; errors name the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "tensor/tensor.h"

namespace tandem {

class MappedFile;  // io/mapped_file.h

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the mmapped file
  uint64_t nbytes = 0;
  int file_index = 0;  // which shard

  [[nodiscard]] int64_t numel() const;
  [[nodiscard]] std::string shape_str() const;  // "[262144, 1536]"
  // A host Tensor view (read-only memory; do not write through it). Requires rank <= kMaxDims: the header
  // accepts any rank (tower tensors are never viewed), so check shape.size() before viewing unknown tensors.
  [[nodiscard]] Tensor view() const;
};

// Parses and validates one safetensors header. `file_size` is the whole file's size; `bytes` points at the
// file start (at least the 8-byte length and the header must be readable). Used by SafetensorsFile and fuzzing.
Result<std::vector<TensorInfo>> parse_safetensors_header(const uint8_t* bytes, uint64_t file_size,
                                                         const std::string& file_name);

// A set of safetensors files forming one checkpoint.
class SafetensorsModel {
 public:
  SafetensorsModel();
  ~SafetensorsModel();
  SafetensorsModel(SafetensorsModel&&) noexcept;
  SafetensorsModel& operator=(SafetensorsModel&&) noexcept;

  // `path` is a directory (model.safetensors, or model.safetensors.index.json + shards) or one .safetensors file.
  static Result<SafetensorsModel> open(const std::string& path);
  // A checkpoint whose tensors live in memory the caller owns (synthetic models for benchmarks). `name` stands in
  // for the file name in error messages.
  static SafetensorsModel from_memory(std::vector<TensorInfo> tensors, const std::string& name);

  [[nodiscard]] const TensorInfo* find(std::string_view name) const;                 // nullptr if absent
  [[nodiscard]] const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by name
  [[nodiscard]] const std::vector<std::string>& files() const { return files_; }
  [[nodiscard]] uint64_t total_tensor_bytes() const;

 private:
  friend struct SafetensorsLoader;  // safetensors.cc: fills the members while opening
  std::vector<std::unique_ptr<MappedFile>> maps_;
  std::vector<std::string> files_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace tandem
