// Gemma 4 chat formatting: parity with renders of the official chat_template.jinja made by jinja2
// (tools/fixtures/tokenizer/chat_render.py -> tests/fixtures/tokenizer/chat_renders.jsonl), plus checks of the
// rules read from the template: system turn, thinking marker, trimming, thought stripping, generation prompt,
// and the style detection that adapts to other revisions of the template.
#include "tokenizer/chat.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_fixture.h"

namespace tandem::tok {
namespace {

using nlohmann::json;

const std::string kRendersPath = TANDEM_SOURCE_DIR "/tests/fixtures/tokenizer/chat_renders.jsonl";

std::vector<ChatMessage> to_messages(const json& j) {
  std::vector<ChatMessage> out;
  for (const json& m : j) {
    Result<ChatRole> role = parse_chat_role(m["role"].get<std::string>());
    EXPECT_TRUE(role.ok());
    out.push_back(ChatMessage{*role, m["content"].get<std::string>()});
  }
  return out;
}

std::string fmt(const std::vector<ChatMessage>& m, ChatOptions o = {}, const ChatTemplateStyle& s = {}) {
  Result<std::string> r = format_chat(m, o, s);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : "";
}

TEST(Chat, MatchesJinjaRendersOfTheOfficialTemplate) {
  std::ifstream f(kRendersPath);
  if (!f) GTEST_SKIP() << kRendersPath << " is missing: run tools/fixtures/tokenizer/chat_render.py";
  std::string line;
  ASSERT_TRUE(std::getline(f, line));
  const json header = json::parse(line);
  ASSERT_EQ(header.value("format", ""), "tandem-chat-renders/1");
  ChatTemplateStyle style;
  style.emit_bos = header["style"]["emit_bos"];
  style.think_marker = header["style"]["think_marker"];
  style.empty_thought_channel = header["style"]["empty_thought_channel"];
  style.continue_model_turns = header["style"]["continue_model_turns"];
  // When the template itself is at hand (.cache/, not committed), detection must read the same style from it.
  std::ifstream tf(TANDEM_SOURCE_DIR "/.cache/gemma4_chat_template.jinja");
  if (tf) {
    std::stringstream ss;
    ss << tf.rdbuf();
    Result<ChatTemplateStyle> d = detect_chat_style(ss.str());
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(d->emit_bos, style.emit_bos);
    EXPECT_EQ(d->think_marker, style.think_marker);
    EXPECT_EQ(d->empty_thought_channel, style.empty_thought_channel);
    EXPECT_EQ(d->continue_model_turns, style.continue_model_turns);
  }
  int n = 0;
  while (std::getline(f, line)) {
    const json r = json::parse(line);
    ChatOptions o;
    o.add_generation_prompt = r["add_generation_prompt"];
    o.enable_thinking = !r["enable_thinking"].is_null() && r["enable_thinking"].get<bool>();
    EXPECT_EQ(fmt(to_messages(r["messages"]), o, style), r["rendered"].get<std::string>())
        << r["name"] << " thinking=" << r["enable_thinking"] << " gen=" << o.add_generation_prompt;
    ++n;
  }
  EXPECT_GE(n, 100);
}

TEST(Chat, TurnStructure) {
  const std::vector<ChatMessage> m = {{ChatRole::kSystem, "Be brief."},
                                      {ChatRole::kUser, "Hi"},
                                      {ChatRole::kAssistant, "Hello."},
                                      {ChatRole::kUser, "Bye"}};
  EXPECT_EQ(fmt(m),
            "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello.<turn|>\n"
            "<|turn>user\nBye<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
  EXPECT_EQ(fmt(m, {.add_generation_prompt = false}),
            "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello.<turn|>\n"
            "<|turn>user\nBye<turn|>\n");
  // Thinking on: <|think|> opens the system turn and the generation prompt has no empty thought channel.
  EXPECT_EQ(fmt({{ChatRole::kUser, "Hi"}}, {.enable_thinking = true}),
            "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n");
  EXPECT_EQ(fmt({{ChatRole::kSystem, " S "}, {ChatRole::kUser, "Hi"}}, {.enable_thinking = true}),
            "<bos><|turn>system\n<|think|>\nS<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n");
}

TEST(Chat, PriorModelTurnsLoseTheirThinking) {
  EXPECT_EQ(strip_thinking("<|channel>thought\nplan<channel|>Answer"), "Answer");
  EXPECT_EQ(strip_thinking(" a<|channel>x<channel|>b<|channel>y<channel|>c "), "abc");
  EXPECT_EQ(strip_thinking("keep <|channel>dropped to the end"), "keep");
  EXPECT_EQ(strip_thinking("x<channel|>y"), "xy");
  EXPECT_EQ(fmt({{ChatRole::kUser, "q"}, {ChatRole::kAssistant, "<|channel>thought\nhmm<channel|>42"}},
                {.add_generation_prompt = false}),
            "<bos><|turn>user\nq<turn|>\n<|turn>model\n42<turn|>\n");
}

TEST(Chat, StyleDetection) {
  // Newest revision features.
  Result<ChatTemplateStyle> s = detect_chat_style(
      "{{- bos_token -}}{{- '<|turn>system\\n' -}}{{- '<|think|>\\n' -}}{{- '<turn|>\\n' -}}"
      "{%- set continue_same_model_turn = x -%}{{- '<|channel>thought\\n<channel|>' -}}");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->think_marker, "<|think|>\n");
  EXPECT_TRUE(s->empty_thought_channel);
  EXPECT_TRUE(s->continue_model_turns);
  // An early revision: <|think|> without newline, no continuation, no empty thought channel (E-series reports).
  s = detect_chat_style("{{ bos_token }}{{- '<|turn>system\\n' -}}{{- '<|think|>' -}}{{- '<turn|>\\n' -}}");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->think_marker, "<|think|>");
  EXPECT_FALSE(s->empty_thought_channel);
  EXPECT_FALSE(s->continue_model_turns);
  EXPECT_EQ(fmt({{ChatRole::kUser, "a"}, {ChatRole::kAssistant, "b"}, {ChatRole::kAssistant, "c"}}, {}, *s),
            "<bos><|turn>user\na<turn|>\n<|turn>model\nb<turn|>\n<|turn>model\nc<turn|>\n<|turn>model\n");
  // Not Gemma 4.
  s = detect_chat_style("{{ bos_token }}<start_of_turn>user\n{{ m }}<end_of_turn>");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(s.status().message().find("Gemma 3"), std::string::npos);
  EXPECT_FALSE(detect_chat_style("{{ messages }}").ok());
}

TEST(Chat, LoadsStyleFromACheckpointDirectory) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tandem_chat_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  EXPECT_EQ(load_chat_style(dir.string()).status().code(), StatusCode::kNotFound);
  std::ofstream(dir / "tokenizer_config.json")
      << json{{"chat_template", "{{ bos_token }}<|turn>user\n<turn|>{{- '<|think|>' -}}"}}.dump();
  Result<ChatTemplateStyle> s = load_chat_style(dir.string());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->think_marker, "<|think|>");
  std::ofstream(dir / "chat_template.jinja") << "<start_of_turn>user";  // the .jinja file takes precedence
  s = load_chat_style(dir.string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("chat_template.jinja"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Chat, Errors) {
  Result<std::string> r = format_chat({}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  r = format_chat(std::vector<ChatMessage>{{ChatRole::kUser, "ok"}, {ChatRole::kUser, "bad \xFF"}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("message 1"), std::string::npos);
  EXPECT_FALSE(parse_chat_role("tool").ok());
  EXPECT_EQ(*parse_chat_role("assistant"), ChatRole::kAssistant);
}

TEST(Chat, EncodesMarkersAsSingleTokens) {
  testing::FixtureSpec spec;
  spec.tokens = {"\xE2\x96\x81", "H", "i", "Hi", "u", "s", "e", "r", "m", "o", "d", "l", "\n"};
  spec.merges = {{"H", "i"}};
  int next = 4 + 256 + static_cast<int>(spec.tokens.size());
  for (const char* t : {"<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>"}) {
    spec.extra_added.push_back({{"id", next++},
                                {"content", t},
                                {"single_word", false},
                                {"lstrip", false},
                                {"rstrip", false},
                                {"normalized", false},
                                {"special", true}});
  }
  auto tok = Tokenizer::from_json_text(testing::make_tokenizer_json(spec).dump(), "fixture.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  Result<std::vector<int32_t>> ids = encode_chat(**tok, std::vector<ChatMessage>{{ChatRole::kUser, "Hi"}},
                                                 {.add_generation_prompt = true, .enable_thinking = true});
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  auto id = [&](const char* s) { return *(*tok)->token_to_id(s); };
  // <bos> appears once (from the template; encode_chat adds no post-processor <bos>); markers are one id each.
  const std::vector<int32_t>& got = *ids;
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got[0], 2);
  EXPECT_EQ(std::count(got.begin(), got.end(), 2), 1);
  EXPECT_EQ(std::count(got.begin(), got.end(), id("<|turn>")), 3);
  EXPECT_EQ(std::count(got.begin(), got.end(), id("<turn|>")), 2);
  EXPECT_EQ(std::count(got.begin(), got.end(), id("<|think|>")), 1);
  EXPECT_EQ((*tok)->decode(got), "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n");
}

}  // namespace
}  // namespace tandem::tok
