// `tandem chat`: interactive multi-turn chat in the checkpoint's Gemma 4 chat format, streaming each reply.
// Each turn re-encodes the whole conversation (earlier model turns without their thinking, as the template does).
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "session.h"
#include "tokenizer/chat.h"

namespace tandem::cli {

int run_chat(const SessionFlags& flags, const std::string& system) {
  auto session = open_session(flags, /*need_tokenizer=*/true);
  if (!session.ok()) return fail("chat", session.status());
  Session& s = *session;
  tok::ChatTemplateStyle style;
  if (auto found = tok::load_chat_style(flags.model); found.ok()) style = *found;
  else std::fprintf(stderr, "tandem chat: %s has no chat template; using the standard Gemma 4 format\n", flags.model.c_str());
  std::vector<tok::ChatMessage> conv;
  if (!system.empty()) conv.push_back({tok::ChatRole::kSystem, system});
  Generator gen(*s.target, s.drafter.get());
  std::fprintf(stderr, "tandem chat: type a message and press Enter; /exit or end of input quits.\n");
  std::string line;
  while (true) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line == "/exit" || line == "/quit") break;
    if (line.empty()) continue;
    conv.push_back({tok::ChatRole::kUser, line});
    auto ids = tok::encode_chat(*s.tokenizer, conv, {.add_generation_prompt = true}, style);
    if (!ids.ok()) {
      conv.pop_back();
      std::fprintf(stderr, "tandem chat: %s\n", ids.status().to_string().c_str());
      continue;
    }
    tok::StreamDecoder dec = s.tokenizer->stream_decoder(/*skip_special_tokens=*/true);
    std::string reply;
    auto res = gen.generate(*ids, s.options, [&](std::span<const int32_t> toks) {
      for (int32_t t : toks) {
        std::string piece = dec.push(t);
        reply += piece;
        std::fputs(piece.c_str(), stdout);
      }
      std::fflush(stdout);
      return true;
    });
    if (!res.ok()) {
      conv.pop_back();
      std::fprintf(stderr, "\ntandem chat: %s\n", res.status().to_string().c_str());
      continue;
    }
    std::string tail = dec.finish();
    reply += tail;
    std::printf("%s\n", tail.c_str());
    std::fprintf(stderr, "[%s]\n", summary_line(res->stats, s.drafter != nullptr).c_str());
    conv.push_back({tok::ChatRole::kModel, tok::strip_thinking(reply)});
  }
  return 0;
}

void add_chat_command(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<SessionFlags>();
  auto system = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("chat", "Interactive multi-turn chat in the checkpoint's chat format");
  add_session_flags(cmd, flags.get());
  cmd->add_option("--system", *system, "System prompt");
  cmd->footer("Example:\n  tandem chat --model M --draft M-assistant --system \"You are terse.\" --temperature 0.7");
  cmd->callback([flags, system, &exit_code] { exit_code = run_chat(*flags, *system); });
}

}  // namespace tandem::cli
