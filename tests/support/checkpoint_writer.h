// Test support: writes synthetic safetensors files (valid, or broken on purpose), sharded checkpoints, and temp
// directories. The byte layout is written out here from the safetensors format description, independently of
// src/io/safetensors.cc, so the reader's tests compare against a separate encoding of the format.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem::testsupport {

struct FakeTensor {
  std::string name;
  std::string dtype;  // safetensors spelling: "BF16", "F32", "I64", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // exactly numel * dtype size bytes
};

// Size of a safetensors dtype name (0 when unknown to this helper).
size_t fake_dtype_size(const std::string& dtype);

// A tensor of the given dtype and shape filled with a deterministic byte pattern (or zeros for empty shapes).
FakeTensor fake_tensor(std::string name, std::string dtype, std::vector<int64_t> shape, uint8_t seed = 1);
// f32 / i64 tensors with explicit values.
FakeTensor f32_tensor(std::string name, std::vector<int64_t> shape, const std::vector<float>& values);
FakeTensor i64_tensor(std::string name, std::vector<int64_t> shape, const std::vector<int64_t>& values);

// The JSON header the writer would produce for `tensors` laid out back to back in order (plus metadata).
nlohmann::json safetensors_header(const std::vector<FakeTensor>& tensors);
// A whole file: 8-byte little-endian header length, header (space-padded to a multiple of 8), data.
std::vector<uint8_t> safetensors_bytes(const std::vector<FakeTensor>& tensors);
// A file from an arbitrary header text and data section (for malformed inputs); `pad8` pads the header.
std::vector<uint8_t> raw_safetensors_bytes(const std::string& header, const std::vector<uint8_t>& data,
                                           bool pad8 = true);

// A fresh empty directory under the test temp dir, removed (recursively) by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const std::vector<uint8_t>& bytes);
void write_file(const std::string& path, const std::string& text);

// Writes `tensors` as one model.safetensors in `dir`.
void write_single_checkpoint(const std::string& dir, const std::vector<FakeTensor>& tensors);
// Writes shards model-0000i-of-0000n.safetensors (tensor k goes to shard shard_of[k]) and the index.
void write_sharded_checkpoint(const std::string& dir, const std::vector<FakeTensor>& tensors,
                              const std::vector<int>& shard_of, int n_shards);
std::string shard_name(int i, int n);

}  // namespace tandem::testsupport
