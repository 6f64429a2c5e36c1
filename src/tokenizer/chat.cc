// Gemma 4 chat formatting (see chat.h). Mirrors the plain-text paths of the official chat_template.jinja.
#include "tokenizer/chat.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/strings.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tandem::tok {
namespace {

constexpr std::string_view kTurnOpen = "<|turn>";
constexpr std::string_view kTurnClose = "<turn|>\n";
constexpr std::string_view kChannelOpen = "<|channel>";
constexpr std::string_view kChannelClose = "<channel|>";
constexpr std::string_view kEmptyThought = "<|channel>thought\n<channel|>";

Result<std::string> read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return io_error(strfmt("%s: cannot open", path.c_str()));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

Result<ChatRole> parse_chat_role(std::string_view name) {
  if (name == "system") return ChatRole::kSystem;
  if (name == "developer") return ChatRole::kDeveloper;
  if (name == "user") return ChatRole::kUser;
  if (name == "assistant") return ChatRole::kAssistant;
  if (name == "model") return ChatRole::kModel;
  return invalid_argument(
      strfmt("unknown chat role \"%.*s\" (system, developer, user, assistant, model)", (int)name.size(), name.data()));
}

const char* chat_role_name(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem:
      return "system";
    case ChatRole::kDeveloper:
      return "developer";
    case ChatRole::kUser:
      return "user";
    case ChatRole::kAssistant:
      return "assistant";
    case ChatRole::kModel:
      return "model";
  }
  return "?";
}

Result<ChatTemplateStyle> detect_chat_style(std::string_view t) {
  const bool turns = t.find("<|turn>") != std::string_view::npos && t.find("<turn|>") != std::string_view::npos;
  if (!turns) {
    if (t.find("<start_of_turn>") != std::string_view::npos) {
      return unsupported("chat template uses <start_of_turn>/<end_of_turn> (Gemma 3 format), not Gemma 4's <|turn>");
    }
    return unsupported("chat template is not a Gemma 4 template (no <|turn> / <turn|> markers)");
  }
  ChatTemplateStyle s;
  // Jinja source spells the newline of a string literal as backslash + n.
  s.emit_bos = t.find("bos_token") != std::string_view::npos;
  if (t.find("'<|think|>\\n'") != std::string_view::npos) {
    s.think_marker = "<|think|>\n";
  } else if (t.find("'<|think|>'") != std::string_view::npos) {
    s.think_marker = "<|think|>";
  }
  s.empty_thought_channel = t.find("'<|channel>thought\\n<channel|>'") != std::string_view::npos;
  s.continue_model_turns = t.find("continue_same_model_turn") != std::string_view::npos;
  return s;
}

Result<ChatTemplateStyle> load_chat_style(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path jinja = fs::path(dir) / "chat_template.jinja";
  if (fs::exists(jinja, ec)) {
    TANDEM_ASSIGN_OR_RETURN(std::string text, read_text(jinja.string()));
    Result<ChatTemplateStyle> s = detect_chat_style(text);
    if (!s.ok()) return Status(s.status()).with_context(jinja.string());
    return s;
  }
  const fs::path config = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(config, ec)) {
    TANDEM_ASSIGN_OR_RETURN(std::string text, read_text(config.string()));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return corrupt(strfmt("%s: invalid JSON", config.string().c_str()));
    std::string tmpl;
    if (j.contains("chat_template") && j["chat_template"].is_string()) {
      tmpl = j["chat_template"].get<std::string>();
    } else if (j.contains("chat_template") && j["chat_template"].is_array()) {
      for (const auto& e : j["chat_template"]) {
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string()) {
          tmpl = e["template"].get<std::string>();
        }
      }
    }
    if (!tmpl.empty()) {
      Result<ChatTemplateStyle> s = detect_chat_style(tmpl);
      if (!s.ok()) return Status(s.status()).with_context(config.string());
      return s;
    }
  }
  return not_found(strfmt("%s: no chat_template.jinja and no chat_template in tokenizer_config.json", dir.c_str()));
}

std::string strip_thinking(std::string_view text) {
  // Python: for part in text.split('<channel|>'): keep part.split('<|channel>')[0] if '<|channel>' in part.
  std::string result;
  size_t pos = 0;
  while (true) {
    const size_t close = text.find(kChannelClose, pos);
    const std::string_view part =
        text.substr(pos, close == std::string_view::npos ? std::string_view::npos : close - pos);
    const size_t open = part.find(kChannelOpen);
    result.append(part.substr(0, open));
    if (close == std::string_view::npos) break;
    pos = close + kChannelClose.size();
  }
  return std::string(python_strip(result));
}

Result<std::string> format_chat(std::span<const ChatMessage> messages, const ChatOptions& opts,
                                const ChatTemplateStyle& style) {
  if (messages.empty()) return invalid_argument("chat: the conversation has no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    Status s = validate_utf8(messages[i].content, "chat message");
    if (!s.ok()) return std::move(s).with_context(strfmt("message %zu", i));
  }
  std::string out;
  if (style.emit_bos) out += style.bos;
  size_t first = 0;
  const bool system_first = messages[0].role == ChatRole::kSystem || messages[0].role == ChatRole::kDeveloper;
  if (opts.enable_thinking || system_first) {
    out.append(kTurnOpen).append("system\n");
    if (opts.enable_thinking) out += style.think_marker;
    if (system_first) {
      out += python_strip(messages[0].content);
      first = 1;
    }
    out += kTurnClose;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool model = m.role == ChatRole::kAssistant || m.role == ChatRole::kModel;
    const bool continuation =
        style.continue_model_turns && model && i > first && messages[i - 1].role == ChatRole::kAssistant;
    if (!continuation) out.append(kTurnOpen).append(model ? "model" : chat_role_name(m.role)).append("\n");
    if (model) {
      out += strip_thinking(m.content);
    } else {
      out += python_strip(m.content);
    }
    out += kTurnClose;
  }
  if (opts.add_generation_prompt) {
    out.append(kTurnOpen).append("model\n");
    if (!opts.enable_thinking && style.empty_thought_channel) out += kEmptyThought;
  }
  return out;
}

Result<std::vector<int32_t>> encode_chat(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                         const ChatOptions& opts, const ChatTemplateStyle& style) {
  TANDEM_ASSIGN_OR_RETURN(std::string prompt, format_chat(messages, opts, style));
  return tokenizer.encode(prompt, {.add_special_tokens = false});
}

}  // namespace tandem::tok
