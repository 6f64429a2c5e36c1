// `tandem generate`: plain or speculative (MTP assistant) generation from token ids, with per-round statistics.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "core/strings.h"
#include "spec/generator.h"

namespace tandem::cli {
namespace {

struct GenerateCliOptions {
  std::string model, draft, ids, device = "cpu", draft_tokens = "3";
  int max_tokens = 128, top_k = 0, max_draft_tokens = 8, threads = 0;
  float temperature = 0.f, top_p = 1.f, min_p = 0.f;
  uint64_t seed = 0;
  bool json = false, compare = false, ignore_eos = false, sample_drafts = false;
  int64_t context = 0;
};

Status parse_draft_mode(const std::string& s, GenerateOptions* g) {
  if (s == "auto") g->draft_mode = DraftMode::kAuto;
  else if (s == "heuristic") g->draft_mode = DraftMode::kHeuristic, g->draft_tokens = 3;
  else {
    char* end = nullptr;
    long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < 0 || v > 64)
      return invalid_argument("--draft-tokens must be an integer 0..64, \"auto\" or \"heuristic\" (got \"" + s + "\")");
    g->draft_mode = DraftMode::kFixed;
    g->draft_tokens = static_cast<int>(v);
  }
  return ok_status();
}

nlohmann::json stats_json(const GenerationStats& st) {
  nlohmann::json per = nlohmann::json::array();
  for (size_t j = 0; j < st.proposed_at.size(); ++j)
    if (st.proposed_at[j] > 0) per.push_back(static_cast<double>(st.accepted_at[j]) / static_cast<double>(st.proposed_at[j]));
  const double spec_s = st.draft_seconds + st.verify_seconds;
  return {{"prompt_tokens", st.prompt_tokens},
          {"tokens", st.generated_tokens},
          {"rounds", st.rounds},
          {"target_passes", st.target_passes},
          {"mean_accepted", st.mean_accepted()},
          {"acceptance_length", st.tokens_per_pass()},
          {"per_position_acceptance", per},
          {"prefill_seconds", st.prefill_seconds},
          {"draft_seconds", st.draft_seconds},
          {"verify_seconds", st.verify_seconds},
          {"draft_fraction", spec_s > 0 ? st.draft_seconds / spec_s : 0.0},
          {"total_seconds", st.total_seconds},
          {"tokens_per_second", st.decode_tokens_per_second()}};
}

std::string summary_line(const GenerationStats& st, bool spec) {
  std::string s = strfmt("%lld tokens in %.2f s (%.1f tok/s, prefill %.0f ms)", static_cast<long long>(st.generated_tokens),
                         st.total_seconds, st.decode_tokens_per_second(), st.prefill_seconds * 1e3);
  if (!spec) return s;
  s += strfmt(" | %lld rounds, mean accepted %.2f, acceptance length %.2f | per position:",
              static_cast<long long>(st.rounds), st.mean_accepted(), st.tokens_per_pass());
  for (size_t j = 0; j < st.proposed_at.size(); ++j)
    if (st.proposed_at[j] > 0) s += strfmt(" %.2f", static_cast<double>(st.accepted_at[j]) / static_cast<double>(st.proposed_at[j]));
  const double t = st.draft_seconds + st.verify_seconds;
  if (t > 0) s += strfmt(" | draft %.0f%% / verify %.0f%% of decode time", 100 * st.draft_seconds / t, 100 * st.verify_seconds / t);
  return s;
}

int run_generate(const GenerateCliOptions& o) {
  GenerateOptions g;
  g.max_new_tokens = o.max_tokens;
  g.sampling = {.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p, .min_p = o.min_p, .seed = o.seed};
  g.max_draft_tokens = o.max_draft_tokens;
  g.sample_drafts = o.sample_drafts;
  g.context = o.context;
  if (Status s = parse_draft_mode(o.draft_tokens, &g); !s.ok()) return fail("generate", s);
  if (Status s = g.sampling.validate(); !s.ok()) return fail("generate", s);
  if (o.max_tokens < 0) return fail("generate", invalid_argument("--max-tokens must be >= 0"));
  auto ids = parse_ids(o.ids);
  if (!ids.ok()) return fail("generate", ids.status());
  auto backend = open_backend(o.device, o.threads);
  if (!backend.ok()) return fail("generate", backend.status());
  ProgressBar bar("loading target");
  auto target = Gemma4Model::load(o.model, **backend, {.progress = [&](uint64_t d, uint64_t t) { bar.update(d, t); }});
  bar.finish();
  if (!target.ok()) return fail("generate", target.status());
  std::unique_ptr<Gemma4Assistant> drafter;
  if (!o.draft.empty()) {
    auto d = Gemma4Assistant::load(o.draft, **target);
    if (!d.ok()) return fail("generate", d.status());
    drafter = std::move(*d);
  } else if (o.compare) {
    return fail("generate", invalid_argument("--compare needs --draft"));
  }
  if (!o.ignore_eos)
    for (int e : (*target)->config().eos_ids) g.stop_ids.push_back(e);

  nlohmann::json compare;
  GenerationResult plain;
  if (o.compare) {
    Generator base(**target, nullptr);
    auto r = base.generate(*ids, g);
    if (!r.ok()) return fail("generate", r.status());
    plain = std::move(*r);
  }
  Generator gen(**target, drafter.get());
  const bool stream = !o.json;
  auto on_tokens = [&](std::span<const int32_t> toks) {
    if (stream) {
      for (int32_t t : toks) std::printf("%d ", t);
      std::fflush(stdout);
    }
    return true;
  };
  auto res = gen.generate(*ids, g, on_tokens);
  if (!res.ok()) return fail("generate", res.status());
  const bool spec = drafter != nullptr;
  if (o.compare) {
    const double base_tps = plain.stats.decode_tokens_per_second(), spec_tps = res->stats.decode_tokens_per_second();
    compare = {{"plain_tokens_per_second", base_tps},
               {"speculative_tokens_per_second", spec_tps},
               {"speedup", base_tps > 0 ? spec_tps / base_tps : 0.0},
               {"identical_output", plain.tokens == res->tokens}};
  }
  if (o.json) {
    nlohmann::json j = {{"ids", res->tokens}, {"stop_reason", stop_reason_name(res->stop)}, {"stats", stats_json(res->stats)}};
    if (spec) {
      nlohmann::json rounds = nlohmann::json::array();
      for (const RoundRecord& r : res->rounds)
        rounds.push_back({{"position", r.position}, {"draft", r.draft}, {"accepted", r.accepted}});
      j["rounds"] = std::move(rounds);
    }
    if (o.compare) j["compare"] = compare;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("\n");
    std::fprintf(stderr, "tandem: %s\n", summary_line(res->stats, spec).c_str());
    if (o.compare)
      std::fprintf(stderr, "tandem: plain decoding %.1f tok/s, speculative %.1f tok/s: speedup %.2fx (output %s)\n",
                   compare["plain_tokens_per_second"].get<double>(), compare["speculative_tokens_per_second"].get<double>(),
                   compare["speedup"].get<double>(), plain.tokens == res->tokens ? "identical" : "differs");
  }
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<GenerateCliOptions>();
  auto* cmd = app.add_subcommand("generate", "Generate tokens, optionally with the MTP assistant drafter");
  cmd->add_option("--model", o->model, "Target checkpoint directory")->required();
  cmd->add_option("--draft", o->draft, "Assistant (drafter) checkpoint directory: enables speculative decoding");
  cmd->add_option("--ids", o->ids, "Prompt as comma-separated token ids")->required();
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens to generate (drafts never count)")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "0 = off")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "1 = off")->capture_default_str();
  cmd->add_option("--min-p", o->min_p, "0 = off")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--draft-tokens", o->draft_tokens, "Drafts per round: K, \"auto\" (cost model) or \"heuristic\"")
      ->capture_default_str();
  cmd->add_option("--max-draft-tokens", o->max_draft_tokens, "Upper bound for auto/heuristic")->capture_default_str();
  cmd->add_flag("--sample-drafts", o->sample_drafts, "Sample drafts from the drafter (temperature > 0)");
  cmd->add_option("--context", o->context, "KV positions to allocate (0 = prompt + max tokens)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the checkpoint's EOS ids");
  cmd->add_flag("--json", o->json, "Print one JSON object: ids, rounds, stats");
  cmd->add_flag("--compare", o->compare, "Also run plain decoding and report the speedup");
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->footer(
      "Examples:\n"
      "  tandem generate --model M --ids 2,651,1210 --max-tokens 64 --temperature 0 --json\n"
      "  tandem generate --model M --draft M-assistant --ids 2,651 --draft-tokens 3 --json\n"
      "  tandem generate --model M --draft M-assistant --ids 2,651 --draft-tokens auto --compare");
  cmd->callback([o, &exit_code] { exit_code = run_generate(*o); });
}

}  // namespace tandem::cli
