// What the generate and chat commands share: their common flags, loading the target / drafter / tokenizer with
// progress and clear errors, GenerateOptions from the flags, and the statistics printers.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "spec/generator.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {

struct SessionFlags {
  std::string model, draft, device = "cpu", draft_tokens = "3";
  int max_tokens = 128, top_k = 0, max_draft_tokens = 8, threads = 0;
  float temperature = 0.f, top_p = 1.f, min_p = 0.f;
  uint64_t seed = 0;
  bool ignore_eos = false, sample_drafts = false;
  int64_t context = 0;
  int prefill_chunk = kDefaultPrefillChunk;
};

// Adds --model, --draft, sampling, draft-length and device flags to `cmd`.
void add_session_flags(CLI::App* cmd, SessionFlags* f);

struct Session {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Gemma4Model> target;
  std::unique_ptr<Gemma4Assistant> drafter;         // null without --draft
  std::unique_ptr<tok::Tokenizer> tokenizer;        // null when the target directory has no tokenizer.json
  GenerateOptions options;
};

// Loads everything the flags name. `need_tokenizer`: a missing tokenizer.json is an error.
Result<Session> open_session(const SessionFlags& f, bool need_tokenizer);

// JSON statistics and a one-line human summary of a generation.
nlohmann::json stats_json(const GenerationStats& st);
std::string summary_line(const GenerationStats& st, bool speculative);

}  // namespace tandem::cli
