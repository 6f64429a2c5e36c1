// Generation: plain decoding with the target alone, or lossless MTP speculative decoding with the assistant
// drafter in the clean mode of spec §5.6: prefill -> bonus token b at position P with g = post-norm hidden of
// P-1; each round drafts K tokens at query position P over target K/V [0, P), verifies [b, d1..dK] in one target
// pass, accepts the longest matching prefix (greedy) or applies the rejection rule (sampling), rolls the cache
// back to [0, P+n] and continues from g = h_verify[n], P = P+n+1.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model/assistant.h"
#include "model/gemma4.h"
#include "sample/sampling.h"
#include "spec/draft_policy.h"

namespace tandem {

enum class DraftMode : uint8_t { kFixed, kHeuristic, kAuto };

// Prompt tokens per target forward: the default, and the most taken (each chunk's activations are allocated at once,
// and every sliding layer's KV ring holds a chunk beside its window). Each chunk reads every weight once: on an H100,
// 1024-token chunks prefill a 4096-token prompt 1.2-2x faster than 256 (bench/RESULTS.md run BI).
inline constexpr int kDefaultPrefillChunk = 1024;
inline constexpr int kMaxPrefillChunk = 8192;

struct GenerateOptions {
  int max_new_tokens = 128;         // emitted tokens only; drafts never count
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;    // any of these ends the output (it is emitted), even inside an accepted block
  DraftMode draft_mode = DraftMode::kFixed;
  int draft_tokens = 3;             // K for kFixed, the starting K for kHeuristic
  int max_draft_tokens = 8;         // upper bound for the adaptive modes
  bool sample_drafts = false;       // sampling only: draw drafts from the drafter's processed distribution
  int64_t context = 0;              // KV positions to allocate; 0 = prompt + max_new_tokens + a draft block
  int prefill_chunk = kDefaultPrefillChunk;  // prompt tokens per target forward (a longer prompt runs in chunks)
};

struct RoundRecord {
  int64_t position = 0;             // P: position of the round's bonus token
  std::vector<int32_t> draft;
  int accepted = 0;
};

struct GenerationStats {
  int64_t prompt_tokens = 0, generated_tokens = 0, rounds = 0, target_passes = 0;
  double prefill_seconds = 0, draft_seconds = 0, verify_seconds = 0, total_seconds = 0;
  std::vector<int64_t> proposed_at, accepted_at;  // index j: drafts proposed / accepted at draft position j+1
  [[nodiscard]] double mean_accepted() const;     // accepted drafts per speculative round
  [[nodiscard]] double tokens_per_pass() const;   // emitted tokens per target pass after prefill (acceptance length)
  [[nodiscard]] double decode_tokens_per_second() const;  // generated tokens / (total - prefill) seconds
};

enum class StopReason : uint8_t { kMaxTokens, kStopToken, kCancelled };
const char* stop_reason_name(StopReason r);

struct GenerationResult {
  std::vector<int32_t> tokens;
  std::vector<RoundRecord> rounds;
  GenerationStats stats;
  StopReason stop = StopReason::kMaxTokens;
};

// Receives tokens as they are committed; return false to stop early.
using TokenCallback = std::function<bool(std::span<const int32_t> tokens)>;

class Generator {
 public:
  // `drafter` may be null: plain decoding.
  Generator(Gemma4Model& target, Gemma4Assistant* drafter) : target_(target), drafter_(drafter) {}
  Result<GenerationResult> generate(std::span<const int32_t> prompt, const GenerateOptions& opts,
                                    const TokenCallback& on_tokens = {});

 private:
  Gemma4Model& target_;
  Gemma4Assistant* drafter_;
};

}  // namespace tandem
