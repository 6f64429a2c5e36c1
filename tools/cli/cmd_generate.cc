// `tandem generate`: plain or speculative (MTP assistant) generation from token ids or text, streaming the output,
// with per-round statistics (--json) and an in-run comparison against plain decoding (--compare).
#include <algorithm>
#include <cstdio>

#include "core/strings.h"

#include "commands.h"
#include "session.h"
#include "tokenizer/chat.h"

namespace tandem::cli {
namespace {

struct GenerateFlags {
  SessionFlags s;
  std::string ids, prompt, system;
  bool chat_format = false, json = false, compare = false, chat = false;
  int repeat = 1;
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The prompt as ids: --ids as given; --prompt as raw text after <bos> (a completion), or as one user turn in the
// checkpoint's chat format with --chat-format.
Result<std::vector<int32_t>> prompt_ids(const GenerateFlags& o, const Session& s) {
  if (!o.ids.empty()) return parse_ids(o.ids);
  if (!s.tokenizer) return not_found("--prompt needs a tokenizer.json in " + o.s.model);
  if (o.chat_format) {
    tok::ChatTemplateStyle style;
    auto found = tok::load_chat_style(o.s.model);
    if (found.ok()) style = *found;
    std::vector<tok::ChatMessage> msgs;
    if (!o.system.empty()) msgs.push_back({tok::ChatRole::kSystem, o.system});
    msgs.push_back({tok::ChatRole::kUser, o.prompt});
    return tok::encode_chat(*s.tokenizer, msgs, {.add_generation_prompt = true}, style);
  }
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, s.tokenizer->encode(o.prompt, {.add_special_tokens = true}));
  const int bos = s.target->config().bos_id;
  if (ids.empty() || ids[0] != bos) ids.insert(ids.begin(), bos);  // Gemma 4's tokenizer adds no <bos> itself
  return ids;
}

int run_generate(const GenerateFlags& o) {
  if (o.chat) return run_chat(o.s, o.system);
  if (o.ids.empty() == o.prompt.empty()) return fail("generate", invalid_argument("give exactly one of --ids and --prompt"));
  if (o.compare && o.s.draft.empty()) return fail("generate", invalid_argument("--compare needs --draft"));
  auto session = open_session(o.s, !o.prompt.empty());
  if (!session.ok()) return fail("generate", session.status());
  Session& s = *session;
  auto ids = prompt_ids(o, s);
  if (!ids.ok()) return fail("generate", ids.status());

  // --compare: plain and speculative runs alternate --repeat times (this machine's speed drifts); medians reported.
  GenerationResult plain;
  std::vector<double> plain_tps, spec_tps;
  Generator gen(*s.target, s.drafter.get());
  if (o.compare) {
    Generator base(*s.target, nullptr);
    for (int i = 0; i < o.repeat; ++i) {
      auto r = base.generate(*ids, s.options);
      if (!r.ok()) return fail("generate", r.status());
      plain_tps.push_back(r->stats.decode_tokens_per_second());
      plain = std::move(*r);
      if (i + 1 < o.repeat) {
        auto sr = gen.generate(*ids, s.options);
        if (!sr.ok()) return fail("generate", sr.status());
        spec_tps.push_back(sr->stats.decode_tokens_per_second());
      }
    }
  }
  const bool text = s.tokenizer != nullptr && !o.json;
  std::optional<tok::StreamDecoder> decoder;
  if (text) decoder.emplace(s.tokenizer->stream_decoder(/*skip_special_tokens=*/true));
  auto on_tokens = [&](std::span<const int32_t> toks) {
    if (o.json) return true;
    for (int32_t t : toks) {
      if (decoder) std::fputs(decoder->push(t).c_str(), stdout);
      else std::printf("%d ", t);
    }
    std::fflush(stdout);
    return true;
  };
  if (text && !o.prompt.empty() && !o.chat_format) std::fputs(o.prompt.c_str(), stdout);
  auto res = gen.generate(*ids, s.options, on_tokens);
  if (!res.ok()) return fail("generate", res.status());
  if (decoder) std::fputs(decoder->finish().c_str(), stdout);
  const bool spec = s.drafter != nullptr;
  nlohmann::json compare;
  if (o.compare) {
    spec_tps.push_back(res->stats.decode_tokens_per_second());
    const double base = median_of(plain_tps), spec_med = median_of(spec_tps);
    compare = {{"runs", o.repeat},
               {"plain_tokens_per_second", base},
               {"speculative_tokens_per_second", spec_med},
               {"speedup", base > 0 ? spec_med / base : 0.0},
               {"identical_output", plain.tokens == res->tokens}};
  }
  if (o.json) {
    nlohmann::json j = {{"ids", res->tokens}, {"stop_reason", stop_reason_name(res->stop)}, {"stats", stats_json(res->stats)}};
    if (s.tokenizer) j["text"] = s.tokenizer->decode(res->tokens, /*skip_special_tokens=*/true);
    if (spec) {
      nlohmann::json rounds = nlohmann::json::array();
      for (const RoundRecord& r : res->rounds)
        rounds.push_back({{"position", r.position}, {"draft", r.draft}, {"accepted", r.accepted}});
      j["rounds"] = std::move(rounds);
    }
    if (o.compare) j["compare"] = compare;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("\n");
  std::fprintf(stderr, "\ntandem: %s\n", summary_line(res->stats, spec).c_str());
  if (o.compare)
    std::fprintf(stderr, "tandem: plain decoding %.1f tok/s, speculative %.1f tok/s%s: speedup %.2fx (output %s)\n",
                 compare["plain_tokens_per_second"].get<double>(), compare["speculative_tokens_per_second"].get<double>(),
                 o.repeat > 1 ? strfmt(" (medians of %d alternating runs)", o.repeat).c_str() : "",
                 compare["speedup"].get<double>(), plain.tokens == res->tokens ? "identical" : "differs");
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<GenerateFlags>();
  auto* cmd = app.add_subcommand("generate", "Generate text or tokens, optionally with the MTP assistant drafter");
  add_session_flags(cmd, &o->s);
  cmd->add_option("--ids", o->ids, "Prompt as comma-separated token ids");
  cmd->add_option("--prompt", o->prompt, "Prompt text (completion after <bos>; see --chat-format)");
  cmd->add_flag("--chat-format", o->chat_format, "Wrap --prompt as a user turn in the checkpoint's chat format");
  cmd->add_option("--system", o->system, "System prompt (with --chat-format or --chat)");
  cmd->add_flag("--chat", o->chat, "Interactive multi-turn chat (same as `tandem chat`)");
  cmd->add_flag("--json", o->json, "Print one JSON object: ids, text, rounds, stats");
  cmd->add_flag("--compare", o->compare, "Also run plain decoding and report the speedup");
  cmd->add_option("--repeat", o->repeat, "With --compare: alternate plain and speculative runs N times, report medians")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->footer(
      "Examples:\n"
      "  tandem generate --model models/demo/target --prompt \"And God said\" --max-tokens 64\n"
      "  tandem generate --model models/demo/target --draft models/demo/assistant --prompt \"And God said\" --compare\n"
      "  tandem generate --model M --draft M-assistant --ids 2,651,1210 --draft-tokens 3 --temperature 0 --json\n"
      "  tandem generate --model M --draft M-assistant --prompt \"Hi\" --chat-format --draft-tokens auto");
  cmd->callback([o, &exit_code] { exit_code = run_generate(*o); });
}

}  // namespace tandem::cli
