// Encoding with small hand-built tokenizer.json files: merge ranks, byte fallback, added tokens and their flags,
// both merge formats, load errors; and a property test of BPE against a textbook reference implementation
// (repeatedly merge the lowest-ranked adjacent pair, leftmost first) over random merges and words.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_fixture.h"

namespace tandem::tok {
namespace {

using nlohmann::json;
using testing::FixtureSpec;
using testing::make_tokenizer_json;

const std::string kSp = "\xE2\x96\x81";  // U+2581

std::unique_ptr<Tokenizer> build(const FixtureSpec& spec) {
  Result<std::unique_ptr<Tokenizer>> t = Tokenizer::from_json_text(make_tokenizer_json(spec).dump(), "fixture.json");
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::vector<int32_t> enc(const Tokenizer& t, std::string_view s, bool special = false) {
  Result<std::vector<int32_t>> r = t.encode(s, {.add_special_tokens = special});
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::vector<int32_t>{};
}

std::vector<std::string> toks(const Tokenizer& t, std::string_view s, bool special = false) {
  std::vector<std::string> out;
  for (int32_t id : enc(t, s, special)) out.emplace_back(t.id_to_token(id).value_or("?"));
  return out;
}

using Strs = std::vector<std::string>;

FixtureSpec abc_spec() {
  FixtureSpec s;
  s.tokens = {kSp, "a", "b", "c", "ab", kSp + "a", "abc", "bc", "aa", kSp + "ab", "x", kSp + "x"};
  s.merges = {{"a", "b"}, {kSp, "a"}, {"ab", "c"}, {"b", "c"}, {"a", "a"}, {kSp + "a", "b"}, {kSp, "x"}};
  return s;
}

TEST(Bpe, MergesByRank) {
  auto t = build(abc_spec());
  ASSERT_TRUE(t);
  // (a,b) rank 0 beats (b,c) rank 3; then (ab,c) rank 2.
  EXPECT_EQ(toks(*t, "abc"), (Strs{"abc"}));
  EXPECT_EQ(toks(*t, "bca"), (Strs{"bc", "a"}));
  // Ties on rank: leftmost first.
  EXPECT_EQ(toks(*t, "aaa"), (Strs{"aa", "a"}));
  // Spaces become U+2581 and glue to the next word: (▁,a) rank 1 applies to " ac", but in " ab" the
  // rank-0 (a,b) goes first and there is no (▁,ab) merge.
  EXPECT_EQ(toks(*t, " ac"), (Strs{kSp + "a", "c"}));
  EXPECT_EQ(toks(*t, " ab"), (Strs{kSp, "ab"}));
  EXPECT_EQ(toks(*t, "x ac c"), (Strs{"x", kSp + "a", "c", kSp, "c"}));
}

TEST(Bpe, PostProcessorAddsBos) {
  auto t = build(abc_spec());
  ASSERT_TRUE(t);
  EXPECT_EQ(enc(*t, "ab", true), (std::vector<int32_t>{2, *t->token_to_id("ab")}));
  EXPECT_EQ(enc(*t, "", true), (std::vector<int32_t>{2}));
  EXPECT_EQ(enc(*t, "", false), (std::vector<int32_t>{}));
  EXPECT_EQ(t->prefix_ids(), (std::vector<int32_t>{2}));
}

TEST(Bpe, ByteFallbackForUnknownCharacters) {
  auto t = build(abc_spec());
  ASSERT_TRUE(t);
  // é = C3 A9, 😀 = F0 9F 98 80: not in the vocabulary, so one <0xXX> token per byte.
  EXPECT_EQ(toks(*t, "a\xC3\xA9"), (Strs{"a", "<0xC3>", "<0xA9>"}));
  EXPECT_EQ(toks(*t, "\xF0\x9F\x98\x80"), (Strs{"<0xF0>", "<0x9F>", "<0x98>", "<0x80>"}));
  EXPECT_EQ(t->decode(enc(*t, "a\xC3\xA9 \xF0\x9F\x98\x80")), "a\xC3\xA9 \xF0\x9F\x98\x80");
}

TEST(Bpe, BothMergeFormatsGiveTheSameTokenizer) {
  FixtureSpec pairs = abc_spec();
  FixtureSpec strings = abc_spec();
  strings.merges_as_strings = true;
  auto a = build(pairs), b = build(strings);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->model().merge_count(), b->model().merge_count());
  for (const char* s : {"abc", "aaa ab", " x abcabc", "bcbc a"}) EXPECT_EQ(enc(*a, s), enc(*b, s)) << s;
}

TEST(Bpe, SpecialAndAddedTokensAreMatchedInText) {
  FixtureSpec s = abc_spec();
  const int next = 4 + 256 + static_cast<int>(s.tokens.size());
  s.extra_added.push_back({{"id", next},
                           {"content", "<|x|>"},
                           {"single_word", false},
                           {"lstrip", false},
                           {"rstrip", false},
                           {"normalized", false},
                           {"special", false}});
  s.extra_added.push_back({{"id", next + 1},
                           {"content", "<|xy|>"},
                           {"single_word", false},
                           {"lstrip", false},
                           {"rstrip", false},
                           {"normalized", false},
                           {"special", true}});
  auto t = build(s);
  ASSERT_TRUE(t);
  const int32_t x = *t->token_to_id("<|x|>"), xy = *t->token_to_id("<|xy|>");
  // New added tokens take the ids after the vocabulary, in file order (HF's rule).
  EXPECT_EQ(x, static_cast<int32_t>(t->model().vocab_size()));
  EXPECT_EQ(xy, x + 1);
  EXPECT_EQ(enc(*t, "<bos>ab"), (std::vector<int32_t>{2, *t->token_to_id("ab")}));
  EXPECT_EQ(enc(*t, "a<|x|>b"), (std::vector<int32_t>{*t->token_to_id("a"), x, *t->token_to_id("b")}));
  // Longest match wins at the same start.
  EXPECT_EQ(enc(*t, "<|xy|>"), (std::vector<int32_t>{xy}));
  // Special tokens skip on decode only when asked; non-special added tokens always decode.
  const std::vector<int32_t> ids = enc(*t, "<bos>a<|xy|><|x|>", true);
  EXPECT_EQ(t->decode(ids), "<bos><bos>a<|xy|><|x|>");
  EXPECT_EQ(t->decode(ids, true), "a<|x|>");
  EXPECT_TRUE(t->is_special(xy));
  EXPECT_FALSE(t->is_special(x));
  // Near misses stay text.
  EXPECT_EQ(toks(*t, "<bos"), (Strs{"<0x3C>", "b", "<0x6F>", "<0x73>"}));
}

TEST(Bpe, AddedTokenFlags) {
  FixtureSpec s = abc_spec();
  int next = 4 + 256 + static_cast<int>(s.tokens.size());
  auto added = [&](const char* content, bool lstrip, bool rstrip, bool single_word) {
    s.extra_added.push_back({{"id", next++},
                             {"content", content},
                             {"single_word", single_word},
                             {"lstrip", lstrip},
                             {"rstrip", rstrip},
                             {"normalized", false},
                             {"special", false}});
  };
  added("[L]", true, false, false);
  added("[R]", false, true, false);
  added("cab", false, false, true);
  auto t = build(s);
  ASSERT_TRUE(t);
  const int32_t l = *t->token_to_id("[L]"), r = *t->token_to_id("[R]"), w = *t->token_to_id("cab");
  const int32_t a = *t->token_to_id("a"), sp = *t->token_to_id(kSp);
  // lstrip swallows the spaces before the token, rstrip those after it.
  EXPECT_EQ(enc(*t, "a  [L]a"), (std::vector<int32_t>{a, l, a}));
  EXPECT_EQ(enc(*t, "a[R]  a"), (std::vector<int32_t>{a, r, a}));
  EXPECT_EQ(enc(*t, "a [R]"), (std::vector<int32_t>{a, sp, r}));
  // single_word: only when not inside a word.
  EXPECT_EQ(enc(*t, "cab"), (std::vector<int32_t>{w}));
  EXPECT_EQ(enc(*t, "a cab"), (std::vector<int32_t>{a, sp, w}));
  EXPECT_NE(enc(*t, "acab"), (std::vector<int32_t>{a, w}));
}

TEST(Bpe, NormalizedAddedTokensMatchAfterNormalization) {
  FixtureSpec s = abc_spec();
  s.extra_added.push_back({{"id", 4 + 256 + static_cast<int>(s.tokens.size())},
                           {"content", "a b"},
                           {"single_word", false},
                           {"lstrip", false},
                           {"rstrip", false},
                           {"normalized", true},
                           {"special", false}});
  auto t = build(s);
  ASSERT_TRUE(t);
  const int32_t ab = *t->token_to_id("a b");
  EXPECT_EQ(enc(*t, "ca b"), (std::vector<int32_t>{*t->token_to_id("c"), ab}));
  EXPECT_EQ(t->decode(std::vector<int32_t>{ab}), "a b");
}

TEST(Bpe, LoadErrors) {
  auto load = [](const std::string& text) { return Tokenizer::from_json_text(text, "bad.json"); };
  {
    auto r = load("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []");  // truncated
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(r.status().message().find("bad.json"), std::string::npos);
  }
  {
    auto r = load("{\"version\": \"1.0\", \"added_tokens\": []}");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(r.status().message().find("missing \"model\""), std::string::npos);
  }
  {
    auto r = load("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
    EXPECT_NE(r.status().message().find("WordPiece"), std::string::npos);
  }
  {
    json j = make_tokenizer_json(abc_spec());
    j["model"]["merges"].push_back(json::array({"a", "zzz"}));
    auto r = load(j.dump());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(r.status().message().find("zzz"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("bad.json"), std::string::npos);
  }
  {
    json j = make_tokenizer_json(abc_spec());
    j["model"]["merges"].push_back(json::array({"c", "c"}));  // "cc" is not a token
    auto r = load(j.dump());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("merged token \"cc\""), std::string::npos) << r.status().message();
  }
  {
    json j = make_tokenizer_json(abc_spec());
    j["normalizer"] = {{"type", "NFKC"}};
    auto r = load(j.dump());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  }
  {
    auto r = load("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"a\": 1}, \"merges\": []}}");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  }
  {
    auto r = load("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"ab\"]}}");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  }
  {
    auto r = load("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}} trailing");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  }
  {
    auto r = Tokenizer::load("/nonexistent/dir/tokenizer.json");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  }
  {
    auto r = Tokenizer::load(TANDEM_SOURCE_DIR "/tests/tokenizer");  // a directory without tokenizer.json
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  }
}

TEST(Bpe, EncodeErrors) {
  auto t = build(abc_spec());
  ASSERT_TRUE(t);
  Result<std::vector<int32_t>> r = t->encode("ab\xC3(");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("byte 2"), std::string::npos);
  Result<int32_t> id = t->require_token("<|nope|>");
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kNotFound);
  EXPECT_NE(id.status().message().find("<|nope|>"), std::string::npos);
}

// Textbook BPE on strings: merge the lowest-ranked adjacent pair (leftmost on ties) until none applies.
std::vector<std::string> reference_bpe(const std::vector<std::string>& chars,
                                       const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> s = chars;
  while (s.size() > 1) {
    int best = -1, best_rank = INT32_MAX;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      auto it = ranks.find({s[i], s[i + 1]});
      if (it != ranks.end() && it->second < best_rank) {
        best_rank = it->second;
        best = static_cast<int>(i);
      }
    }
    if (best < 0) break;
    s[best] += s[best + 1];
    s.erase(s.begin() + best + 1);
  }
  return s;
}

