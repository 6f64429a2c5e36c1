// Ids back to text, the way HF tokenizers' decoders do it (Replace, ByteFallback, Fuse, Strip, Sequence), as a
// streaming state machine: StreamDecoder takes ids one at a time and emits only text that no later id can
// change, so a character split over several byte-fallback tokens (<0xF0><0x9F><0x98><0x80>) is emitted whole,
// once, and never as a broken UTF-8 sequence. Tokenizer::decode runs the same machine over all ids, so
// streaming and one-shot decoding agree by construction.
//
// HF semantics kept exactly: a run of byte tokens is decoded as one unit when the next non-byte token (or the
// end) arrives: valid UTF-8 -> that text, otherwise one U+FFFD per byte of the run. Decoders before the first
// Fuse act per token; Replace and Strip after a Fuse act on the whole text (Strip's leading cut is applied as
// text starts, its trailing cut and partial Replace matches are held back until more text or finish()).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tandem::tok {

class Tokenizer;

struct DecoderStep {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip };
  Kind kind = Kind::kFuse;
  std::string pattern;  // Replace: literal searched for
  std::string content;  // Replace: replacement; Strip: the character stripped (UTF-8)
  int start = 0;        // Strip: at most this many leading `content` characters
  int stop = 0;         // Strip: at most this many trailing ones
};

class DecoderConfig {
 public:
  // `j` is the "decoder" value; null means HF's default (join tokens with " ").
  static Result<DecoderConfig> from_json(const nlohmann::json& j);
  [[nodiscard]] const std::vector<DecoderStep>& steps() const { return steps_; }
  // Index of the first Fuse (steps before it act per token), or steps().size().
  [[nodiscard]] size_t fuse_index() const { return fuse_index_; }
  // No decoder at all: HF joins the token strings with single spaces.
  [[nodiscard]] bool join_with_spaces() const { return join_with_spaces_; }

 private:
  Status add(const nlohmann::json& j);
  std::vector<DecoderStep> steps_;
  size_t fuse_index_ = 0;
  bool join_with_spaces_ = false;
};

class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);
  // Feeds one id; appends to `*out` the text that became final (often the token's text, sometimes nothing).
  // Ids outside the vocabulary are ignored, as HF's decode does.
  void push(int32_t id, std::string* out);
  // Convenience: push() and return what became final.
  [[nodiscard]] std::string push(int32_t id) {
    std::string s;
    push(id, &s);
    return s;
  }
  // End of the stream: appends everything still held back. The decoder is then ready for a new stream.
  void finish(std::string* out);
  [[nodiscard]] std::string finish() {
    std::string s;
    finish(&s);
    return s;
  }
  // Drops held-back state and starts a new stream.
  void reset();

 private:
  void run(size_t step, std::string token, std::string* out);
  void flush_bytes(size_t step, std::string* out);
  void emit_text(std::string_view text, std::string* out);
  void post_fuse(size_t k, std::string_view text, bool final, std::string* out);

  const Tokenizer* tok_;
  bool skip_special_;
  size_t n_tokens_ = 0;
  // Per step: pending byte-fallback bytes (ByteFallback) or held-back text (post-Fuse Replace / Strip).
  std::vector<std::string> held_;
  // Post-Fuse Strip: leading characters already cut, and whether text has started.
  std::vector<int> lead_cut_;
  std::vector<bool> started_;
};

}  // namespace tandem::tok
