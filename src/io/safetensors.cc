// safetensors reading (see safetensors.h): header validation exactly as strict as the reference safetensors
// library (ranges tile the data section, sizes agree with shape x dtype, checked arithmetic), plus dtype support,
// alignment, and sharded checkpoints through model.safetensors.index.json. Spec §3.1.
#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>

#include "core/strings.h"
#include "io/json_util.h"
#include "io/mapped_file.h"

namespace tandem {
namespace {

using nlohmann::json;

// The reference library refuses headers above 100 MB; real ones are well under 1 MB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Reads a non-negative JSON integer. Fails for negative, fractional, non-number and too-large values.
Status read_u64(const json& v, const char* what, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return ok_status();
  }
  if (v.is_number_integer()) return corrupt(strfmt("negative %s %lld", what, static_cast<long long>(v.get<int64_t>())));
  if (v.is_number_float()) return corrupt(strfmt("non-integer %s %g", what, v.get<double>()));
  return corrupt(strfmt("%s is a %s, expected a non-negative integer", what, json_kind(v)));
}

Status parse_entry(const std::string& name, const json& e, uint64_t data_size, TensorInfo* t, uint64_t* begin_out) {
  if (!e.is_object()) return corrupt(strfmt("entry is a %s, expected an object", json_kind(e)));
  auto dt = e.find("dtype");
  auto sh = e.find("shape");
  auto off = e.find("data_offsets");
  if (dt == e.end()) return corrupt("missing \"dtype\"");
  if (sh == e.end()) return corrupt("missing \"shape\"");
  if (off == e.end()) return corrupt("missing \"data_offsets\"");
  if (!dt->is_string()) return corrupt(strfmt("dtype is a %s, expected a string", json_kind(*dt)));
  const std::string dts = dt->get<std::string>();
  auto dtype = dtype_from_safetensors(dts);
  if (!dtype) {
    return unsupported(strfmt("dtype \"%s\" is not supported (tandem reads BF16, F16, F32, I32, I64)", dts.c_str()));
  }
  t->name = name;
  t->dtype = *dtype;

  if (!sh->is_array()) return corrupt(strfmt("shape is a %s, expected an array", json_kind(*sh)));
  uint64_t numel = 1;
  bool overflow = false;
  for (const json& d : *sh) {
    uint64_t v = 0;
    TANDEM_TRY(read_u64(d, "dimension", &v).with_context("shape"));
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return corrupt("shape: dimension too large");
    t->shape.push_back(static_cast<int64_t>(v));
    overflow = overflow || __builtin_mul_overflow(numel, v, &numel);
  }
  uint64_t nbytes = 0;
  if (overflow || __builtin_mul_overflow(numel, dtype_size(t->dtype), &nbytes) ||
      numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return corrupt(strfmt("shape %s overflows 64-bit byte counts", shape_to_string(t->shape).c_str()));
  }

  if (!off->is_array() || off->size() != 2) {
    return corrupt(strfmt("data_offsets must be an array [begin, end], got a %s%s", json_kind(*off),
                          off->is_array() ? strfmt(" of %zu elements", off->size()).c_str() : ""));
  }
  uint64_t begin = 0, end = 0;
  TANDEM_TRY(read_u64((*off)[0], "offset", &begin).with_context("data_offsets"));
  TANDEM_TRY(read_u64((*off)[1], "offset", &end).with_context("data_offsets"));
  if (begin > end) {
    return corrupt(strfmt("data_offsets [%llu, %llu] end before they begin", static_cast<unsigned long long>(begin),
                          static_cast<unsigned long long>(end)));
  }
  if (end > data_size) {
    return corrupt(strfmt("data_offsets [%llu, %llu] run past the end of the data section (%llu bytes)",
                          static_cast<unsigned long long>(begin), static_cast<unsigned long long>(end),
                          static_cast<unsigned long long>(data_size)));
  }
  if (end - begin != nbytes) {
    return corrupt(strfmt("shape %s of %s needs %llu bytes but data_offsets [%llu, %llu] span %llu",
                          shape_to_string(t->shape).c_str(), dts.c_str(), static_cast<unsigned long long>(nbytes),
                          static_cast<unsigned long long>(begin), static_cast<unsigned long long>(end),
                          static_cast<unsigned long long>(end - begin)));
  }
  t->nbytes = nbytes;
  *begin_out = begin;
  return ok_status();
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const { return shape_to_string(shape); }

Tensor TensorInfo::view() const {
  TANDEM_CHECK_MSG(shape.size() <= static_cast<size_t>(kMaxDims), "tensor %s has rank %zu; check rank before view()",
                   name.c_str(), shape.size());
  return Tensor::make(const_cast<void*>(data), dtype, shape.data(), static_cast<int>(shape.size()));
}

Result<std::vector<TensorInfo>> parse_safetensors_header(const uint8_t* bytes, uint64_t file_size,
                                                         const std::string& file_name) {
  const char* fname = file_name.c_str();
  if (file_size < 8) {
    return corrupt(strfmt("%s: truncated: %llu bytes cannot hold the 8-byte header length", fname,
                          static_cast<unsigned long long>(file_size)));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian u64
  if (n > file_size - 8) {
    return corrupt(
        strfmt("%s: header length %llu runs past the end of the file (%llu bytes): truncated or not a "
               "safetensors file",
               fname, static_cast<unsigned long long>(n), static_cast<unsigned long long>(file_size)));
  }
  if (n > kMaxHeaderBytes) {
    return corrupt(strfmt("%s: header length %llu is absurdly large (limit %llu)", fname,
                          static_cast<unsigned long long>(n), static_cast<unsigned long long>(kMaxHeaderBytes)));
  }
  const uint64_t data_size = file_size - 8 - n;
  const uint8_t* data_start = bytes + 8 + n;

  TANDEM_ASSIGN_OR_RETURN(json root, parse_json_strict(std::string_view(reinterpret_cast<const char*>(bytes + 8), n),
                                                       file_name + ": header"));
  if (!root.is_object()) return corrupt(strfmt("%s: header is a JSON %s, expected an object", fname, json_kind(root)));

  std::vector<TensorInfo> out;
  std::vector<uint64_t> begins;  // data-section offset of each tensor in `out`
  out.reserve(root.size());
  begins.reserve(root.size());
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    if (key == "__metadata__") {
      if (!it->is_object()) {
        return corrupt(strfmt("%s: __metadata__ is a %s, expected an object", fname, json_kind(*it)));
      }
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return corrupt(strfmt("%s: __metadata__ value \"%s\" is a %s, expected a string", fname, m.key().c_str(),
                                json_kind(*m)));
        }
      }
      continue;
    }
    if (key.empty()) return corrupt(strfmt("%s: a tensor has an empty name", fname));
    TensorInfo t;
    uint64_t begin = 0;
    Status s = parse_entry(key, *it, data_size, &t, &begin);
    if (!s.ok()) return std::move(s).with_context(strfmt("%s: tensor \"%s\"", fname, key.c_str()));
    out.push_back(std::move(t));
    begins.push_back(begin);
  }

