// Added tokens of a tokenizer.json ("added_tokens": special tokens, control markers, whitespace runs...) and
// how HF tokenizers finds them in input text before the model sees it: a leftmost-longest, non-overlapping scan
// (HF uses Aho-Corasick with MatchKind::LeftmostLongest), first over the raw text with the tokens marked
// normalized=false, then over each normalized remaining piece with the tokens marked normalized=true.
// single_word / lstrip / rstrip follow HF's find_matches.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::tok {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// One piece of a split: [begin, end) of the scanned text, and the index of the added token it is (or -1).
struct SplitPiece {
  size_t begin, end;
  int32_t token;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() { std::fill(std::begin(root_), std::end(root_), -1); }
  // `pattern` is what is searched for (the content, or its normalized form); `token` indexes the token list.
  void add(std::string_view pattern, int32_t token);
  [[nodiscard]] bool empty() const { return n_patterns_ == 0; }
  // Splits `text` into added-token pieces and the pieces between them (empty pieces are not emitted).
  void split(std::string_view text, const std::vector<AddedToken>& tokens, std::vector<SplitPiece>* out) const;

 private:
  struct Node {
    int32_t terminal = -1;                          // token index if a pattern ends here
    std::vector<std::pair<uint8_t, int32_t>> kids;  // sorted by byte
  };
  [[nodiscard]] int32_t child(int32_t node, uint8_t b) const;
  std::vector<Node> nodes_{Node{}};  // node 0 is the root
  int32_t root_[256];                // child of the root for each first byte, -1 if none (the hot lookup)
  int n_patterns_ = 0;
};

}  // namespace tandem::tok
