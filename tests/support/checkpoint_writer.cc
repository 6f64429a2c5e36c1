// Synthetic safetensors writer for tests (see checkpoint_writer.h).
#include "support/checkpoint_writer.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace tandem::testsupport {

size_t fake_dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "BF16" || d == "F16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

static int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

FakeTensor fake_tensor(std::string name, std::string dtype, std::vector<int64_t> shape, uint8_t seed) {
  FakeTensor t{std::move(name), std::move(dtype), std::move(shape), {}};
  const size_t n = static_cast<size_t>(numel_of(t.shape)) * fake_dtype_size(t.dtype);
  t.data.resize(n);
  // Small finite bf16/f32 bit patterns: keep the exponent bytes moderate by masking every byte.
  for (size_t i = 0; i < n; ++i) t.data[i] = static_cast<uint8_t>(((i * 131 + seed * 17) & 0x3f) + 0x10);
  return t;
}

FakeTensor f32_tensor(std::string name, std::vector<int64_t> shape, const std::vector<float>& values) {
  FakeTensor t{std::move(name), "F32", std::move(shape), {}};
  t.data.resize(values.size() * 4);
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

FakeTensor i64_tensor(std::string name, std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  FakeTensor t{std::move(name), "I64", std::move(shape), {}};
  t.data.resize(values.size() * 8);
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

nlohmann::json safetensors_header(const std::vector<FakeTensor>& tensors) {
  nlohmann::json h = nlohmann::json::object();
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (const FakeTensor& t : tensors) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.data.size()}}};
    off += t.data.size();
  }
  return h;
}

std::vector<uint8_t> raw_safetensors_bytes(const std::string& header, const std::vector<uint8_t>& data, bool pad8) {
  std::string h = header;
  if (pad8) {
    while ((8 + h.size()) % 8 != 0) h += ' ';
  }
  std::vector<uint8_t> out(8 + h.size() + data.size());
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, h.data(), h.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + h.size(), data.data(), data.size());
  return out;
}

std::vector<uint8_t> safetensors_bytes(const std::vector<FakeTensor>& tensors) {
  std::vector<uint8_t> data;
  for (const FakeTensor& t : tensors) data.insert(data.end(), t.data.begin(), t.data.end());
  return raw_safetensors_bytes(safetensors_header(tensors).dump(), data, true);
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  const char* base = std::getenv("TEST_TMPDIR");
  std::string root = base ? base : std::filesystem::temp_directory_path().string();
  path_ = root + "/tandem-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  // Restore permissions changed by tests so that removal works.
  for (auto it = std::filesystem::recursive_directory_iterator(path_, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
  }
  std::filesystem::remove_all(path_, ec);
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("cannot write " + path);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_file(const std::string& path, const std::string& text) {
  write_file(path, std::vector<uint8_t>(text.begin(), text.end()));
}

void write_single_checkpoint(const std::string& dir, const std::vector<FakeTensor>& tensors) {
  write_file(dir + "/model.safetensors", safetensors_bytes(tensors));
}

std::string shard_name(int i, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i + 1, n);
  return buf;
}

void write_sharded_checkpoint(const std::string& dir, const std::vector<FakeTensor>& tensors,
                              const std::vector<int>& shard_of, int n_shards) {
  nlohmann::json index;
  uint64_t total = 0;
  for (int s = 0; s < n_shards; ++s) {
    std::vector<FakeTensor> part;
    for (size_t k = 0; k < tensors.size(); ++k) {
      if (shard_of[k] != s) continue;
      part.push_back(tensors[k]);
      index["weight_map"][tensors[k].name] = shard_name(s, n_shards);
      total += tensors[k].data.size();
    }
    write_file(dir + "/" + shard_name(s, n_shards), safetensors_bytes(part));
  }
  index["metadata"] = {{"total_size", total}};
  write_file(dir + "/model.safetensors.index.json", index.dump(2));
}

}  // namespace tandem::testsupport