  // The byte ranges must tile [0, data_size) exactly: sorted by (begin, end), each starts where the last ended.
  std::vector<size_t> order(out.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto begin_of = [&](size_t i) { return begins[i]; };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    uint64_t ba = begin_of(a), bb = begin_of(b);
    return ba != bb ? ba < bb : out[a].nbytes < out[b].nbytes;
  });
  uint64_t expected = 0;
  const TensorInfo* prev = nullptr;
  for (size_t i : order) {
    const TensorInfo& t = out[i];
    uint64_t b = begin_of(i);
    if (b < expected) {
      return corrupt(strfmt("%s: tensor \"%s\" (bytes [%llu, %llu)) overlaps tensor \"%s\" (ending at %llu)", fname,
                            t.name.c_str(), static_cast<unsigned long long>(b),
                            static_cast<unsigned long long>(b + t.nbytes), prev->name.c_str(),
                            static_cast<unsigned long long>(expected)));
    }
    if (b > expected) {
      return corrupt(strfmt("%s: hole of %llu unused bytes in the data section before tensor \"%s\" (offset %llu)",
                            fname, static_cast<unsigned long long>(b - expected), t.name.c_str(),
                            static_cast<unsigned long long>(b)));
    }
    expected = b + t.nbytes;
    prev = &t;
  }
  if (expected != data_size) {
    return corrupt(strfmt("%s: %llu bytes after the last tensor are not described by the header", fname,
                          static_cast<unsigned long long>(data_size - expected)));
  }

  for (size_t i = 0; i < out.size(); ++i) {
    TensorInfo& t = out[i];
    const uint64_t b = begins[i];
    t.data = data_start + b;
    if (t.nbytes > 0 && reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) != 0) {
      return unsupported(
          strfmt("%s: tensor \"%s\" starts at file offset %llu, not aligned to its %zu-byte dtype %s "
                 "(re-save the checkpoint with the safetensors library, which pads the header)",
                 fname, t.name.c_str(), static_cast<unsigned long long>(8 + n + b), dtype_size(t.dtype),
                 dtype_safetensors_name(t.dtype)));
    }
  }
  return out;
}

