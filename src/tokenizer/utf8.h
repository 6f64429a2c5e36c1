// UTF-8 helpers for the tokenizer: validation with the offending byte offset, code point iteration, and the
// whitespace set of Python's str.strip() (the chat template's `trim` filter).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace tandem::tok {

// Length of the UTF-8 sequence starting with lead byte `b` (1-4), or 0 for a byte that cannot start one.
[[nodiscard]] inline int utf8_seq_len(uint8_t b) {
  if (b < 0x80) return 1;
  if (b < 0xC2) return 0;  // continuation byte or overlong 2-byte lead
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  if (b < 0xF5) return 4;
  return 0;
}

// Byte offset of the first invalid UTF-8 sequence in `s`, or s.size() if all of `s` is valid (RFC 3629: no
// overlongs, no surrogates, nothing above U+10FFFF).
[[nodiscard]] size_t utf8_invalid_offset(std::string_view s);

// Ok, or kInvalidArgument "<what>: invalid UTF-8 at byte N".
[[nodiscard]] Status validate_utf8(std::string_view s, const char* what);

// Decodes the code point at s[i] (which must start a valid sequence) and returns its byte length in *len.
[[nodiscard]] char32_t utf8_decode(std::string_view s, size_t i, int* len);

// Appends the UTF-8 encoding of `cp` (must be a valid scalar value).
void utf8_append(std::string* out, char32_t cp);

// Python's str.isspace() over one code point: the set `str.strip()` removes.
[[nodiscard]] bool is_python_space(char32_t cp);

// Python's str.strip() with no argument (Jinja's `trim` filter) on valid UTF-8.
[[nodiscard]] std::string_view python_strip(std::string_view s);

}  // namespace tandem::tok
