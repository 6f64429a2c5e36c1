// Added-token matching (see added_vocab.h).
#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace tandem::tok {
namespace {

// Rust regex `\s` (Unicode White_Space).
bool is_white_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Rust regex `\w` (Unicode word character), approximated without Unicode tables: ASCII letters, digits and '_';
// beyond ASCII everything but white space and the common punctuation / symbol blocks.
bool is_word_char(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z') || cp == '_';
  if (is_white_space(cp)) return false;
  if (cp >= 0x80 && cp <= 0xBF) return cp == 0xAA || cp == 0xB5 || cp == 0xBA;
  if (cp == 0xD7 || cp == 0xF7) return false;
  if (cp >= 0x2000 && cp <= 0x2BFF) return false;    // punctuation, symbols, arrows, math, boxes
  if (cp >= 0x3000 && cp <= 0x303F) return false;    // CJK punctuation
  if (cp >= 0xFF00 && cp <= 0xFF0F) return false;    // full-width punctuation
  if (cp >= 0x1F000 && cp <= 0x1FAFF) return false;  // emoji and pictographs
  return true;
}

char32_t char_before(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  int len = 0;
  return utf8_decode(s, i, &len);
}

}  // namespace

int32_t AddedTokenMatcher::child(int32_t node, uint8_t b) const {
  const auto& kids = nodes_[static_cast<size_t>(node)].kids;
  auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, INT32_MIN));
  return it != kids.end() && it->first == b ? it->second : -1;
}

void AddedTokenMatcher::add(std::string_view pattern, int32_t token) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (char c : pattern) {
    const auto b = static_cast<uint8_t>(c);
    int32_t next = child(node, b);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& kids = nodes_[static_cast<size_t>(node)].kids;
      kids.insert(std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, INT32_MIN)), {b, next});
      if (node == 0) root_[b] = next;
    }
    node = next;
  }
  // With equal contents the earlier pattern wins (special tokens are added first, as in HF).
  if (nodes_[static_cast<size_t>(node)].terminal < 0) nodes_[static_cast<size_t>(node)].terminal = token;
  ++n_patterns_;
}

void AddedTokenMatcher::split(std::string_view text, const std::vector<AddedToken>& tokens,
                              std::vector<SplitPiece>* out) const {
  size_t start_offset = 0;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    int32_t node = root_[static_cast<uint8_t>(text[i])];
    if (node < 0) {
      ++i;
      continue;
    }
    int32_t best = -1;
    size_t best_end = 0;
    size_t j = i + 1;
    while (true) {
      if (nodes_[static_cast<size_t>(node)].terminal >= 0) {
        best = nodes_[static_cast<size_t>(node)].terminal;
        best_end = j;
      }
      if (j >= n) break;
      node = child(node, static_cast<uint8_t>(text[j]));
      if (node < 0) break;
      ++j;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = tokens[static_cast<size_t>(best)];
    size_t start = i, stop = best_end;
    i = best_end;                        // the scan resumes after the match, whatever happens to it
    if (start < start_offset) continue;  // inside whitespace an earlier rstrip token took
    if (tok.single_word) {
      int len = 0;
      const bool start_space = start == 0 || !is_word_char(char_before(text, start));
      const bool stop_space = stop == n || !is_word_char(utf8_decode(text, stop, &len));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t s = start;
      while (s > start_offset && is_white_space(char_before(text, s))) {
        s -= 1;
        while (s > 0 && (static_cast<uint8_t>(text[s]) & 0xC0) == 0x80) --s;
      }
      start = s;
    }
    if (tok.rstrip) {
      while (stop < n) {
        int len = 0;
        const char32_t cp = utf8_decode(text, stop, &len);
        if (!is_white_space(cp)) break;
        stop += static_cast<size_t>(len);
      }
    }
    if (start_offset < start) out->push_back(SplitPiece{start_offset, start, -1});
    out->push_back(SplitPiece{start, stop, best});
    start_offset = stop;
  }
  if (start_offset < n) out->push_back(SplitPiece{start_offset, n, -1});
}

}  // namespace tandem::tok
