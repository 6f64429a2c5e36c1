// The text stages of a tokenizer.json around the model, as HF tokenizers runs them: normalizer (Replace,
// Prepend, Sequence), pre-tokenizer (Split on a literal string with any of HF's five delimiter behaviours,
// Sequence) and post-processor (TemplateProcessing, Roberta/Bert processing, ByteLevel as a no-op, Sequence).
// Anything else is rejected at load time with kUnsupported, so a tokenizer either loads and matches HF or
// does not load.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace tandem::tok {

class Normalizer {
 public:
  // `j` is the "normalizer" value (null = none).
  static Result<Normalizer> from_json(const nlohmann::json& j);
  [[nodiscard]] bool empty() const { return steps_.empty(); }
  // Normalizes `in` into `*out` (cleared first).
  void apply(std::string_view in, std::string* out) const;

 private:
  struct Step {
    bool prepend;         // Prepend(text) when true, else Replace(pattern -> text)
    std::string pattern;  // literal
    std::string text;
  };
  Status add(const nlohmann::json& j);
  std::vector<Step> steps_;
};

class PreTokenizer {
 public:
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  static Result<PreTokenizer> from_json(const nlohmann::json& j);
  // Appends the [begin, end) byte ranges of the words of `text` (the whole text when there are no steps).
  void split(std::string_view text, std::vector<std::pair<size_t, size_t>>* words) const;

 private:
  struct Step {
    std::string pattern;
    Behavior behavior;
    bool invert;
  };
  Status add(const nlohmann::json& j);
  std::vector<Step> steps_;
};

class PostProcessor {
 public:
  // `j` is the "post_processor" value (null = none); the templates carry their own ids.
  static Result<PostProcessor> from_json(const nlohmann::json& j);
  // Wraps the ids of a single sequence with the template's special tokens.
  void apply_single(std::vector<int32_t>* ids) const;
  [[nodiscard]] const std::vector<int32_t>& prefix() const { return prefix_; }
  [[nodiscard]] const std::vector<int32_t>& suffix() const { return suffix_; }

 private:
  Status add(const nlohmann::json& j);
  std::vector<int32_t> prefix_;  // ids before the sequence
  std::vector<int32_t> suffix_;  // ids after it
};

}  // namespace tandem::tok
