// Strict JSON scanning for tokenizer.json's large sections (see json_scan.h).
#include "tokenizer/json_scan.h"

#include "core/strings.h"
#include "tokenizer/utf8.h"

namespace tandem::tok {
namespace {

constexpr int kMaxDepth = 64;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Status JsonCursor::error(const std::string& what) const {
  return corrupt(strfmt("%s: invalid JSON at byte %zu: %s", source_.c_str(), base_ + pos_, what.c_str()));
}

Status JsonCursor::expect(char c) {
  if (consume(c)) return ok_status();
  if (pos_ >= text_.size()) return error(strfmt("expected '%c', found end of file", c));
  return error(strfmt("expected '%c', found '%c'", c, text_[pos_]));
}

Status JsonCursor::read_string(std::string_view* out, std::string* scratch) {
  skip_ws();
  if (pos_ >= text_.size() || text_[pos_] != '"') return error("expected a string");
  const size_t begin = ++pos_;
  // Fast path: find the closing quote; fall back to decoding if a backslash comes first.
  size_t i = begin;
  while (i < text_.size()) {
    const auto c = static_cast<uint8_t>(text_[i]);
    if (c == '"' || c == '\\' || c < 0x20) break;
    ++i;
  }
  if (i < text_.size() && text_[i] == '"') {
    const std::string_view s = text_.substr(begin, i - begin);
    const size_t bad = utf8_invalid_offset(s);
    if (bad != s.size()) {
      pos_ = begin + bad;
      return error("invalid UTF-8 in string");
    }
    pos_ = i + 1;
    *out = s;
    return ok_status();
  }
  scratch->assign(text_.substr(begin, i - begin));
  pos_ = i;
  while (true) {
    if (pos_ >= text_.size()) return error("unterminated string");
    const auto c = static_cast<uint8_t>(text_[pos_]);
    if (c == '"') {
      ++pos_;
      break;
    }
    if (c < 0x20) return error("control character in string");
    if (c != '\\') {
      scratch->push_back(static_cast<char>(c));
      ++pos_;
      continue;
    }
    if (pos_ + 1 >= text_.size()) return error("unterminated escape");
    const char e = text_[pos_ + 1];
    pos_ += 2;
    switch (e) {
      case '"':
        scratch->push_back('"');
        break;
      case '\\':
        scratch->push_back('\\');
        break;
      case '/':
        scratch->push_back('/');
        break;
      case 'b':
        scratch->push_back('\b');
        break;
      case 'f':
        scratch->push_back('\f');
        break;
      case 'n':
        scratch->push_back('\n');
        break;
      case 'r':
        scratch->push_back('\r');
        break;
      case 't':
        scratch->push_back('\t');
        break;
      case 'u': {
        auto read4 = [&](uint32_t* v) -> bool {
          if (pos_ + 4 > text_.size()) return false;
          uint32_t r = 0;
          for (int k = 0; k < 4; ++k) {
            const int h = hex_value(text_[pos_ + k]);
            if (h < 0) return false;
            r = r * 16 + static_cast<uint32_t>(h);
          }
          pos_ += 4;
          *v = r;
          return true;
        };
        uint32_t cp = 0;
        if (!read4(&cp)) return error("bad \\u escape");
        if (cp >= 0xDC00 && cp <= 0xDFFF) return error("lone low surrogate in \\u escape");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          uint32_t lo = 0;
          if (pos_ + 2 > text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
            return error("lone high surrogate in \\u escape");
          }
          pos_ += 2;
          if (!read4(&lo) || lo < 0xDC00 || lo > 0xDFFF) return error("bad surrogate pair in \\u escape");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        utf8_append(scratch, static_cast<char32_t>(cp));
        break;
      }
      default:
        return error(strfmt("bad escape '\\%c'", e));
    }
  }
  const size_t bad = utf8_invalid_offset(*scratch);
  if (bad != scratch->size()) return error("invalid UTF-8 in string");
  *out = *scratch;
  return ok_status();
}

Status JsonCursor::read_int(int64_t* out) {
  skip_ws();
  const size_t begin = pos_;
  bool neg = false;
  if (pos_ < text_.size() && text_[pos_] == '-') {
    neg = true;
    ++pos_;
  }
  if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') return error("expected an integer");
  if (text_[pos_] == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' && text_[pos_ + 1] <= '9') {
    return error("leading zero in number");
  }
  int64_t v = 0;
  while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
    if (v > (INT64_MAX - 9) / 10) {
      pos_ = begin;
      return error("integer out of range");
    }
    v = v * 10 + (text_[pos_] - '0');
    ++pos_;
  }
  if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
    pos_ = begin;
    return error("expected an integer, found a fraction or exponent");
  }
  *out = neg ? -v : v;
  return ok_status();
}

Status JsonCursor::skip_value(std::string_view* raw) {
  skip_ws();
  const size_t begin = pos_;
  TANDEM_TRY(skip_value_at_depth(0));
  *raw = text_.substr(begin, pos_ - begin);
  return ok_status();
}

Status JsonCursor::skip_value_at_depth(int depth) {
  if (depth > kMaxDepth) return error("nesting too deep");
  skip_ws();
  if (pos_ >= text_.size()) return error("expected a value, found end of file");
  const char c = text_[pos_];
  if (c == '"') {
    std::string_view s;
    std::string scratch;
    return read_string(&s, &scratch);
  }
  if (c == '{') {
    ++pos_;
    if (consume('}')) return ok_status();
    while (true) {
      std::string_view key;
      std::string scratch;
      TANDEM_TRY(read_string(&key, &scratch));
      TANDEM_TRY(expect(':'));
      TANDEM_TRY(skip_value_at_depth(depth + 1));
      if (consume(',')) continue;
      return expect('}');
    }
  }
  if (c == '[') {
    ++pos_;
    if (consume(']')) return ok_status();
    while (true) {
      TANDEM_TRY(skip_value_at_depth(depth + 1));
      if (consume(',')) continue;
      return expect(']');
    }
  }
  for (const char* lit : {"true", "false", "null"}) {
    const std::string_view l(lit);
    if (text_.substr(pos_, l.size()) == l) {
      pos_ += l.size();
      return ok_status();
    }
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    if (c == '-') ++pos_;
    if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') return error("bad number");
    while (pos_ < text_.size()) {
      const char d = text_[pos_];
      if ((d >= '0' && d <= '9') || d == '.' || d == 'e' || d == 'E' || d == '+' || d == '-') {
        ++pos_;
      } else {
        break;
      }
    }
    return ok_status();
  }
  return error(strfmt("unexpected character '%c'", c));
}

}  // namespace tandem::tok
