// The BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE", ...}): vocabulary, ranked merges,
// byte fallback to <0xXX> tokens and unknown-token fusing, reproducing HF tokenizers' BPE::merge_word:
// a word starts as one symbol per character (or its UTF-8 bytes as <0xXX> tokens when the character is not in
// the vocabulary), then the adjacent pair with the lowest merge rank (leftmost on ties) is merged until no
// pair has a merge. Words are cut at "safe" points first (before a U+2581 that no merge can join to the
// character before it), which leaves the result unchanged and keeps every BPE run short and cacheable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/hash_tables.h"

namespace tandem::tok {

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  static constexpr int32_t kNoId = -1;

  // Builders, used by the loader in this order: options, vocabulary, merges, finish.
  void set_options(BpeOptions o) { opts_ = std::move(o); }
  void reserve(size_t n_vocab, size_t vocab_bytes, size_t n_merges);
  // False if `token` is already in the vocabulary.
  bool add_token(std::string_view token, int32_t id);
  // Adds merges in rank order (rank = position, counting from `first_rank`). kCorrupt naming the merge if a
  // part or the merged token is not in the vocabulary. Lookups are batched so that cache misses overlap.
  struct MergeText {
    std::string_view a, b;
  };
  [[nodiscard]] Status add_merges(const std::vector<MergeText>& merges, uint32_t first_rank = 0);
  // Precomputes lookup tables; kCorrupt if the vocabulary is unusable.
  [[nodiscard]] Status finish();

  // Appends the ids of one pre-tokenized word. kCorrupt if the unknown token is needed but not in the vocabulary.
  [[nodiscard]] Status encode_word(std::string_view word, std::vector<int32_t>* ids) const;

  [[nodiscard]] int32_t token_to_id(std::string_view token) const {
    const int64_t i = vocab_.find(token);
    return i < 0 ? kNoId : static_cast<int32_t>(vocab_.value(static_cast<size_t>(i)));
  }
  // Token string of `id`, or nullopt.
  [[nodiscard]] std::optional<std::string_view> id_to_token(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= index_of_id_.size() || index_of_id_[id] < 0) return std::nullopt;
    return vocab_.str(static_cast<size_t>(index_of_id_[id]));
  }
  [[nodiscard]] size_t vocab_size() const { return vocab_.size(); }
  // One past the largest vocabulary id.
  [[nodiscard]] int32_t id_limit() const { return static_cast<int32_t>(index_of_id_.size()); }
  [[nodiscard]] size_t merge_count() const { return merges_.size(); }
  [[nodiscard]] const BpeOptions& options() const { return opts_; }

 private:
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // neighbours in the heap path; -1 at the ends
    uint32_t len;        // bytes of the word covered; 0 once merged away
  };
  Status initial_symbols(std::string_view word, std::vector<Symbol>* syms) const;
  static void merge_short(const PairMap& merges, std::vector<Symbol>* syms);
  static void merge_heap(const PairMap& merges, std::vector<Symbol>* syms);
  Status encode_segment(std::string_view seg, std::vector<int32_t>* ids) const;

  BpeOptions opts_;
  StringTable vocab_;                 // token -> id
  std::vector<int32_t> index_of_id_;  // [max id + 1] string index in vocab_, -1 if the id has no token
  PairMap merges_;                    // (a, b) -> (rank, id of a+b)
  int32_t ascii_id_[128];             // id of each one-byte character, kNoId if absent
  int32_t byte_id_[256];              // id of <0xXX>, kNoId if absent
  bool have_all_bytes_ = false;
  int32_t unk_id_ = kNoId;
  // Safe cut points: before U+2581 unless the previous character may end the left side of a merge whose right
  // side starts with U+2581 (`join_before_marker_`), or the previous character is not a vocabulary token.
  bool split_at_marker_ = false;
  std::vector<char32_t> join_before_marker_;
  uint32_t serial_ = 0;  // distinguishes this model's entries in the per-thread segment cache
};

}  // namespace tandem::tok
