// Gemma 4 chat format, native: what the official chat_template.jinja of google/gemma-4-*-it renders for
// plain-text conversations (system/developer, user, assistant/model turns; thinking on or off; the generation
// prompt), without a Jinja engine. The template's own text decides the few points where its published
// revisions differ (see ChatTemplateStyle); detect_chat_style() reads them from a checkpoint's template.
//
//   <bos><|turn>system\n{system}<turn|>\n<|turn>user\n{user}<turn|>\n<|turn>model\n<|channel>thought\n<channel|>
//
// Rules mirrored from the template: the first message becomes the system turn if it is system/developer; with
// thinking on, the system turn starts with <|think|> (and exists even without a system message); contents are
// trimmed (Python str.strip); model contents drop any <|channel>...<channel|> thought block (prior model turns
// carry no thinking); the generation prompt opens a model turn and, with thinking off, an empty thought channel.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tandem::tok {

class Tokenizer;

enum class ChatRole { kSystem, kDeveloper, kUser, kAssistant, kModel };

struct ChatMessage {
  ChatRole role;
  std::string content;
};

struct ChatOptions {
  bool add_generation_prompt = true;  // end with an open model turn
  bool enable_thinking = false;       // the template's enable_thinking (off unless asked, as in the template)
};

// The points where published Gemma 4 template revisions differ, for plain-text conversations.
struct ChatTemplateStyle {
  bool emit_bos = true;  // the template writes bos_token first
  std::string bos = "<bos>";
  std::string think_marker = "<|think|>\n";  // early revisions: "<|think|>" with no newline
  bool empty_thought_channel = true;         // thinking off: generation prompt ends "<|channel>thought\n<channel|>"
  bool continue_model_turns = true;          // an assistant message right after an assistant message adds no
                                             // new "<|turn>model\n" (newest revision)
};

// "system", "developer", "user", "assistant", "model" -> role; kInvalidArgument otherwise.
[[nodiscard]] Result<ChatRole> parse_chat_role(std::string_view name);
[[nodiscard]] const char* chat_role_name(ChatRole role);

// Reads the style from a chat template's Jinja text. kUnsupported (saying what was found) if it is not a Gemma 4
// template, e.g. a Gemma 3 <start_of_turn> template.
[[nodiscard]] Result<ChatTemplateStyle> detect_chat_style(std::string_view template_text);

// The style of a checkpoint directory: chat_template.jinja, else the "chat_template" of tokenizer_config.json.
// kNotFound if the directory has neither.
[[nodiscard]] Result<ChatTemplateStyle> load_chat_style(const std::string& dir);

// Renders a conversation to the prompt text. kInvalidArgument for an empty conversation or invalid UTF-8.
[[nodiscard]] Result<std::string> format_chat(std::span<const ChatMessage> messages, const ChatOptions& opts = {},
                                              const ChatTemplateStyle& style = {});

// format_chat() then encode without the post-processor (the template writes <bos> itself), as HF's
// apply_chat_template(tokenize=True) does.
[[nodiscard]] Result<std::vector<int32_t>> encode_chat(const Tokenizer& tokenizer,
                                                       std::span<const ChatMessage> messages,
                                                       const ChatOptions& opts = {},
                                                       const ChatTemplateStyle& style = {});

// The template's strip_thinking(): drops every "<|channel>...<channel|>" block, then trims.
[[nodiscard]] std::string strip_thinking(std::string_view text);

}  // namespace tandem::tok
