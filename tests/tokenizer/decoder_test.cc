// Streaming decoding: byte-fallback runs are emitted whole (or as one U+FFFD per byte when invalid, as HF
// does), every chunk is valid UTF-8, chunks concatenate to decode(), and the post-Fuse Strip / Replace
// decoders hold back only what later tokens can still change.
#include <gtest/gtest.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_fixture.h"
#include "tokenizer/utf8.h"

namespace tandem::tok {
namespace {

using nlohmann::json;
using testing::FixtureSpec;
using testing::make_tokenizer_json;

const std::string kSp = "\xE2\x96\x81";
const std::string kFffd = "\xEF\xBF\xBD";

std::unique_ptr<Tokenizer> build(const json& j) {
  auto t = Tokenizer::from_json_text(j.dump(), "fixture.json");
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(t).value() : nullptr;
}

json base_json() {
  FixtureSpec s;
  s.tokens = {kSp, "a", "b", kSp + "a", kSp + "b", "ab"};
  s.merges = {{kSp, "a"}, {kSp, "b"}, {"a", "b"}};
  return make_tokenizer_json(s);
}

int32_t id(const Tokenizer& t, const std::string& s) { return *t.token_to_id(s); }

int32_t byte(const Tokenizer& t, int b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  return id(t, buf);
}

// Pushes ids one at a time; returns the chunks (the last one from finish()).
std::vector<std::string> stream(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip = false) {
  StreamDecoder d = t.stream_decoder(skip);
  std::vector<std::string> chunks;
  for (int32_t i : ids) chunks.push_back(d.push(i));
  chunks.push_back(d.finish());
  return chunks;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& c : v) s += c;
  return s;
}

TEST(StreamDecoder, HoldsByteRunsUntilTheyEnd) {
  auto t = build(base_json());
  ASSERT_TRUE(t);
  // a 😀 ▁b  (😀 = F0 9F 98 80 as four byte tokens)
  const std::vector<int32_t> ids = {id(*t, "a"),    byte(*t, 0xF0), byte(*t, 0x9F),
                                    byte(*t, 0x98), byte(*t, 0x80), id(*t, kSp + "b")};
  const std::vector<std::string> chunks = stream(*t, ids);
  EXPECT_EQ(chunks, (std::vector<std::string>{"a", "", "", "", "", "\xF0\x9F\x98\x80 b", ""}));
  EXPECT_EQ(joined(chunks), t->decode(ids));
  // A run at the very end comes out of finish().
  EXPECT_EQ(stream(*t, {byte(*t, 0xC3), byte(*t, 0xA9)}), (std::vector<std::string>{"", "", "\xC3\xA9"}));
}

TEST(StreamDecoder, InvalidRunsBecomeOneReplacementPerByte) {
  auto t = build(base_json());
  ASSERT_TRUE(t);
  // A truncated sequence, then text.
  EXPECT_EQ(t->decode(std::vector<int32_t>{byte(*t, 0xF0), byte(*t, 0x9F), id(*t, "a")}), kFffd + kFffd + "a");
  // HF decodes the whole run at once: a valid € followed by a stray byte turns all four bytes into U+FFFD.
  EXPECT_EQ(t->decode(std::vector<int32_t>{byte(*t, 0xE2), byte(*t, 0x82), byte(*t, 0xAC), byte(*t, 0xFF)}),
            kFffd + kFffd + kFffd + kFffd);
  // Two runs separated by a token are decoded separately.
  EXPECT_EQ(
      t->decode(std::vector<int32_t>{byte(*t, 0xE2), byte(*t, 0x82), byte(*t, 0xAC), id(*t, "b"), byte(*t, 0x41)}),
      "\xE2\x82\xAC"
      "bA");
}

TEST(StreamDecoder, ChunksAreValidUtf8AndMatchDecode) {
  auto t = build(base_json());
  ASSERT_TRUE(t);
  std::vector<int32_t> ids;
  for (int i = 0; i < 400; ++i) ids.push_back((i * 7919 + 13) % t->id_limit());
  for (bool skip : {false, true}) {
    const std::vector<std::string> chunks = stream(*t, ids, skip);
    for (const std::string& c : chunks) EXPECT_EQ(utf8_invalid_offset(c), c.size());
    EXPECT_EQ(joined(chunks), t->decode(ids, skip));
  }
}

TEST(StreamDecoder, SkipsSpecialTokensAndUnknownIds) {
  auto t = build(base_json());
  ASSERT_TRUE(t);
  const std::vector<int32_t> ids = {2, id(*t, "a"), 1, 999999, id(*t, kSp + "b")};
  EXPECT_EQ(t->decode(ids), "<bos>a<eos> b");
  EXPECT_EQ(t->decode(ids, true), "a b");
  EXPECT_EQ(joined(stream(*t, ids, true)), "a b");
}

TEST(StreamDecoder, StripAfterFuseCutsTheFirstSpaceOfTheText) {
  json j = base_json();
  j["decoder"]["decoders"].push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  auto t = build(j);
  ASSERT_TRUE(t);
  const std::vector<int32_t> ids = {id(*t, kSp + "a"), id(*t, kSp + "b")};
  EXPECT_EQ(t->decode(ids), "a b");
  EXPECT_EQ(stream(*t, ids), (std::vector<std::string>{"a", " b", ""}));
}

TEST(StreamDecoder, TrailingStripIsHeldUntilMoreTextOrTheEnd) {
  json j = base_json();
  j["decoder"]["decoders"].push_back({{"type", "Strip"}, {"content", " "}, {"start", 0}, {"stop", 1}});
  auto t = build(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(stream(*t, {id(*t, "a"), id(*t, kSp)}), (std::vector<std::string>{"a", "", ""}));
  EXPECT_EQ(stream(*t, {id(*t, "a"), id(*t, kSp), id(*t, "b")}), (std::vector<std::string>{"a", "", " b", ""}));
  EXPECT_EQ(t->decode(std::vector<int32_t>{id(*t, "a"), id(*t, kSp), id(*t, kSp)}), "a ");
}

TEST(StreamDecoder, ReplaceAfterFuseMatchesAcrossTokens) {
  json j = base_json();
  j["decoder"] = {
      {"type", "Sequence"},
      {"decoders",
       json::array({{{"type", "Fuse"}}, {{"type", "Replace"}, {"pattern", {{"String", "ab"}}}, {"content", "X"}}})}};
  auto t = build(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(stream(*t, {id(*t, "a"), id(*t, "b"), id(*t, "a")}), (std::vector<std::string>{"", "X", "", "a"}));
  EXPECT_EQ(t->decode(std::vector<int32_t>{id(*t, "a"), id(*t, "a"), id(*t, "b")}), "aX");
}

TEST(StreamDecoder, NoDecoderJoinsWithSpaces) {
  json j = base_json();
  j["decoder"] = nullptr;
  auto t = build(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->decode(std::vector<int32_t>{id(*t, "a"), id(*t, kSp + "b"), 2}), "a " + kSp + "b <bos>");
}

}  // namespace
}  // namespace tandem::tok
