// Shared generate/chat plumbing (see session.h).
#include "session.h"

#include <filesystem>

#include "core/strings.h"

namespace tandem::cli {
namespace {

Status parse_draft_mode(const std::string& s, GenerateOptions* g) {
  if (s == "auto") {
    g->draft_mode = DraftMode::kAuto;
  } else if (s == "heuristic") {
    g->draft_mode = DraftMode::kHeuristic;
    g->draft_tokens = 3;
  } else {
    char* end = nullptr;
    long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v < 0 || v > 64)
      return invalid_argument("--draft-tokens must be an integer 0..64, \"auto\" or \"heuristic\" (got \"" + s + "\")");
    g->draft_mode = DraftMode::kFixed;
    g->draft_tokens = static_cast<int>(v);
  }
  return ok_status();
}

}  // namespace

void add_session_flags(CLI::App* cmd, SessionFlags* f) {
  cmd->add_option("--model", f->model, "Target checkpoint directory")->required();
  cmd->add_option("--draft", f->draft, "Assistant (drafter) checkpoint directory: enables speculative decoding");
  cmd->add_option("--max-tokens", f->max_tokens, "Tokens to generate (drafts never count)")->capture_default_str();
  cmd->add_option("--temperature", f->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", f->top_k, "0 = off")->capture_default_str();
  cmd->add_option("--top-p", f->top_p, "1 = off")->capture_default_str();
  cmd->add_option("--min-p", f->min_p, "0 = off")->capture_default_str();
  cmd->add_option("--seed", f->seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--draft-tokens", f->draft_tokens, "Drafts per round: K, \"auto\" (cost model) or \"heuristic\"")
      ->capture_default_str();
  cmd->add_option("--max-draft-tokens", f->max_draft_tokens, "Upper bound for auto / heuristic")->capture_default_str();
  cmd->add_flag("--sample-drafts", f->sample_drafts, "Sample drafts from the drafter (temperature > 0)");
  cmd->add_option("--context", f->context, "KV positions to allocate (0 = prompt + max tokens)");
  add_prefill_chunk_option(cmd, &f->prefill_chunk, "prompt");
  cmd->add_flag("--ignore-eos", f->ignore_eos, "Do not stop at the checkpoint's EOS ids");
  cmd->add_option("--device", f->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--threads", f->threads, "CPU threads (0 = all cores)")->capture_default_str();
}

Result<Session> open_session(const SessionFlags& f, bool need_tokenizer) {
  Session s;
  GenerateOptions& g = s.options;
  g.max_new_tokens = f.max_tokens;
  g.sampling = {.temperature = f.temperature, .top_k = f.top_k, .top_p = f.top_p, .min_p = f.min_p, .seed = f.seed};
  g.max_draft_tokens = f.max_draft_tokens;
  g.sample_drafts = f.sample_drafts;
  g.context = f.context;
  g.prefill_chunk = f.prefill_chunk;
  TANDEM_TRY(parse_draft_mode(f.draft_tokens, &g));
  TANDEM_TRY(g.sampling.validate());
  if (f.max_tokens < 0) return invalid_argument("--max-tokens must be >= 0");
  if (f.max_draft_tokens < 1 || f.max_draft_tokens > 64) return invalid_argument("--max-draft-tokens must be 1..64");
  TANDEM_TRY(check_prefill_chunk(f.prefill_chunk));
  if (!std::filesystem::is_directory(f.model)) return not_found("--model: no checkpoint directory at " + f.model);
  if (!f.draft.empty() && !std::filesystem::is_directory(f.draft))
    return not_found("--draft: no checkpoint directory at " + f.draft);
  TANDEM_ASSIGN_OR_RETURN(s.backend, open_backend(f.device, f.threads));
  ProgressBar bar("loading target");
  TANDEM_ASSIGN_OR_RETURN(s.target, Gemma4Model::load(f.model, *s.backend,
                                                      {.progress = [&](uint64_t d, uint64_t t) { bar.update(d, t); }}));
  bar.finish();
  if (!f.draft.empty()) {
    ProgressBar dbar("loading drafter");
    TANDEM_ASSIGN_OR_RETURN(s.drafter, Gemma4Assistant::load(f.draft, *s.target,
                                                              {.progress = [&](uint64_t d, uint64_t t) { dbar.update(d, t); }}));
    dbar.finish();
  }
  if (need_tokenizer || std::filesystem::exists(f.model + "/tokenizer.json")) {
    auto tok = tok::Tokenizer::load(f.model);
    if (!tok.ok()) return Status(tok.status()).with_context("tokenizer of " + f.model);
    s.tokenizer = std::move(*tok);
  }
  if (!f.ignore_eos) {
    for (int e : s.target->config().eos_ids) g.stop_ids.push_back(e);
    if (s.tokenizer) {  // the chat format ends a model turn with <turn|>
      auto turn_end = s.tokenizer->require_token("<turn|>");
      if (turn_end.ok()) g.stop_ids.push_back(*turn_end);
    }
  }
  return s;
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

std::string summary_line(const GenerationStats& st, bool speculative) {
  std::string s = strfmt("%lld tokens in %.2f s, %.1f tok/s (prefill %.0f ms)", static_cast<long long>(st.generated_tokens),
                         st.total_seconds, st.decode_tokens_per_second(), st.prefill_seconds * 1e3);
  if (!speculative) return s;
  s += strfmt(" | %lld rounds, mean accepted %.2f, acceptance length %.2f | per position:",
              static_cast<long long>(st.rounds), st.mean_accepted(), st.tokens_per_pass());
  for (size_t j = 0; j < st.proposed_at.size(); ++j)
    if (st.proposed_at[j] > 0)
      s += strfmt(" %.2f", static_cast<double>(st.accepted_at[j]) / static_cast<double>(st.proposed_at[j]));
  const double t = st.draft_seconds + st.verify_seconds;
  if (t > 0) s += strfmt(" | draft %.0f%% / verify %.0f%% of decode time", 100 * st.draft_seconds / t, 100 * st.verify_seconds / t);
  return s;
}

}  // namespace tandem::cli