// ---- SafetensorsModel --------------------------------------------------------------------------------------

SafetensorsModel::SafetensorsModel() = default;
SafetensorsModel::~SafetensorsModel() = default;
SafetensorsModel::SafetensorsModel(SafetensorsModel&&) noexcept = default;
SafetensorsModel& SafetensorsModel::operator=(SafetensorsModel&&) noexcept = default;

namespace {

constexpr const char* kSingleName = "model.safetensors";
constexpr const char* kIndexName = "model.safetensors.index.json";

std::string dir_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// A shard name from an index must stay inside the checkpoint directory.
bool safe_shard_name(const std::string& s) {
  if (s.empty() || s[0] == '/') return false;
  for (const std::string& part : split(s, '/')) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

}  // namespace

struct SafetensorsLoader {
  // Maps one file and parses its header; tensors get `file_index`.
  static Result<std::vector<TensorInfo>> add_file(SafetensorsModel& m, const std::string& path) {
    TANDEM_ASSIGN_OR_RETURN(auto map, MappedFile::open(path));
    TANDEM_ASSIGN_OR_RETURN(auto infos, parse_safetensors_header(map->data(), map->size(), path));
    const int index = static_cast<int>(m.files_.size());
    for (TensorInfo& t : infos) t.file_index = index;
    m.maps_.push_back(std::move(map));
    m.files_.push_back(path);
    return infos;
  }

