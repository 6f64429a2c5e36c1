// Sampling: parameters, a seeded RNG, the processed target distribution (temperature, top-k, top-p, min-p in
// transformers' order) and draws from it. Greedy = argmax with the lowest id among ties (torch.argmax).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace tandem {

struct SamplingParams {
  float temperature = 0.f;  // 0 = greedy
  int top_k = 0;            // 0 = off
  float top_p = 1.f;        // 1 = off
  float min_p = 0.f;        // 0 = off
  uint64_t seed = 0;
  [[nodiscard]] bool greedy() const { return temperature <= 0.f; }
  // Rejects NaN / negative / out-of-range values with a message naming the field.
  [[nodiscard]] Status validate() const;
};

// xoshiro256** seeded with splitmix64: small, fast, reproducible across platforms.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();

 private:
  uint64_t s_[4];
};

// Index of the largest value; the lowest index among ties; NaNs are ignored (all-NaN -> 0).
int32_t argmax(std::span<const float> logits);

// The processed distribution the target samples from: softmax(logits / T) restricted by top-k, then top-p
// (smallest set with cumulative probability >= top_p, always keeping the most likely token, plus every token tied
// with the last one kept), then min-p
// (drop tokens below min_p * max prob), renormalised. `probs` gets one entry per vocabulary id.
void processed_probs(std::span<const float> logits, const SamplingParams& params, std::vector<float>* probs);

// Draws an index from a normalised distribution (entries sum to ~1) by the inverse CDF in id order: the first id
// whose cumulative mass exceeds u * total (u in [0, 1)); ids without mass are never drawn.
int32_t sample_at(std::span<const float> probs, double u);
// sample_at with u = rng.uniform().
int32_t sample(std::span<const float> probs, Rng& rng);

}  // namespace tandem
