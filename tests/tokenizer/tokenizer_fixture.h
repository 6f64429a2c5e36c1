// Builds small tokenizer.json documents for the unit tests, in the shape Gemma checkpoints use (Replace
// normalizer, Split pre-tokenizer, BPE with byte fallback, <bos> template, Replace/ByteFallback/Fuse decoder).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace tandem::tok::testing {

struct FixtureSpec {
  std::vector<std::string> tokens;                          // model vocabulary after specials and bytes
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  bool merges_as_strings = false;                           // "a b" instead of ["a", "b"]
  bool gemma_pipeline = true;                               // normalizer/pre-tokenizer/decoder/post as Gemma
  nlohmann::json extra_added = nlohmann::json::array();     // more added_tokens entries
};

// Ids: <pad>=0 <eos>=1 <bos>=2 <unk>=3, <0x00>..<0xFF>=4..259, then spec.tokens from 260.
inline nlohmann::json make_tokenizer_json(const FixtureSpec& spec) {
  using nlohmann::json;
  json vocab = json::object();
  int id = 0;
  for (const char* s : {"<pad>", "<eos>", "<bos>", "<unk>"}) vocab[s] = id++;
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    vocab[buf] = id++;
  }
  for (const std::string& t : spec.tokens) {
    if (!vocab.contains(t)) vocab[t] = id++;
  }
  json merges = json::array();
  for (const auto& [a, b] : spec.merges) {
    if (spec.merges_as_strings) {
      merges.push_back(a + " " + b);
    } else {
      merges.push_back(json::array({a, b}));
    }
  }
  json added = json::array();
  for (int i = 0; i < 4; ++i) {
    static const char* names[] = {"<pad>", "<eos>", "<bos>", "<unk>"};
    added.push_back({{"id", i},
                     {"content", names[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  for (const json& a : spec.extra_added) added.push_back(a);
  json j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added}};
  if (spec.gemma_pipeline) {
    j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}};
    j["pre_tokenizer"] = {
        {"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}};
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", json::array({{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
                                                   {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                           {"pair", json::array()},
                           {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {2}}, {"tokens", {"<bos>"}}}}}}};
    j["decoder"] = {
        {"type", "Sequence"},
        {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}}})}};
  } else {
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = nullptr;
    j["post_processor"] = nullptr;
    j["decoder"] = {{"type", "Sequence"}, {"decoders", json::array({{{"type", "ByteFallback"}}, {{"type", "Fuse"}}})}};
  }
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", "<unk>"},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", true},
                {"byte_fallback", true},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merges}};
  return j;
}

}  // namespace tandem::tok::testing
