// MappedFile: a whole file mapped read-only into memory (mmap), the zero-copy backing of safetensors tensors.
// Opening fails with a Status naming the path and the problem (missing, a directory, empty, no permission).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace tandem {

class MappedFile {
 public:
  // Maps `path` read-only. Empty files are rejected (nothing to map, and no valid checkpoint file is empty).
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  [[nodiscard]] const uint8_t* data() const { return data_; }
  [[nodiscard]] uint64_t size() const { return size_; }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, uint64_t size) : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Reads a whole (small) text file such as config.json. Same error conventions as MappedFile::open, except that
// an empty file is returned as an empty string.
Result<std::string> read_text_file(const std::string& path);

// True when `path` names an existing regular file / directory.
[[nodiscard]] bool is_regular_file(const std::string& path);
[[nodiscard]] bool is_directory(const std::string& path);

}  // namespace tandem