  static Status finish(SafetensorsModel& m, std::vector<TensorInfo> all) {
    std::sort(all.begin(), all.end(), [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
    m.tensors_ = std::move(all);
    m.index_.clear();
    for (size_t i = 0; i < m.tensors_.size(); ++i) m.index_.emplace(m.tensors_[i].name, i);
    return ok_status();
  }

  static Status open_sharded(SafetensorsModel& m, const std::string& index_path) {
    const char* ipath = index_path.c_str();
    TANDEM_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
    TANDEM_ASSIGN_OR_RETURN(json root, parse_json_strict(text, index_path));
    if (!root.is_object()) return corrupt(strfmt("%s: is a JSON %s, expected an object", ipath, json_kind(root)));
    auto wm = root.find("weight_map");
    if (wm == root.end()) return corrupt(strfmt("%s: missing \"weight_map\"", ipath));
    if (!wm->is_object()) return corrupt(strfmt("%s: weight_map is a %s, expected an object", ipath, json_kind(*wm)));
    if (wm->empty()) return corrupt(strfmt("%s: weight_map lists no tensors", ipath));

    const std::string dir = dir_of(index_path);
    std::map<std::string, std::string> listed;  // tensor -> shard file name
    std::vector<std::string> shards;            // sorted, unique
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) {
        return corrupt(
            strfmt("%s: weight_map[\"%s\"] is a %s, expected a file name", ipath, it.key().c_str(), json_kind(*it)));
      }
      std::string shard = it->get<std::string>();
      if (!safe_shard_name(shard)) {
        return corrupt(strfmt("%s: weight_map[\"%s\"] = \"%s\" is not a file name inside the checkpoint directory",
                              ipath, it.key().c_str(), shard.c_str()));
      }
      listed.emplace(it.key(), shard);
      shards.push_back(std::move(shard));
    }
    std::sort(shards.begin(), shards.end());
    shards.erase(std::unique(shards.begin(), shards.end()), shards.end());

    std::vector<TensorInfo> all;
    std::map<std::string, std::string> found;  // tensor -> shard that holds it
    for (const std::string& shard : shards) {
      auto infos = add_file(m, dir + "/" + shard);
      if (!infos.ok()) {
        Status s = infos.status();
        return std::move(s).with_context(strfmt("%s lists shard %s", ipath, shard.c_str()));
      }
      for (TensorInfo& t : *infos) {
        auto [pos, fresh] = found.emplace(t.name, shard);
        if (!fresh) {
          return corrupt(strfmt("%s: tensor \"%s\" is in two shards: %s and %s", ipath, t.name.c_str(),
                                pos->second.c_str(), shard.c_str()));
        }
        all.push_back(std::move(t));
      }
    }
    for (const auto& [name, shard] : found) {
      auto l = listed.find(name);
      if (l == listed.end()) {
        return corrupt(strfmt("%s: shard %s holds tensor \"%s\", which the weight_map does not list", ipath,
                              shard.c_str(), name.c_str()));
      }
      if (l->second != shard) {
        return corrupt(strfmt("%s: weight_map puts tensor \"%s\" in %s, but it is in %s", ipath, name.c_str(),
                              l->second.c_str(), shard.c_str()));
      }
    }
    for (const auto& [name, shard] : listed) {
      if (!found.count(name)) {
        return corrupt(strfmt("%s: weight_map puts tensor \"%s\" in %s, which does not contain it", ipath, name.c_str(),
                              shard.c_str()));
      }
    }
    return finish(m, std::move(all));
  }
};

Result<SafetensorsModel> SafetensorsModel::open(const std::string& path) {
  SafetensorsModel m;
  std::string single, index;
  if (is_directory(path)) {
    single = path + "/" + kSingleName;
    index = path + "/" + kIndexName;
    if (is_regular_file(single)) {
      index.clear();
    } else if (is_regular_file(index)) {
      single.clear();
    } else {
      return not_found(strfmt("%s: no %s or %s in this directory", path.c_str(), kSingleName, kIndexName));
    }
  } else if (ends_with(path, ".index.json")) {
    index = path;
  } else {
    single = path;
  }
  if (!index.empty()) {
    TANDEM_TRY(SafetensorsLoader::open_sharded(m, index));
    return m;
  }
  TANDEM_ASSIGN_OR_RETURN(auto infos, SafetensorsLoader::add_file(m, single));
  TANDEM_TRY(SafetensorsLoader::finish(m, std::move(infos)));
  return m;
}

const TensorInfo* SafetensorsModel::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t SafetensorsModel::total_tensor_bytes() const {
  uint64_t n = 0;
  for (const TensorInfo& t : tensors_) n += t.nbytes;
  return n;
}

SafetensorsModel SafetensorsModel::from_memory(std::vector<TensorInfo> tensors, const std::string& name) {
  SafetensorsModel m;
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  m.tensors_ = std::move(tensors);
  for (size_t i = 0; i < m.tensors_.size(); ++i) m.index_.emplace(m.tensors_[i].name, i);
  m.files_.push_back(name);
  return m;
}

}  // namespace tandem
