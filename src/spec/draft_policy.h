// Draft-length policies: how many tokens the drafter proposes in the next round (0 = a plain decode step).
// fixed K; the transformers heuristic (+2 after a fully accepted round, -1 otherwise, never below 1); and a cost
// model that maximises expected tokens per second from the measured draft-step and verify-pass times and the
// running per-position acceptance.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace tandem {

struct RoundObservation {
  int k = 0;                  // drafts proposed (0 = plain decode step)
  int accepted = 0;           // leading drafts accepted
  double draft_seconds = 0;   // all drafter steps of the round
  double verify_seconds = 0;  // the target pass over k+1 tokens
};

class DraftPolicy {
 public:
  virtual ~DraftPolicy() = default;
  [[nodiscard]] virtual int next_k() = 0;
  virtual void observe(const RoundObservation& o) = 0;
  [[nodiscard]] virtual std::string name() const = 0;
};

std::unique_ptr<DraftPolicy> make_fixed_policy(int k);
std::unique_ptr<DraftPolicy> make_heuristic_policy(int initial_k, int max_k);
std::unique_ptr<DraftPolicy> make_cost_model_policy(int max_k);

// The cost model's objective, exposed for tests: expected emitted tokens per second when proposing k drafts,
// given conditional acceptance alpha[j] (probability draft j+1 is accepted given drafts 1..j were), the time of
// one drafter step and the verify-pass time for n tokens (verify_seconds[n - 1], n = 1..).
double expected_tokens_per_second(int k, const std::vector<double>& alpha, double draft_step_seconds,
                                  const std::vector<double>& verify_seconds);

}  // namespace tandem
