// UTF-8 validation, decoding and Python-compatible whitespace stripping (see utf8.h).
#include "tokenizer/utf8.h"

#include "core/strings.h"

namespace tandem::tok {

size_t utf8_invalid_offset(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // Fast path over ASCII, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const uint8_t b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    const int len = utf8_seq_len(b);
    if (len == 0 || i + static_cast<size_t>(len) > n) return i;
    const uint8_t b1 = p[i + 1];
    if ((b1 & 0xC0) != 0x80) return i;
    if (len == 3) {
      if (b == 0xE0 && b1 < 0xA0) return i;   // overlong
      if (b == 0xED && b1 >= 0xA0) return i;  // surrogate
      if ((p[i + 2] & 0xC0) != 0x80) return i;
    } else if (len == 4) {
      if (b == 0xF0 && b1 < 0x90) return i;   // overlong
      if (b == 0xF4 && b1 >= 0x90) return i;  // above U+10FFFF
      if ((p[i + 2] & 0xC0) != 0x80 || (p[i + 3] & 0xC0) != 0x80) return i;
    }
    i += static_cast<size_t>(len);
  }
  return n;
}

Status validate_utf8(std::string_view s, const char* what) {
  const size_t bad = utf8_invalid_offset(s);
  if (bad == s.size()) return ok_status();
  return invalid_argument(
      strfmt("%s: invalid UTF-8 at byte %zu (0x%02X)", what, bad, static_cast<unsigned>(static_cast<uint8_t>(s[bad]))));
}

char32_t utf8_decode(std::string_view s, size_t i, int* len) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + i;
  const uint8_t b = p[0];
  if (b < 0x80) {
    *len = 1;
    return b;
  }
  if (b < 0xE0) {
    *len = 2;
    return (static_cast<char32_t>(b & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (b < 0xF0) {
    *len = 3;
    return (static_cast<char32_t>(b & 0x0F) << 12) | (static_cast<char32_t>(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  *len = 4;
  return (static_cast<char32_t>(b & 0x07) << 18) | (static_cast<char32_t>(p[1] & 0x3F) << 12) |
         (static_cast<char32_t>(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

void utf8_append(std::string* out, char32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_python_space(char32_t cp) {
  // CPython's _PyUnicode_IsWhitespace: bidirectional types WS, B, S plus category Zs.
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x1F:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string_view python_strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    int len = 0;
    const char32_t cp = utf8_decode(s, begin, &len);
    if (!is_python_space(cp)) break;
    begin += static_cast<size_t>(len);
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    int len = 0;
    const char32_t cp = utf8_decode(s, start, &len);
    if (!is_python_space(cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

}  // namespace tandem::tok
