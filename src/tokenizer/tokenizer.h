// Tokenizer: a Hugging Face tokenizer.json (as Gemma checkpoints ship it) loaded natively, with encode and
// decode identical to HF tokenizers for the features such files use: added/special tokens matched in the
// input first, normalizer, pre-tokenizer, BPE with byte fallback, the post-processor's BOS, and the decoder.
// Loading the 262k-token Gemma file takes well under a second (a purpose-built scan of vocab and merges).
//
//   auto tok = Tokenizer::load("models/gemma-4-E2B-it");          // directory or path to tokenizer.json
//   Result<std::vector<int32_t>> ids = (*tok)->encode("Hello", {.add_special_tokens = false});
//   std::string text = (*tok)->decode(*ids);
//   StreamDecoder sd = (*tok)->stream_decoder();                 // for generation: push ids, print text
//
// A loaded Tokenizer is immutable; encode/decode are safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/pipeline.h"

namespace tandem::tok {

struct EncodeOptions {
  // Apply the post-processor (Gemma: prepend <bos>). Special-token text in the input is matched either way.
  bool add_special_tokens = true;
};

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory containing one. Errors: kNotFound / kIoError for the file,
  // kCorrupt (bad JSON, missing model, merge naming an unknown token...) and kUnsupported (a model type or
  // pipeline stage HF has but tandem does not implement), all naming the file.
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& path);
  // Same from the JSON text itself; `source` names it in errors.
  static Result<std::unique_ptr<Tokenizer>> from_json_text(std::string_view json_text, const std::string& source);

  // kInvalidArgument with the byte offset if `text` is not valid UTF-8.
  [[nodiscard]] Result<std::vector<int32_t>> encode(std::string_view text, const EncodeOptions& opts = {}) const;
  // HF decode: ids outside the vocabulary are dropped; special tokens are kept unless `skip_special_tokens`.
  [[nodiscard]] std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  [[nodiscard]] StreamDecoder stream_decoder(bool skip_special_tokens = false) const {
    return StreamDecoder(*this, skip_special_tokens);
  }

  // Id of a token (added tokens first, then the model vocabulary), or nullopt.
  [[nodiscard]] std::optional<int32_t> token_to_id(std::string_view token) const;
  // Id of a token that must exist, e.g. "<|turn>": kNotFound naming it and the tokenizer otherwise.
  [[nodiscard]] Result<int32_t> require_token(std::string_view token) const;
  // Text of an id (added tokens first), or nullopt.
  [[nodiscard]] std::optional<std::string_view> id_to_token(int32_t id) const;
  // True for ids whose token is an added token marked "special" (skipped by decode(ids, true)).
  [[nodiscard]] bool is_special(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < special_.size() && special_[static_cast<size_t>(id)];
  }
  // HF get_vocab_size(with_added_tokens=true): model vocabulary plus added tokens not in it.
  [[nodiscard]] int32_t vocab_size() const { return vocab_size_; }
  // One past the largest id any token has (the embedding table must have at least this many rows).
  [[nodiscard]] int32_t id_limit() const { return static_cast<int32_t>(special_.size()); }
  [[nodiscard]] const std::vector<AddedToken>& added_tokens() const { return added_; }
  // Post-processor ids placed before / after a single sequence when add_special_tokens is true.
  [[nodiscard]] const std::vector<int32_t>& prefix_ids() const { return post_.prefix(); }
  [[nodiscard]] const std::vector<int32_t>& suffix_ids() const { return post_.suffix(); }
  [[nodiscard]] const std::string& source() const { return source_; }
  [[nodiscard]] const BpeModel& model() const { return bpe_; }
  [[nodiscard]] const DecoderConfig& decoder_config() const { return decoder_; }

 private:
  Tokenizer() = default;
  Status encode_piece(std::string_view normalized, std::vector<int32_t>* ids) const;

  std::string source_;
  BpeModel bpe_;
  std::vector<AddedToken> added_;
  StringTable added_by_content_;          // content -> index into added_
  std::vector<int32_t> added_of_id_;      // [id_limit] index into added_, -1 if none
  std::vector<bool> special_;             // [id_limit]
  AddedTokenMatcher raw_matcher_;         // normalized=false tokens, matched on the input text
  AddedTokenMatcher normalized_matcher_;  // normalized=true tokens, matched on normalized pieces
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  PostProcessor post_;
  DecoderConfig decoder_;
  int32_t vocab_size_ = 0;
};

}  // namespace tandem::tok
