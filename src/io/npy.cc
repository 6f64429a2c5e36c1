// .npy reading and writing (see npy.h): little-endian '<f4', '<i4', '<i8' arrays in C order. The header dict is
// parsed field by field and checked against the data size; anything else is a clear error.
#include "io/npy.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/strings.h"
#include "io/mapped_file.h"

namespace tandem {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

const char* descr_of(DType t) {
  switch (t) {
    case DType::kF32: return "<f4";
    case DType::kI32: return "<i4";
    case DType::kI64: return "<i8";
    default: return nullptr;
  }
}

// A tiny cursor over the Python-literal header dict: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
struct HeaderParser {
  std::string_view s;
  size_t i = 0;

  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  bool string(std::string* out) {
    ws();
    if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) return false;
    char q = s[i++];
    size_t start = i;
    while (i < s.size() && s[i] != q) ++i;
    if (i >= s.size()) return false;
    *out = std::string(s.substr(start, i - start));
    ++i;
    return true;
  }
  bool word(std::string* out) {
    ws();
    size_t start = i;
    while (i < s.size() && std::isalpha(static_cast<unsigned char>(s[i]))) ++i;
    *out = std::string(s.substr(start, i - start));
    return !out->empty();
  }
  bool integer(int64_t* out) {
    ws();
    size_t start = i;
    int64_t v = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) return false;
      v = v * 10 + (s[i++] - '0');
    }
    if (i < s.size() && s[i] == 'L') ++i;  // Python 2 longs
    *out = v;
    return i > start;
  }
  bool tuple(std::vector<int64_t>* out) {
    if (!eat('(')) return false;
    if (eat(')')) return true;
    while (true) {
      int64_t v = 0;
      if (!integer(&v)) return false;
      out->push_back(v);
      if (eat(')')) return true;
      if (!eat(',')) return false;
      if (eat(')')) return true;
    }
  }
};

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<NpyArray> parse_npy(const uint8_t* bytes, size_t size, const std::string& source) {
  const char* src = source.c_str();
  if (size < kMagicLen + 4 || std::memcmp(bytes, kMagic, kMagicLen) != 0) {
    return corrupt(strfmt("%s: not a .npy file (bad magic)", src));
  }
  const int major = bytes[6];
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = bytes[8] | (static_cast<size_t>(bytes[9]) << 8);
    header_start = 10;
  } else if (major == 2) {
    if (size < 12) return corrupt(strfmt("%s: truncated .npy header", src));
    header_len = bytes[8] | (static_cast<size_t>(bytes[9]) << 8) | (static_cast<size_t>(bytes[10]) << 16) |
                 (static_cast<size_t>(bytes[11]) << 24);
    header_start = 12;
  } else {
    return unsupported(strfmt("%s: .npy format version %d.%d is not supported (1.0, 2.0)", src, major, bytes[7]));
  }
  if (header_len > size - header_start) return corrupt(strfmt("%s: .npy header runs past the end of the file", src));

  HeaderParser p{std::string_view(reinterpret_cast<const char*>(bytes + header_start), header_len)};
  std::string descr;
  bool have_descr = false, have_order = false, have_shape = false;
  std::vector<int64_t> shape;
  if (!p.eat('{')) return corrupt(strfmt("%s: .npy header is not a dict", src));
  while (!p.eat('}')) {
    std::string key;
    if (!p.string(&key) || !p.eat(':')) return corrupt(strfmt("%s: malformed .npy header", src));
    if (key == "descr") {
      if (!p.string(&descr)) return corrupt(strfmt("%s: .npy descr is not a string", src));
      have_descr = true;
    } else if (key == "fortran_order") {
      std::string w;
      if (!p.word(&w) || (w != "True" && w != "False")) {
        return corrupt(strfmt("%s: .npy fortran_order is not a bool", src));
      }
      if (w == "True") return unsupported(strfmt("%s: Fortran-ordered .npy arrays are not supported", src));
      have_order = true;
    } else if (key == "shape") {
      if (!p.tuple(&shape)) return corrupt(strfmt("%s: .npy shape is not a tuple of integers", src));
      have_shape = true;
    } else {
      return corrupt(strfmt("%s: unknown .npy header key '%s'", src, key.c_str()));
    }
    if (!p.eat(',')) {
      if (!p.eat('}')) return corrupt(strfmt("%s: malformed .npy header", src));
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape) {
    return corrupt(strfmt("%s: .npy header lacks descr, fortran_order or shape", src));
  }
  NpyArray a;
  if (descr == "<f4") {
    a.dtype = DType::kF32;
  } else if (descr == "<i4") {
    a.dtype = DType::kI32;
  } else if (descr == "<i8") {
    a.dtype = DType::kI64;
  } else {
    return unsupported(strfmt("%s: .npy dtype '%s' is not supported ('<f4', '<i4', '<i8')", src, descr.c_str()));
  }
  // Every partial product in the int64 range, not only the total: NpyArray::numel() multiplies in this order, and a
  // zero dimension late in the shape would otherwise hide an overflow before it.
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) ||
        numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return corrupt(strfmt("%s: .npy shape overflows", src));
    }
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, dtype_size(a.dtype), &nbytes)) {
    return corrupt(strfmt("%s: .npy shape overflows", src));
  }
  const size_t data_start = header_start + header_len;
  if (nbytes != size - data_start) {
    return corrupt(strfmt("%s: .npy shape needs %llu data bytes but the file has %zu", src,
                          static_cast<unsigned long long>(nbytes), size - data_start));
  }
  a.shape = std::move(shape);
  a.bytes.assign(bytes + data_start, bytes + size);
  return a;
}

Result<NpyArray> read_npy(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(auto map, MappedFile::open(path));
  return parse_npy(map->data(), map->size(), path);
}

Status write_npy(const std::string& path, DType dtype, const std::vector<int64_t>& shape, const void* data) {
  const char* descr = descr_of(dtype);
  if (descr == nullptr) {
    return unsupported(strfmt("%s: cannot write %s arrays as .npy (f32, i32, i64)", path.c_str(), dtype_name(dtype)));
  }
  std::string dims;
  uint64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) return invalid_argument(strfmt("%s: negative dimension in .npy shape", path.c_str()));
    dims += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dims += ",";
    if (i + 1 < shape.size()) dims += " ";
    numel *= static_cast<uint64_t>(shape[i]);
  }
  std::string header = strfmt("{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, dims.c_str());
  // Pad with spaces so that magic + version + length + header (ending in '\n') is a multiple of 64.
  const size_t unpadded = kMagicLen + 2 + 2 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  if (header.size() > 0xffff) return invalid_argument(strfmt("%s: .npy header too long", path.c_str()));

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return io_error(strfmt("%s: cannot open for writing: %s", path.c_str(), std::strerror(errno)));
  const uint16_t len = static_cast<uint16_t>(header.size());
  const uint8_t prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(len & 0xff),
                              static_cast<uint8_t>(len >> 8)};
  const size_t nbytes = numel * dtype_size(dtype);
  bool ok = std::fwrite(prefix, 1, sizeof prefix, f) == sizeof prefix &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            (nbytes == 0 || std::fwrite(data, 1, nbytes, f) == nbytes);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return io_error(strfmt("%s: write failed", path.c_str()));
  return ok_status();
}

}  // namespace tandem
