// A small strict JSON reader for the two large sections of tokenizer.json (model.vocab: 262k entries,
// model.merges: 515k pairs), which nlohmann would take ~0.7 s to turn into a DOM. It walks objects and arrays,
// decodes strings (escapes, surrogate pairs, UTF-8 validation) and returns the raw text of any other value so
// that the small sections can go to nlohmann. Errors are kCorrupt and name the source and byte offset.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace tandem::tok {

class JsonCursor {
 public:
  // `base` is the offset of `text` in the file, for error messages.
  JsonCursor(std::string_view text, std::string source, size_t base = 0)
      : text_(text), source_(std::move(source)), base_(base) {}

  [[nodiscard]] size_t pos() const { return pos_; }
  [[nodiscard]] bool at_end() {
    skip_ws();
    return pos_ >= text_.size();
  }
  // Consumes `c` (after whitespace) if it is next.
  bool consume(char c) {
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  [[nodiscard]] char peek() {
    skip_ws();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  [[nodiscard]] Status expect(char c);
  // Reads a string value. `*out` views either the input (no escapes) or `*scratch` (escapes decoded).
  [[nodiscard]] Status read_string(std::string_view* out, std::string* scratch);
  // Reads an integer value that fits in int64.
  [[nodiscard]] Status read_int(int64_t* out);
  // Skips any value and returns its raw text (validated structurally; strings are fully checked).
  [[nodiscard]] Status skip_value(std::string_view* raw);
  // Error "source: byte N: what".
  [[nodiscard]] Status error(const std::string& what) const;

  void skip_ws() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
      ++pos_;
    }
  }

 private:
  Status skip_value_at_depth(int depth);

  std::string_view text_;
  std::string source_;
  size_t base_ = 0;
  size_t pos_ = 0;
};

}  // namespace tandem::tok