TEST(Bpe, MatchesReferenceOnRandomMergesAndWords) {
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"a", "b", "c", kSp};
  for (int trial = 0; trial < 30; ++trial) {
    FixtureSpec s;
    s.gemma_pipeline = false;  // words go to BPE as they are
    std::vector<std::string> vocab = alphabet;
    std::map<std::pair<std::string, std::string>, int> ranks;
    for (int m = 0; m < 40; ++m) {
      const std::string& x = vocab[rng() % vocab.size()];
      const std::string& y = vocab[rng() % vocab.size()];
      if (x.size() + y.size() > 12 || ranks.count({x, y})) continue;
      ranks[{x, y}] = static_cast<int>(s.merges.size());
      s.merges.push_back({x, y});
      if (std::find(vocab.begin(), vocab.end(), x + y) == vocab.end()) vocab.push_back(x + y);
    }
    s.tokens = vocab;
    auto t = build(s);
    ASSERT_TRUE(t);
    for (int w = 0; w < 60; ++w) {
      const int len = 1 + static_cast<int>(rng() % (w % 3 == 0 ? 150 : 20));  // some words take the heap path
      std::vector<std::string> chars;
      std::string word;
      for (int i = 0; i < len; ++i) {
        chars.push_back(alphabet[rng() % alphabet.size()]);
        word += chars.back();
      }
      std::vector<int32_t> want;
      for (const std::string& p : reference_bpe(chars, ranks)) want.push_back(*t->token_to_id(p));
      ASSERT_EQ(enc(*t, word), want) << "trial " << trial << " word " << word;
    }
  }
}

}  // namespace
}  // namespace tandem::tok
